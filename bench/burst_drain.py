"""The embedded broker's burst drain: N messages due in one second, CPU per message (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/burst_drain.py                     # 500,000 due in one second
    .venv/bin/python bench/burst_drain.py --rounds 3 --n 200000
    .venv/bin/python bench/burst_drain.py --profile 25        # cProfile per thread
    .venv/bin/python bench/burst_drain.py --n 20000 --spread-s 10 --pull-max 32 --rounds 2

``bench/timer_load.py --burst`` gives the issue's figure (the time until the last
message arrives) with the whole load generator around it (two producers, aborts,
stats sampling). This script keeps only the path that figure measures: the timing
wheel firing (``fire_due``), one consumer pulling (``pull(256)``, which takes from
the store) and acking each pulled batch (``ack_batch``). Per round it fills a fresh
``rocksdb://`` directory with ``--n`` messages due uniformly within one calendar
second T (``send_batch`` of 1,000, before T: not measured), then prints the time
from T until the last message was pulled, how many were pulled by T + 1 s, and
the CPU (user + system) of the drain, from T - 0.2 s to the end: per message for
the process, and per thread (wheel thread, consumer). CPU is the steadier figure
on a shared machine: compare it between commits in paired runs (A, B, A, B).
``--spread-s S`` spreads the N due times over S seconds instead of one: a steady
fire rate, where pulls fire and take a few messages each, as a dispatcher's do
(the consumer's CPU per message is then the broker's pull path at that rate;
``--ack-each`` acks each message with its own call, as a dispatcher does).
``--profile N`` prints each thread's top ``N`` functions by own CPU time
(``cProfile`` timed with ``time.thread_time``), which slows the drain down.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.job_start_breakdown import ThreadProfiles, print_profile, thread_cpu
from bench.loadgen import ConsumerThread, send_phase
from bench.stats import load_average, num
from broker_adapter.urls import open_broker

BODY = b"x" * 100


def one_round(args: argparse.Namespace, profiles: ThreadProfiles | None) -> dict[str, float]:
    """Fill, drain and measure one burst on a fresh directory; the figures."""
    import psutil  # type: ignore[import-untyped]

    tmp = tempfile.mkdtemp(prefix="chronoq-burst-")
    broker = open_broker(f"rocksdb://{tmp}")
    stop = threading.Event()
    try:
        topic, group = "bench.burst", "bench.burst.g"
        consumer = broker.consumer(group, [topic], max_inflight=args.max_inflight)
        t_ms = (int(time.time()) + args.lead_s) * 1000
        phase = send_phase(
            broker,
            topic,
            args.n,
            t_ms,
            t_ms + int(args.spread_s * 1000),
            threads=1,
            batch=1000,
            body=BODY,
            seed=1,
            collect_ids=False,
        )
        if time.time() * 1000 > t_ms - 300:
            print(
                f"warning: sends ended {time.time() * 1000 - t_ms + 300:.0f} ms late; "
                "raise --lead-s",
                file=sys.stderr,
            )
        reader = ConsumerThread(consumer, stop, args.pull_max, 100, ack_each=args.ack_each)
        reader.name = "bench-consumer"
        reader.start()
        time.sleep(max(0.0, t_ms / 1000 - 0.2 - time.time()))
        proc = psutil.Process()
        c0, th0 = proc.cpu_times(), thread_cpu()
        deadline = time.monotonic() + 60 + args.spread_s
        while reader.count < phase.accepted and time.monotonic() < deadline:
            if reader.error is not None:
                raise RuntimeError("consumer failed") from reader.error
            time.sleep(0.01)
        c1, th1 = proc.cpu_times(), thread_cpu()
        got = reader.count
        last = max(reader.batch_ms) if reader.batch_ms else float("nan")
        by_1s = sum(
            k for t, k in zip(reader.batch_ms, reader.batch_n, strict=True) if t <= t_ms + 1000
        )
        cpu = (c1.user + c1.system) - (c0.user + c0.system)
        fig = {
            "n": float(phase.accepted),
            "got": float(got),
            "drained_s": (last - t_ms) / 1000,
            "by_1s": float(by_1s),
            "cpu_us": cpu / max(got, 1) * 1e6,
        }
        for name in sorted(th1):
            spent = th1[name] - th0.get(name, 0.0)
            if spent > 0.01:
                fig[f"thread {name} us/msg"] = spent / max(got, 1) * 1e6
        return fig
    finally:
        stop.set()
        time.sleep(0.15)
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=500_000, help="messages due in the one second")
    p.add_argument("--rounds", type=int, default=1, help="fresh directory per round")
    p.add_argument("--spread-s", type=float, default=1.0, help="due over this many s")
    p.add_argument("--lead-s", type=int, default=6, help="T is this many s after the round starts")
    p.add_argument("--pull-max", type=int, default=256, help="pull(max_messages)")
    p.add_argument("--max-inflight", type=int, default=1000, help="consumer max_inflight")
    p.add_argument("--ack-each", action="store_true", help="ack one by one, as a dispatcher")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="top N per thread")
    args = p.parse_args(argv)
    profiles = ThreadProfiles() if args.profile else None
    if profiles is not None:
        profiles.install()
    print(
        f"== burst_drain: {num(args.n)} due over {args.spread_s:g} s, pull({args.pull_max}), "
        f"load {load_average()} =="
    )
    bad = 0
    for r in range(args.rounds):
        fig = one_round(args, profiles)
        bad += fig["got"] != fig["n"]
        line = (
            f"round {r + 1}: drained in {fig['drained_s']:.2f} s, by +1 s {num(fig['by_1s'])}, "
            f"got {num(fig['got'])}/{num(fig['n'])}, CPU {fig['cpu_us']:.2f} us/msg"
        )
        threads = [f"{k[7:-7]} {v:.2f}" for k, v in fig.items() if k.startswith("thread ")]
        print(line + (" (" + ", ".join(threads) + ")" if threads else ""), flush=True)
    if profiles is not None:
        for name, profs in sorted(profiles.by_group.items()):
            print_profile(name, profs, args.profile)
    print(f"load after: {load_average()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
