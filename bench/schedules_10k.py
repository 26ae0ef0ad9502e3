"""10,000 stored schedules (one per tenant), each firing every minute, under a real
dispatcher on the embedded broker.

Adds ``--schedules`` interval schedules with ``app.schedules.add`` (each its own
record in the broker and its own occurrence message), then runs the app with
:func:`~workers.runner.run_app` (a real :class:`~workers.dispatcher.Dispatcher`,
its periodic re-arming included) for ``--seconds``. Every occurrence runs a
trivial job that records its schedule, its occurrence time and when it started.

Anchors are spread evenly over the interval by default (``anchor = i x every / N``:
a steady ~167 occurrences/s for 10,000 per minute); ``--aligned`` gives every
schedule the same anchor, so all of them fire in the same millisecond each
minute (the worst case: like 10,000 ``* * * * *`` crons).

Printed:

* the adds: schedules/s and the CPU per add;
* planner CPU per occurrence: the thread CPU time spent in ``app.planner.fire``
  (the record check, arming the next occurrence, the misfire decision), and the
  CPU of the periodic ``arm_all`` (reads every record, re-arms idempotently);
* the whole process's CPU per occurrence (broker, dispatcher, job);
* occurrence lateness (job start minus occurrence time) P50/P90/P99/P99.9/max,
  for the occurrences due after a warm-up;
* occurrences fired vs expected in the measured window: none lost, none doubled;
* peak RSS (``VmHWM``) and RSS after the adds; the load average (``uptime``).

Run from the project root::

    .venv/bin/python bench/schedules_10k.py                  # 10,000 x every 60 s, 180 s
    .venv/bin/python bench/schedules_10k.py --aligned
    .venv/bin/python bench/schedules_10k.py --schedules 1000 --seconds 60
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stats import (
    cpu_seconds,
    format_percentiles,
    mb,
    num,
    peak_rss_bytes,
    percentiles,
    print_block,
    rss_bytes,
)
from scheduler.interval import IntervalTrigger
from scheduler.scheduler import Scheduler
from workers.context import current_job
from workers.runner import run_app

JOB = "bench.tenant_tick"


class Timed:
    """Wraps a callable, summing the calling thread's CPU time and counting calls
    (only while ``active``)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.cpu = 0.0
        self.calls = 0
        self.active = False
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return self.func(*args, **kwargs)
        finally:
            spent = time.thread_time() - start
            if self.active:
                with self._lock:
                    self.cpu += spent
                    self.calls += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--every", type=float, default=60.0, help="interval, s")
    parser.add_argument("--seconds", type=float, default=180.0, help="how long to run")
    parser.add_argument("--warmup", type=float, default=10.0, help="not measured, s")
    parser.add_argument("--aligned", action="store_true", help="one anchor for all")
    parser.add_argument("--jitter", type=float, default=None, help="jitter, s")
    parser.add_argument("--arm-interval", type=float, default=30.0, help="re-arming, s")
    parser.add_argument("--dir", help="data directory (default: a temp dir, removed)")
    args = parser.parse_args()

    data = args.dir or tempfile.mkdtemp(prefix="chronoq-sched10k-")
    url = f"rocksdb://{data}?share=0"
    n, every_ms = args.schedules, round(args.every * 1000)
    app = Scheduler(url, max_workers=8, prefetch=64)
    lock = threading.Lock()
    starts: list[tuple[int, int, float]] = []  # (tenant, occurrence ms, start ms)

    @app.job(name=JOB, max_attempts=1)
    def tick(tenant: int) -> None:
        t = time.time() * 1000
        due = current_job().due_ms
        with lock:
            starts.append((tenant, due, t))

    try:
        # -- adding -----------------------------------------------------------------
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        for i in range(n):
            anchor = 0 if args.aligned else i * every_ms // n
            app.schedules.add(
                f"tenant-{i}",
                tick,
                every=every_ms / 1000,
                anchor=anchor,
                args=(i,),
                jitter=args.jitter,
            )
        add_s, add_cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        rss_after_adds = rss_bytes()

        # -- running ----------------------------------------------------------------
        fire = Timed(app.planner.fire)
        arm_all = Timed(app.planner.arm_all)
        app.planner.fire = fire  # type: ignore[method-assign]
        app.planner.arm_all = arm_all  # type: ignore[method-assign]
        arm_all.active = True  # the start-up arm_all counts too
        stop = threading.Event()
        runner = threading.Thread(
            target=run_app,
            args=(app,),
            kwargs={"stop_event": stop, "arm_interval_s": args.arm_interval},
            daemon=True,
        )
        started_ms = time.time() * 1000
        runner.start()
        time.sleep(args.warmup)
        window_start = time.time() * 1000
        cpu1 = cpu_seconds()
        fire.active = True
        time.sleep(args.seconds)
        fire.active = False
        window_end = time.time() * 1000
        cpu_run = cpu_seconds() - cpu1
        time.sleep(2.0)  # let the last occurrences of the window finish
        stop.set()
        runner.join(60)
    finally:
        app.close()
        if not args.dir:
            shutil.rmtree(data, ignore_errors=True)

    # -- figures ----------------------------------------------------------------------
    with lock:
        runs = list(starts)
    in_window = [r for r in runs if window_start < r[1] <= window_end]
    seen = Counter((tenant, due) for tenant, due, _ in in_window)
    expected = set()
    for i in range(n):
        trig = IntervalTrigger(every_ms / 1000, 0 if args.aligned else i * every_ms // n)
        for t in trig.fire_times_between(int(window_start), int(window_end)):
            expected.add((i, t))
    doubled = sum(c - 1 for c in seen.values() if c > 1)
    lost = len(expected - set(seen))
    extra = len(set(seen) - expected)
    late = percentiles(start - due for _, due, start in in_window)
    occurrences = len(in_window)
    load = os.getloadavg()

    print_block(
        f"{num(n)} interval schedules, every {args.every:g} s"
        + (" (aligned)" if args.aligned else " (anchors spread)")
        + (f", jitter {args.jitter:g} s" if args.jitter else ""),
        [
            ("adds", f"{num(n / add_s)} schedules/s ({add_s:.1f} s, {add_cpu * 1e6 / n:.0f} us CPU each)"),
            ("measured", f"{args.seconds:g} s after a {args.warmup:g} s warm-up"),
            ("occurrences", f"{num(occurrences)} fired, {num(len(expected))} expected"),
            ("lost / doubled", f"{lost} / {doubled}" + (f" (+{extra} unexpected)" if extra else "")),
            ("planner CPU", f"{fire.cpu * 1e6 / max(1, fire.calls):.0f} us per occurrence ({num(fire.calls)} calls)"),
            ("arm_all CPU", f"{arm_all.cpu * 1000 / max(1, arm_all.calls):.0f} ms per pass ({arm_all.calls} passes, every {args.arm_interval:g} s)"),
            ("process CPU", f"{cpu_run * 1e6 / max(1, occurrences):.0f} us per occurrence ({cpu_run / args.seconds * 100:.0f} % of a core)"),
            ("lateness ms", format_percentiles(late)),
            ("RSS", f"{mb(rss_after_adds)} after the adds, peak {mb(peak_rss_bytes())}"),
            ("load average", f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min)"),
            ("started", f"dispatcher {(window_start - started_ms) / 1000:.1f} s before the window"),
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
