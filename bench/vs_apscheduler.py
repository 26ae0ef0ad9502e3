"""Job-start lateness, chronoq against APScheduler 3.x, side by side in one run (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/pip install 'chronoq[bench]'      # APScheduler 3.x and psutil (bench only)
    .venv/bin/python bench/vs_apscheduler.py                       # N=20,000 and 100,000
    .venv/bin/python bench/vs_apscheduler.py --broker embedded,remote,redis
    .venv/bin/python bench/vs_apscheduler.py --n 20000 --due-from 3 --due-to 13   # quick

The workload: ``N`` jobs at absolute due times (whole ms) drawn uniformly at random
(fixed ``--seed``) from ``--due-from`` to ``--due-to`` seconds after the system's start;
each job appends ``jid,due_ms,start_ms`` to a file as the first thing it does;
lateness = start - due (ms).

Systems, each in its own child process (so its CPU and RSS are its own):

* ``apscheduler``: APScheduler 3.x ``BackgroundScheduler``, ``MemoryJobStore``,
  ``ThreadPoolExecutor(10)``, ``misfire_grace_time=None`` (a late job still runs),
  jobs added with ``add_job(..., "date", run_date=...)`` before ``start()`` (which
  is in the schedule time; adding to a running one is about 10k jobs/s at N=100,000,
  too slow for a 5 s lead); not durable. Skipped, with a message, when APScheduler is not installed.
* ``chronoq-<broker>``: ``Scheduler`` (default settings) and a ``Dispatcher`` in a
  thread of the child (with :func:`workers.gc_tuning.tune_gc`, as ``chronoq run``
  does), jobs sent with ``job.schedule(jid, due_ms, at=...)``, on

  - ``embedded``: a fresh ``rocksdb://`` temp dir;
  - ``remote``: a ``chronoq broker serve`` child on a free loopback port (``chronoq://``);
  - ``remote-unix``: the same server on a Unix socket (``--unix``, ``chronoq+unix://``);
  - ``redis``: a ``redis-server`` child on a free loopback port (no persistence).

With ``--batch B`` the chronoq rows schedule with ``job.schedule_many`` in batches
of ``B`` (``Call(..., at=...)`` each): one-at-a-time ``schedule()`` over ``chronoq://``
or ``redis://`` is slower than the 5 s lead allows at N=100,000.

Figures per (system, N): P50/P90/P99/P99.9/max/min lateness (ms); lost (never
started), duplicated (extra starts), early (starts before due); CPU per job: user +
system CPU of the child and its children (psutil) from the end of scheduling to the
moment the last job started, divided by N; peak RSS: the sum of ``VmHWM`` over the
child and its children; schedule rate: jobs scheduled per second of wall time.
Machines are noisy: compare the rows of one run, and run it more than once.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.async_client import redis_server
from bench.stats import PERCENTILES, ms, percentiles, proc_status

BROKERS = ("embedded", "remote", "remote-unix", "redis")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
INSTALL_HINT = "pip install 'chronoq[bench]'"
#: After the last job started, wait this long for duplicates before stopping.
DUP_GRACE_S = 1.0


def due_times(n: int, start_ms: int, due_from: float, due_to: float, seed: int) -> list[int]:
    """``n`` due times (epoch ms) uniform in ``[start + due_from, start + due_to]`` s."""
    rng = random.Random(seed)
    lo, hi = start_ms + due_from * 1000, start_ms + due_to * 1000
    return [int(rng.uniform(lo, hi)) for _ in range(n)]


def ms_to_datetime(due_ms: int) -> datetime:
    """Epoch ms as an aware UTC datetime (exact)."""
    return EPOCH + timedelta(milliseconds=due_ms)


# --------------------------------------------------------------------------- child


class Recorder:
    """The job body's side: append ``jid,due_ms,start_ms`` and count starts."""

    def __init__(self, path: str) -> None:
        # binary: BufferedWriter takes a lock per write (TextIOWrapper is not thread-safe)
        self.file = open(path, "ab")  # noqa: SIM115 (closed in close())
        self.starts: list[None] = []  # list.append is atomic; len() is the count

    def record(self, jid: int, due_ms: int) -> None:
        start_ms = time.time() * 1000.0
        self.file.write(b"%d,%d,%.3f\n" % (jid, due_ms, start_ms))
        self.starts.append(None)

    def close(self) -> None:
        self.file.close()


