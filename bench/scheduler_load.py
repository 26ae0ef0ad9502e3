"""Job-level load benchmark: ``schedule()`` and the Dispatcher with a no-op job (issue 3).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/scheduler_load.py                 # 100,000 jobs at ~5,000/s
    .venv/bin/python bench/scheduler_load.py -n 20000 --rate 2000 --json

What it does, on a fresh ``rocksdb://`` directory under the temp dir (removed after):

1. starts a :class:`~workers.Dispatcher` (default settings: 8 workers, prefetch 32)
   in a thread, logging at WARNING (an INFO line per job costs ~15 us more);
2. **schedule, one at a time**: ``noop.schedule(i, delay=...)`` for ``-n`` jobs,
   whose due times are spread evenly over ``n / rate`` seconds starting ``--lead``
   seconds after the run starts; figure: calls/s of wall time;
3. **schedule_many**: ``-n`` more jobs in batches of ``--batch`` (one ``send_batch``
   each), due in a day, so they never fire during the run; figure: jobs/s;
4. waits until every job of step 2 ran once; **lateness** per job is
   ``time.time()`` when the job body starts minus the message's due time (ms),
   nearest-rank P50/P99/P99.9 and max; also the achieved start rate.

The exit status is 1 when a job of step 2 did not run or ran twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter

from scheduler.scheduler import Scheduler
from workers import Dispatcher, current_job


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0-100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(p / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=100_000, help="jobs (default 100,000)")
    parser.add_argument("--rate", type=float, default=5000.0, help="due jobs per second")
    parser.add_argument(
        "--lead",
        type=float,
        default=8.0,
        help="seconds from start to the first due time (default 8)",
    )
    parser.add_argument("--batch", type=int, default=1000, help="schedule_many batch size")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    tmp = tempfile.mkdtemp(prefix="chronoq-bench-")
    app = Scheduler(
        f"rocksdb://{tmp}/data",
        max_workers=args.workers,
        prefetch=args.prefetch,
        topic="bench.jobs",
    )
    lateness: list[float] = []
    ran: Counter[int] = Counter()

    @app.job(name="bench.noop")
    def noop(i: int) -> None:
        lateness.append(time.time() * 1000 - current_job().message.deliver_at_ms)
        ran[i] += 1

    @app.job(name="bench.parked", topic="bench.parked")
    def parked(i: int) -> None:  # never due during the run
        raise AssertionError(i)

    n = args.n
    dispatcher = Dispatcher(app)
    dispatcher.open()
    thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
    thread.start()
    try:
        t0 = time.time()
        first_due = t0 + args.lead
        step = 1.0 / args.rate
        start = time.perf_counter()
        for i in range(n):
            noop.schedule(i, delay=max(0.0, first_due + i * step - time.time()))
        single_s = time.perf_counter() - start
        late_start = time.time() > first_due
        start = time.perf_counter()
        for lo in range(0, n, args.batch):
            parked.schedule_many(
                [((i,), {}) for i in range(lo, min(n, lo + args.batch))], delay=86_400
            )
        batch_s = time.perf_counter() - start
        deadline = first_due + n * step + 30
        while len(lateness) < n and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        dispatcher.stop()
        thread.join()
        app.close()
        shutil.rmtree(tmp, ignore_errors=True)
    lat = sorted(lateness)
    missing = n - len(ran)
    dup = sum(c - 1 for c in ran.values() if c > 1)
    window = n * step
    figures = {
        "jobs": n,
        "schedule_single_per_s": round(n / single_s),
        "schedule_many_per_s": round(n / batch_s),
        "nominal_rate_per_s": args.rate,
        "lateness_ms": {p: round(percentile(lat, float(p)), 2) for p in ("50", "99", "99.9")}
        | {"max": round(lat[-1], 2) if lat else None},
        "ran": len(lateness),
        "missing": missing,
        "duplicated": dup,
    }
    print(f"jobs                     {n:,} (due over {window:.1f} s, nominal {args.rate:,.0f}/s)")
    print(f"schedule() one at a time {figures['schedule_single_per_s']:,} jobs/s")
    print(f"schedule_many({args.batch})      {figures['schedule_many_per_s']:,} jobs/s")
    q = figures["lateness_ms"]
    print(
        f"job-start lateness       P50 {q['50']} ms  P99 {q['99']} ms  "
        f"P99.9 {q['99.9']} ms  max {q['max']} ms"
    )
    print(f"ran                      {len(lateness):,}; missing {missing}, duplicated {dup}")
    if late_start:
        print(
            "note: scheduling took longer than --lead; the first jobs were due before "
            "they were sent (raise --lead)"
        )
    if args.json:
        print(json.dumps(figures))
    return 1 if missing or dup else 0


if __name__ == "__main__":
    sys.exit(main())
