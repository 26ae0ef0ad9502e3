"""Scheduling throughput on the embedded broker (issue 16): jobs/s and CPU per job.

Run from the project root (``/work/main``)::

    .venv/bin/python bench/schedule_rate.py                  # 5 rounds of each figure
    .venv/bin/python bench/schedule_rate.py --rounds 3 --only schedule,send_batch
    .venv/bin/python bench/schedule_rate.py --profile schedule_many   # cProfile, top 25

Each figure runs on its own fresh ``rocksdb://`` directory under the temp dir
(removed after), opened the way an application opens it (``Scheduler(URL)``, a
shared directory's owner; ``--url-params share=0`` opens a private embedded broker),
with the default durability (``wal``: every acknowledged send survives ``kill -9``):

schedule
    ``noop.schedule(i, delay=600)`` one call at a time, ``-n`` calls per round.
schedule_many
    ``noop.schedule_many([((i,), {}), ...], delay=600)`` in batches of ``--batch``
    (default 1,000), ``--many-n`` jobs per round.
send
    the bare broker: ``broker.send(Message(...))`` one at a time, each message built
    in the loop (as a producer would), a 100-byte body, due in 600 s.
send_batch
    the bare broker: ``broker.send_batch`` of ``--batch`` messages built in the loop,
    ``--batch-n`` messages per round.

Per round: jobs/s of wall time, CPU us per job of the whole process
(``time.process_time``: the calling thread, the wheel thread and RocksDB's own
threads) and of the calling thread alone (``time.thread_time``; the rate follows
it, RocksDB's flushes run on the other core). The table gives the median of the
rounds (and the min-max of jobs/s). Nothing is due during a run, so no firing
competes with the sends; the burst and fire-lateness figures are
``bench/timer_load.py --burst`` and ``--rate 10000``.

``--parts`` prints where one ``schedule()`` goes instead: the calling thread's CPU
per call (``time.thread_time_ns`` over ``-n`` calls, median of the rounds) of the
whole call and of its stages alone: the argument encoder, ``Message.with_body``, the
app's broker's ``send`` of a ready message, and RocksDB's write of the same shape
(a new ``WriteBatch``, the wheel entry and the topic's counters, ``Rdict.write``).

Print ``uptime`` before and after: figures on a loaded machine are lower.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stats import load_average, num
from broker_adapter.message import Message
from scheduler.scheduler import Scheduler

FIGURES = ("schedule", "schedule_many", "send", "send_batch")
DELAY_S = 600
BODY = b"x" * 100

#: One round: runs ``n`` jobs; returns how many it scheduled.
Round = Callable[[int], int]


def make_round(kind: str, app: Scheduler, args: argparse.Namespace) -> tuple[Round, int]:
    """The body of one round of figure ``kind``, and its job count."""
    noop = app.handle("bench.noop")
    broker = app.broker
    counter = [0]

    def schedule(n: int) -> int:
        start = counter[0]
        sched = noop.schedule
        for i in range(start, start + n):
            sched(i, delay=DELAY_S)
        counter[0] += n
        return n

    def schedule_many(n: int) -> int:
        start = counter[0]
        batch = args.batch
        many = noop.schedule_many
        for lo in range(start, start + n, batch):
            many([((i,), {}) for i in range(lo, min(lo + batch, start + n))], delay=DELAY_S)
        counter[0] += n
        return n

    def send(n: int) -> int:
        snd = broker.send
        for _ in range(n):
            snd(Message("bench.bare", BODY, delay_ms=DELAY_S * 1000))
        return n

    def send_batch(n: int) -> int:
        batch = args.batch
        snd = broker.send_batch
        for lo in range(0, n, batch):
            k = min(batch, n - lo)
            snd([Message("bench.bare", BODY, delay_ms=DELAY_S * 1000) for _ in range(k)])
        return n

    bodies: dict[str, tuple[Round, int]] = {
        "schedule": (schedule, args.n),
        "schedule_many": (schedule_many, args.many_n),
        "send": (send, args.n),
        "send_batch": (send_batch, args.batch_n),
    }
    return bodies[kind]


def open_app(tmp: str, args: argparse.Namespace) -> Scheduler:
    """A scheduler on a fresh directory, its broker open, one job registered."""
    params = f"?{args.url_params}" if args.url_params else ""
    app = Scheduler(f"rocksdb://{tmp}/data{params}", topic="bench.jobs")

    @app.job(name="bench.noop")
    def noop(i: int) -> None:  # never due during the run
        del i

    del noop
    app.broker.send(Message("bench.bare", BODY, delay_ms=DELAY_S * 1000))  # topic registered
    return app


def run_figure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """All rounds of one figure on a fresh directory."""
    tmp = tempfile.mkdtemp(prefix="chronoq-rate-")
    app = open_app(tmp, args)
    try:
        body, n = make_round(kind, app, args)
        body(min(n, 2000))  # warm-up: imports, caches, first memtable writes
        rates, cpu_us, thread_us = [], [], []
        for _ in range(args.rounds):
            gc.collect()
            t0, c0, th0 = time.perf_counter(), time.process_time(), time.thread_time()
            done = body(n)
            t1, c1, th1 = time.perf_counter(), time.process_time(), time.thread_time()
            wall = t1 - t0
            cpu = c1 - c0
            rates.append(done / wall)
            cpu_us.append(cpu / done * 1e6)
            thread_us.append((th1 - th0) / done * 1e6)
        return {
            "figure": kind,
            "n": n,
            "rate": statistics.median(rates),
            "rate_min": min(rates),
            "rate_max": max(rates),
            "cpu_us": statistics.median(cpu_us),
            "thread_us": statistics.median(thread_us),
        }
    finally:
        app.close()
        shutil.rmtree(tmp, ignore_errors=True)


def profile_figure(kind: str, args: argparse.Namespace) -> None:
    """One round of ``kind`` under cProfile; prints the top functions by own time."""
    tmp = tempfile.mkdtemp(prefix="chronoq-rate-")
    app = open_app(tmp, args)
    try:
        body, n = make_round(kind, app, args)
        body(min(n, 2000))
        prof = cProfile.Profile()
        prof.enable()
        body(n)
        prof.disable()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(25)
    finally:
        app.close()
        shutil.rmtree(tmp, ignore_errors=True)


def run_parts(args: argparse.Namespace) -> list[tuple[str, float]]:
    """CPU us per call of ``schedule()`` and of its stages alone (see ``--parts``)."""
    from rocksdict import WriteBatch

    from broker_adapter.embedded import EmbeddedBroker
    from scheduler.wire import make_encoder

    tmp = tempfile.mkdtemp(prefix="chronoq-rate-")
    app = open_app(tmp, argparse.Namespace(**{**vars(args), "url_params": "share=0"}))
    try:
        broker = app.broker
        assert isinstance(broker, EmbeddedBroker)  # share=0: the broker itself
        store, noop = broker.core.store, app.handle("bench.noop")
        encode = make_encoder("bench.noop")
        template = Message(noop.topic, b"", None, "bench.noop", delay_ms=DELAY_S * 1000)
        message = template.with_body(encode((1,), {}))
        wheel, meta = store.handle["wheel"], store.handle["meta"]
        seq = [1 << 62]

        def schedule(n: int) -> None:
            sched = noop.schedule
            for i in range(n):
                sched(i, delay=DELAY_S)

        def encoder(n: int) -> None:
            for i in range(n):
                encode((i,), {})

        def with_body(n: int) -> None:
            copy, body = template.with_body, message.body
            for _ in range(n):
                copy(body, None)

        def send(n: int) -> None:
            snd = broker.send
            for _ in range(n):
                snd(message)

        def rocksdb_write(n: int) -> None:
            db, opt, first = store.db, store.write_opt, seq[0]
            record, counters = message.body + b"h" * 40, b"c" * 16
            for s in range(first, first + n):
                batch = WriteBatch(True)
                batch.put(s.to_bytes(16, "big"), record, wheel)
                batch.put(b"N\xff\xff", counters, meta)
                db.write(batch, opt)
            seq[0] += n

        stages: dict[str, Callable[[int], None]] = {
            "schedule() whole": schedule,
            "  encoder": encoder,
            "  Message.with_body": with_body,
            "  broker.send": send,
            "    RocksDB write": rocksdb_write,
        }
        per_call: dict[str, list[float]] = {name: [] for name in stages}
        for fn in stages.values():
            fn(2000)  # warm-up
        for _ in range(args.rounds):
            for name, fn in stages.items():
                gc.collect()
                t0 = time.thread_time_ns()
                fn(args.n)
                per_call[name].append((time.thread_time_ns() - t0) / args.n / 1000)
        return [(name, statistics.median(v)) for name, v in per_call.items()]
    finally:
        app.close()
        shutil.rmtree(tmp, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=50_000, help="schedule()/send calls per round")
    p.add_argument("--many-n", type=int, default=200_000, help="schedule_many jobs per round")
    p.add_argument("--batch-n", type=int, default=300_000, help="send_batch messages per round")
    p.add_argument("--batch", type=int, default=1000, help="batch size (default 1,000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per figure (median)")
    p.add_argument("--only", help=f"comma-separated figures among {', '.join(FIGURES)}")
    p.add_argument("--url-params", default="", help="URL query, e.g. share=0 or durability=fast")
    p.add_argument("--profile", choices=FIGURES, help="cProfile one round of this figure")
    p.add_argument("--parts", action="store_true", help="CPU per call of schedule()'s stages")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        profile_figure(args.profile, args)
        return 0
    if args.parts:
        print(f"load before: {load_average()}", flush=True)
        parts = run_parts(args)
        print(f"load after:  {load_average()}")
        print(f"{'stage (alone)':<22} {'caller CPU us/call':>18}")
        for name, us in parts:
            print(f"{name:<22} {us:>18.2f}")
        return 0
    kinds = args.only.split(",") if args.only else list(FIGURES)
    unknown = [k for k in kinds if k not in FIGURES]
    if unknown:
        print(f"unknown figure(s) {unknown}; choose among {FIGURES}", file=sys.stderr)
        return 2
    print(f"load before: {load_average()}", flush=True)
    rows = [run_figure(kind, args) for kind in kinds]
    print(f"load after:  {load_average()}")
    print(f"{'figure':<14} {'per round':>9} {'jobs/s (median)':>16} {'min-max':>17}", end="")
    print(f" {'CPU us/job':>11} {'caller us/job':>14}")
    for r in rows:
        spread = f"{num(r['rate_min'])}-{num(r['rate_max'])}"
        print(
            f"{r['figure']:<14} {num(r['n']):>9} {num(r['rate']):>16} {spread:>17}"
            f" {r['cpu_us']:>11.2f} {r['thread_us']:>14.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