def tree_cpu_seconds(proc: Any) -> float:
    """User + system CPU of ``proc`` and its live descendants (psutil)."""
    import psutil

    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:  # a child gone meanwhile
            t = None
        if t is not None:
            total += t.user + t.system
    return total


def tree_peak_rss(proc: Any) -> int:
    """Sum of ``VmHWM`` over ``proc`` and its live descendants, bytes."""
    pids = [proc.pid, *(c.pid for c in proc.children(recursive=True))]
    return sum(proc_status(pid).get("VmHWM", 0) for pid in pids)


@contextmanager
def chronoq_server(data_dir: str, unix: bool = False) -> Iterator[str]:
    """A ``chronoq broker serve`` child on a free loopback port (or, with ``unix``, on a
    Unix socket in ``data_dir``'s parent); its URL."""
    exe = shutil.which("chronoq", path=os.path.dirname(sys.executable)) or shutil.which("chronoq")
    if exe is None:
        raise SystemExit("the chronoq command is not installed (pip install -e .)")
    argv = [exe, "broker", "serve", "--data-dir", data_dir]
    if unix:
        argv += ["--unix", os.path.join(os.path.dirname(data_dir), "broker.sock")]
    else:
        argv += ["--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        if not line.startswith("chronoq broker listening on"):
            raise SystemExit(f"chronoq broker serve did not start: {line!r}")
        yield line.split()[-1] if unix else "chronoq://" + line.split()[4]
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


@contextmanager
def broker_url(kind: str, tmp: str, query: str = "") -> Iterator[str]:
    """A fresh broker of ``kind``, up for the ``with`` block; ``query``: the embedded
    URL's parameters (e.g. ``fire_hold_ms=0``)."""
    if kind == "embedded":
        yield f"rocksdb://{os.path.join(tmp, 'embedded')}" + (f"?{query}" if query else "")
    elif kind in ("remote", "remote-unix"):
        with chronoq_server(os.path.join(tmp, "server"), unix=kind == "remote-unix") as url:
            yield url
    else:
        with redis_server() as url:
            yield url


def wait_and_measure(
    rec: Recorder, n: int, deadline: float, proc: Any, cpu0: float
) -> tuple[float, int]:
    """Wait for ``n`` starts (or the deadline); CPU since ``cpu0`` then, and peak RSS."""
    while len(rec.starts) < n and time.time() < deadline:
        time.sleep(0.002)
    cpu = tree_cpu_seconds(proc) - cpu0
    time.sleep(DUP_GRACE_S)
    return cpu, tree_peak_rss(proc)


def run_apscheduler(args: argparse.Namespace, rec: Recorder, proc: Any) -> dict[str, Any]:
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    sched = BackgroundScheduler(
        jobstores={"default": MemoryJobStore()},
        executors={"default": ThreadPoolExecutor(10)},
        job_defaults={"misfire_grace_time": None, "coalesce": False},
        timezone=UTC,
    )
    # Jobs are added before start(): a running scheduler wakes its thread on each
    # add_job, which halves the add rate (10k/s at N=100,000, past --due-from).
    try:
        start_ms = int(time.time() * 1000)
        dues = due_times(args.n, start_ms, args.due_from, args.due_to, args.seed)
        t0 = time.perf_counter()
        add = sched.add_job
        record = rec.record
        for jid, due in enumerate(dues):
            add(record, "date", run_date=ms_to_datetime(due), args=(jid, due))
        sched.start()
        sched_s = time.perf_counter() - t0
        cpu0 = tree_cpu_seconds(proc)
        deadline = start_ms / 1000 + args.due_to + args.timeout
        cpu, rss = wait_and_measure(rec, args.n, deadline, proc, cpu0)
    finally:
        if sched.running:
            sched.shutdown(wait=True)
    return {"sched_s": sched_s, "cpu_s": cpu, "peak_rss": rss, "start_ms": start_ms}


def run_chronoq(args: argparse.Namespace, rec: Recorder, proc: Any) -> dict[str, Any]:
    from scheduler import Call, Scheduler
    from workers import Dispatcher
    from workers.gc_tuning import tune_gc

    tmp = tempfile.mkdtemp(prefix="chronoq-vs-aps-")
    try:
        with broker_url(args.broker, tmp, getattr(args, "url_query", "")) as url:
            app = Scheduler(url, topic="bench.vs")
            job = app.job(name="bench.vs.record")(rec.record)
            dispatcher = Dispatcher(app, inline_jobs=not args.no_inline)
            dispatcher.open()
            tune_gc()  # as chronoq run does once the dispatcher joined
            thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
            thread.start()
            try:
                start_ms = int(time.time() * 1000)
                dues = due_times(args.n, start_ms, args.due_from, args.due_to, args.seed)
                t0 = time.perf_counter()
                if args.batch > 0:  # schedule_many: remote and redis within the lead
                    for i in range(0, args.n, args.batch):
                        job.schedule_many(
                            [
                                Call((jid, dues[jid]), at=ms_to_datetime(dues[jid]))
                                for jid in range(i, min(i + args.batch, args.n))
                            ]
                        )
                else:
                    schedule = job.schedule
                    for jid, due in enumerate(dues):
                        schedule(jid, due, at=ms_to_datetime(due))
                sched_s = time.perf_counter() - t0
                cpu0 = tree_cpu_seconds(proc)
                deadline = start_ms / 1000 + args.due_to + args.timeout
                cpu, rss = wait_and_measure(rec, args.n, deadline, proc, cpu0)
            finally:
                dispatcher.stop()
                thread.join()
                app.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"sched_s": sched_s, "cpu_s": cpu, "peak_rss": rss, "start_ms": start_ms}


