"""Cost of the delivery trace on firing: the same load with the trace off and on.

Run from the project root::

    .venv/bin/python bench/spark_trace_overhead.py               # 3 rounds of each
    .venv/bin/python bench/spark_trace_overhead.py -n 50000 --rounds 5

Each round, on a fresh ``rocksdb://`` directory, with a Dispatcher (8 workers,
prefetch 256) and a no-op job, alternating off/on:

* **burst**: ``-n`` jobs all due at the same instant (a backlog fires at once);
  figures: jobs/s from the due time until the last job finished, and CPU time
  (user + system, this process) per job over the same span: on a shared 2-core
  machine wall throughput swings with other load, CPU per job much less;
* **paced**: ``-n`` jobs due evenly over ``n / rate`` seconds; figure: lateness
  (job start minus due, ms) P50 / P99, nearest rank.

The trace's cost is the median over rounds of on vs off: ``burst`` CPU per job
and throughput in %, and the ``paced`` lateness. The requirement: at most 10 %.
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from scheduler.scheduler import Scheduler
from workers import Dispatcher, current_job
from workers.trace import DeliveryTrace


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(p * len(ordered)), 1) - 1]


def one_run(n: int, spread_s: float, traced: bool) -> tuple[float, float, list[float], int]:
    """``(jobs/s from due to last finish, CPU us per job, lateness list, trace lines)``."""
    root = Path(tempfile.mkdtemp(prefix="chronoq-trace-bench-"))
    app = Scheduler(f"rocksdb://{root / 'data'}", max_workers=8, prefetch=256)
    late: list[float] = []
    done = threading.Event()
    lock = threading.Lock()

    @app.job(name="bench.noop")
    def noop(i: int) -> None:
        job = current_job()
        with lock:
            late.append(time.time() * 1000 - job.due_ms)
            if len(late) == n:
                done.set()

    trace = DeliveryTrace(root / "trace") if traced else None
    dispatcher = Dispatcher(app, trace=trace)
    dispatcher.open()
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run_forever, kwargs={"stop_event": stop})
    thread.start()
    try:
        lead = 2.0 + n / 100_000
        base = time.time() + lead
        step = spread_s / n
        for start in range(0, n, 5000):
            calls = [((i,), {}) for i in range(start, min(n, start + 5000))]
            if spread_s == 0:
                noop.schedule_many(calls, delay=max(0.0, base - time.time()))
            else:
                from scheduler.handles import Call

                now = time.time()
                noop.schedule_many(
                    [Call((i,), delay=max(0.0, base + i * step - now)) for ((i,), _) in calls]
                )
        cpu0 = None
        while time.time() < base:
            cpu0 = time.process_time()
            time.sleep(min(0.005, max(0.0, base - time.time())))
        cpu0 = time.process_time() if cpu0 is None else cpu0
        assert done.wait(120 + spread_s), f"only {len(late)} of {n} ran"
        finished = time.time()
        if trace is not None:
            trace.flush()  # its writing counts too
        cpu_us = (time.process_time() - cpu0) / n * 1e6
        rate = n / max(finished - base - spread_s, 1e-9) if spread_s == 0 else n / spread_s
    finally:
        stop.set()
        thread.join()
        dispatcher.close()
        lines = 0
        if trace is not None:
            trace.close()
            lines = trace.written
        app.close()
        shutil.rmtree(root, ignore_errors=True)
    return rate, cpu_us, late, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30_000, help="jobs per run")
    parser.add_argument("--rate", type=float, default=5_000, help="paced jobs per second")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    burst: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    p50: dict[bool, list[float]] = {False: [], True: []}
    p99: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for traced in (False, True) if r % 2 == 0 else (True, False):
            rate, cpu_us, _, lines = one_run(args.n, 0, traced)
            burst[traced].append(rate)
            cpu[traced].append(cpu_us)
            _, _, late, lines2 = one_run(args.n, args.n / args.rate, traced)
            p50[traced].append(nearest_rank(late, 0.5))
            p99[traced].append(nearest_rank(late, 0.99))
            print(
                f"round {r + 1} trace={'on ' if traced else 'off'}: burst {rate:,.0f} jobs/s, "
                f"{cpu_us:.1f} us CPU/job; "
                f"paced {args.rate:,.0f}/s lateness P50 {p50[traced][-1]:.2f} ms "
                f"P99 {p99[traced][-1]:.2f} ms; trace lines {lines + lines2:,}"
            )
    off, on = statistics.median(burst[False]), statistics.median(burst[True])
    c_off, c_on = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(
        f"\nburst median CPU per job: off {c_off:.1f} us, on {c_on:.1f} us "
        f"-> trace costs {100 * (c_on - c_off) / c_off:+.1f} % (limit 10 %)"
    )
    print(
        f"burst median throughput: off {off:,.0f} jobs/s, on {on:,.0f} jobs/s "
        f"-> trace costs {100 * (off - on) / off:+.1f} % (limit 10 %)"
    )
    print(
        f"paced median lateness: off P50 {statistics.median(p50[False]):.2f} / "
        f"P99 {statistics.median(p99[False]):.2f} ms; on P50 {statistics.median(p50[True]):.2f}"
        f" / P99 {statistics.median(p99[True]):.2f} ms"
    )


if __name__ == "__main__":
    main()
