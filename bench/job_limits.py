"""Per-job limits across dispatcher processes: the rate a ``rate_limit`` lets through,
the lateness the limiter adds, and how often waiting runs come back.

Starts a broker server (``python -m broker_adapter.server`` on a temp dir and a free
port; or ``--broker URL``, e.g. ``redis://127.0.0.1:6379/0``) and ``--dispatchers``
dispatcher processes (this script in ``--child`` mode: a real
:class:`~workers.dispatcher.Dispatcher` under :func:`~workers.runner.run_app`).
Then sends ``--runs`` runs of one job, all due at once, and waits for all of them.

* ``--mode rate`` (default): the job has ``rate_limit=--rate``. Printed: the achieved
  rate over the middle of the run (after the burst of ``limit`` runs, before the
  last second) against the limit, and the *extra lateness*: each waiting run's
  start minus the start an ideal limiter would give it (the k-th run, in start
  order, at ``(k - limit + 1) x period / limit`` after the first start), P50..max;
  and for comparison the lateness of the burst (the first ``limit`` runs, which
  never wait: the delivery's own lateness from the send, sending included).
* ``--mode slots``: the job has ``max_running=--max-running`` and sleeps ``--job-ms``.
  Printed: the most runs seen overlapping, and the makespan against the ideal
  ``ceil(runs / max_running) x job``.

Both print how many times a run was released to wait (from every dispatcher's
count of its ``DEFER`` settlements), per waiting run and per second, and the
machine's load average.

Run from the project root::

    .venv/bin/python bench/job_limits.py                       # 3 dispatchers, 20/s, 200 runs
    .venv/bin/python bench/job_limits.py --rate 100/s --runs 1000
    .venv/bin/python bench/job_limits.py --mode slots --max-running 4 --runs 100
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.remote_send import start_server, stop_server
from bench.stats import format_percentiles, load_average, num, percentiles, print_block
from broker_adapter.results import ReceivedMessage
from scheduler.limits import RateLimit
from scheduler.scheduler import Scheduler
from workers.hooks import DispatchHook
from workers.runs import Run
from workers.settlement import Settlement

JOB = "bench.limited"


def build_app(
    url: str, mode: str, rate: str, max_running: int, job_ms: int, out: Path
) -> Scheduler:
    """The bench app: one job, limited as ``mode`` says, recording start and end."""
    app = Scheduler(url, max_workers=8, prefetch=16)
    lock = threading.Lock()

    def limited(n: int) -> None:
        start = time.time()
        if job_ms:
            time.sleep(job_ms / 1000)
        with lock, open(out, "a") as f:
            f.write(f"{n} {start:.6f} {time.time():.6f}\n")

    if mode == "rate":
        app.job(name=JOB, max_attempts=1, rate_limit=rate)(limited)
    else:
        app.job(name=JOB, max_attempts=1, max_running=max_running)(limited)
    return app


class Waits(DispatchHook):
    """Counts the runs released to wait (``DEFER``)."""

    def __init__(self) -> None:
        self.count = 0

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        if settlement is Settlement.DEFER:
            self.count += 1  # one pull thread settles refusals: no lock needed


def child(args: argparse.Namespace) -> None:
    """One dispatcher process, until SIGTERM; then its wait count in ``<out>.waits``."""
    from workers.dispatcher import Dispatcher
    from workers.runner import run_app

    out = Path(args.out)
    app = build_app(args.broker, args.mode, args.rate, args.max_running, args.job_ms, out)
    waits = Waits()
    dispatcher = Dispatcher(app, hooks=[waits])
    try:
        run_app(app, dispatcher=dispatcher)
    finally:
        Path(f"{out}.waits").write_text(str(waits.count))
        app.close()


def spawn(args: argparse.Namespace, url: str, out: Path) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--broker",
        url,
        "--out",
        str(out),
    ]
    argv += ["--mode", args.mode, "--rate", args.rate, "--max-running", str(args.max_running)]
    argv += ["--job-ms", str(args.job_ms)]
    return subprocess.Popen(argv, text=True, stderr=subprocess.DEVNULL)


def rows_of(paths: list[Path]) -> list[tuple[int, float, float]]:
    rows = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                n, start, end = line.split()
                rows.append((int(n), float(start), float(end)))
    return rows


def max_overlap(rows: list[tuple[int, float, float]]) -> int:
    events = sorted([(r[1], 1) for r in rows] + [(r[2], -1) for r in rows])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default=None, help="broker URL (default: a fresh server)")
    p.add_argument("--dispatchers", type=int, default=3)
    p.add_argument("--mode", choices=("rate", "slots"), default="rate")
    p.add_argument("--rate", default="20/s", help="the job's rate_limit (default %(default)s)")
    p.add_argument("--max-running", type=int, default=2)
    p.add_argument("--job-ms", type=int, default=None, help="job duration (slots: 100 ms)")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job_ms is None:
        args.job_ms = 100 if args.mode == "slots" else 0
    if args.child:
        child(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="chronoq-limits-"))
    server = None
    url = args.broker
    if url is None:
        server, url = start_server(str(tmp / "server"))
    procs, outs = [], [tmp / f"d{i}.txt" for i in range(args.dispatchers)]
    try:
        for out in outs:
            procs.append(spawn(args, url, out))
        time.sleep(3.0)  # let every dispatcher join its group
        app = build_app(url, args.mode, args.rate, args.max_running, args.job_ms, tmp / "unused")
        due = time.time()
        app.handle(JOB).schedule_many([((n,), {}) for n in range(args.runs)])
        deadline = time.monotonic() + 600
        while len(rows_of(outs)) < args.runs and time.monotonic() < deadline:
            time.sleep(0.1)
        app.close()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
        if server is not None:
            stop_server(server)
    rows = rows_of(outs)
    waits = sum(
        int(Path(f"{o}.waits").read_text() or 0) for o in outs if Path(f"{o}.waits").exists()
    )
    shutil.rmtree(tmp, ignore_errors=True)
    starts = sorted(r[1] for r in rows)
    ran = sorted(r[0] for r in rows)
    span = starts[-1] - starts[0] if starts else 0.0
    table = [
        ("broker", url.split("?")[0] if args.broker else "chronoq:// (a fresh server)"),
        ("dispatchers", str(args.dispatchers)),
        ("runs", f"{len(rows)} of {args.runs}, each once: {ran == list(range(args.runs))}"),
        ("span (first to last start)", f"{span:.2f} s"),
    ]
    if args.mode == "rate":
        limit = RateLimit.parse(args.rate)
        per_s = limit.limit * 1000 / limit.period_ms
        interval = limit.interval_ms / 1000
        lo, hi = starts[0] + limit.limit * interval, starts[-1] - 1.0
        middle = [t for t in starts if lo <= t <= hi]
        achieved = len(middle) / (hi - lo) if hi > lo else float("nan")
        # The ideal limiter, from the first start: the burst at once, then one per interval
        ideal = [starts[0] + max(0, k - limit.limit + 1) * interval for k in range(len(starts))]
        extra = [(s - i) * 1000 for s, i in zip(starts, ideal, strict=True)]
        burst = [(s - due) * 1000 for s in starts[: limit.limit]]
        table += [
            ("limit", f"{limit} ({per_s:g}/s, bursts of {limit.limit})"),
            ("achieved rate, middle", f"{achieved:.1f}/s ({achieved / per_s:.0%} of the limit)"),
            ("burst's lateness (ms)", format_percentiles(percentiles(burst))),
            ("extra lateness (ms)", format_percentiles(percentiles(extra[limit.limit :]))),
        ]
        waiting = max(1, args.runs - limit.limit)
    else:
        ideal_s = math.ceil(args.runs / args.max_running) * args.job_ms / 1000
        makespan = max(r[2] for r in rows) - due if rows else float("nan")
        table += [
            ("max_running", str(args.max_running)),
            ("most seen overlapping", str(max_overlap(rows))),
            ("makespan vs ideal", f"{makespan:.2f} s vs {ideal_s:.2f} s"),
        ]
        waiting = max(1, args.runs - args.max_running)
    per_span = waits / span if span else 0.0
    table += [
        (
            "released to wait",
            f"{num(waits)} ({waits / waiting:.2f} per waiting run, {per_span:.0f}/s)",
        ),
        ("load average", load_average()),
    ]
    print_block(f"per-job limits, mode {args.mode}", table)


if __name__ == "__main__":
    main()