def child_main(args: argparse.Namespace) -> int:
    import psutil

    logging.basicConfig(level=logging.WARNING)
    proc = psutil.Process()
    rec = Recorder(args.out)
    try:
        run = run_apscheduler if args.child == "apscheduler" else run_chronoq
        result = run(args, rec, proc)
    finally:
        rec.close()
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


# --------------------------------------------------------------------------- parent


def analyse(path: str, n: int) -> dict[str, Any]:
    """Lateness percentiles, lost, duplicated and early from a job file."""
    seen: Counter[int] = Counter()
    first: dict[int, float] = {}
    early = 0
    with open(path, encoding="ascii") as f:
        for line in f:
            jid_s, due_s, start_s = line.rstrip("\n").split(",")
            jid = int(jid_s)
            late = float(start_s) - int(due_s)
            seen[jid] += 1
            if jid not in first:
                first[jid] = late
            if late < 0:
                early += 1
    lats = list(first.values())
    pct = percentiles(lats, PERCENTILES)
    return {
        "pct": pct,
        "min": min(lats) if lats else None,
        "lost": n - len(first),
        "dup": sum(c - 1 for c in seen.values()),
        "early": early,
    }


def run_child(system: str, n: int, args: argparse.Namespace, tmp: str) -> dict[str, Any] | None:
    """Run one system in a child process; its figures, or None when it failed."""
    out = os.path.join(tmp, f"{system}-{n}.csv")
    result = os.path.join(tmp, f"{system}-{n}.json")
    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "apscheduler" if system == "apscheduler" else "chronoq",
        "--broker",
        system.removeprefix("chronoq-"),
        "--n",
        str(n),
        "--due-from",
        str(args.due_from),
        "--due-to",
        str(args.due_to),
        "--seed",
        str(args.seed),
        "--timeout",
        str(args.timeout),
        "--batch",
        str(args.batch),
        *(["--no-inline"] if args.no_inline else []),
        *(["--url-query", args.url_query] if args.url_query else []),
        "--out",
        out,
        "--result",
        result,
    ]
    rc = subprocess.call(argv)
    if rc != 0 or not os.path.exists(result):
        print(f"{system} N={n}: the child failed (exit status {rc})", file=sys.stderr)
        return None
    with open(result, encoding="utf-8") as f:
        figures: dict[str, Any] = json.load(f)
    figures.update(analyse(out, n))
    figures["late_schedule"] = figures["sched_s"] > args.due_from
    return figures


HEADER = (
    f"{'system':<18} {'N':>7} {'P50':>6} {'P90':>6} {'P99':>6} {'P99.9':>6} {'max':>6} "
    f"{'min':>6} {'lost':>5} {'dup':>4} {'early':>5} {'CPU/job':>8} {'peakRSS':>8} "
    f"{'sched/s':>8}"
)


def format_row(system: str, n: int, f: dict[str, Any]) -> str:
    pct = f["pct"]
    cpu_ms = f["cpu_s"] * 1000 / n
    rss_mb = f["peak_rss"] / 1e6
    rate = n / f["sched_s"] if f["sched_s"] > 0 else float("nan")
    return (
        f"{system:<18} {n:>7,} {ms(pct['p50']):>6} {ms(pct['p90']):>6} {ms(pct['p99']):>6} "
        f"{ms(pct['p99.9']):>6} {ms(pct['max']):>6} {ms(f['min']):>6} {f['lost']:>5} "
        f"{f['dup']:>4} {f['early']:>5} {cpu_ms:>6.3f}ms {rss_mb:>6.0f}MB {rate:>8,.0f}"
    )


def format_ratios(system: str, n: int, f: dict[str, Any], aps: dict[str, Any]) -> str:
    """``system`` / APScheduler within this run: the figures to compare on a noisy machine."""

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or not b else f"{a / b:.2f}"

    parts = [f"{p} {ratio(f['pct'][p], aps['pct'][p])}" for p in ("p50", "p99", "p99.9")]
    parts.append(f"CPU/job {ratio(f['cpu_s'], aps['cpu_s'])}")
    return f"  {system} / apscheduler at N={n:,}: " + ", ".join(parts)


def parse_ns(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x]


def parse_brokers(text: str) -> list[str]:
    kinds = [x.strip() for x in text.split(",") if x.strip()]
    for kind in kinds:
        if kind not in BROKERS:
            raise argparse.ArgumentTypeError(f"unknown broker {kind!r} (one of {BROKERS})")
    return kinds


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=parse_ns, default=[20_000, 100_000], help="jobs, comma list")
    p.add_argument(
        "--broker",
        default="embedded",
        help="chronoq broker(s), comma list of embedded, remote, remote-unix, redis "
        "(default embedded)",
    )
    p.add_argument("--due-from", type=float, default=5.0, help="s after start (default 5)")
    p.add_argument("--due-to", type=float, default=35.0, help="s after start (default 35)")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0, help="s past --due-to to give up")
    p.add_argument(
        "--batch",
        type=int,
        default=0,
        help="chronoq: schedule_many in batches of this size (default 0: schedule() each)",
    )
    p.add_argument("--no-apscheduler", action="store_true", help="chronoq rows only")
    p.add_argument(
        "--no-inline",
        action="store_true",
        help="chronoq: Dispatcher(inline_jobs=False), every job to a pool thread",
    )
    p.add_argument(
        "--url-query",
        default="",
        help="embedded: parameters of the rocksdb:// URL, e.g. fire_hold_ms=0 (default none)",
    )
    p.add_argument("--json", action="store_true", help="also print one JSON line per row")
    p.add_argument("--child", choices=("apscheduler", "chronoq"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        args.n = args.n[0]
        return child_main(args)
    if importlib.util.find_spec("psutil") is None:
        raise SystemExit(f"psutil is not installed: {INSTALL_HINT}")
    try:
        brokers = parse_brokers(args.broker)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    systems: list[str] = []
    if not args.no_apscheduler:
        if importlib.util.find_spec("apscheduler") is None:
            print(f"APScheduler is not installed, skipping its rows: {INSTALL_HINT}")
        else:
            systems.append("apscheduler")
    systems += [f"chronoq-{b}" for b in brokers]
    print(
        f"== vs_apscheduler: due {args.due_from:g}-{args.due_to:g} s after start, "
        f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())} =="
    )
    print("lateness in ms; CPU/job from the end of scheduling to the last start")
    print(HEADER, flush=True)
    failed = False
    tmp = tempfile.mkdtemp(prefix="chronoq-vs-aps-")
    try:
        for n in args.n:
            rows: dict[str, dict[str, Any]] = {}
            for system in systems:
                figures = run_child(system, n, args, tmp)
                if figures is None:
                    failed = True
                    continue
                rows[system] = figures
                print(format_row(system, n, figures), flush=True)
                if system != "apscheduler" and "apscheduler" in rows:
                    print(format_ratios(system, n, figures, rows["apscheduler"]), flush=True)
                if figures["late_schedule"]:
                    print(f"  note: scheduling took {figures['sched_s']:.1f} s > --due-from")
                if figures["lost"] or figures["dup"] or figures["early"]:
                    failed = True
                if args.json:
                    pct = figures.pop("pct")
                    print(json.dumps({"system": system, "n": n, **figures, **pct}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
