"""What the JobMetrics hook (Prometheus job metrics and job stats) adds per job.

Two figures:

* **end to end**: a real Dispatcher on ``memory://`` runs N no-op jobs with and
  without the hook (RunLog in both), rounds alternating; CPU (process time) and
  wall time per job, median of the rounds, and the difference;
* **the hook alone**: its three calls per job (``before_start``, ``after_job``,
  ``before_settle``) in a loop, µs per job, and a ``/metrics`` scrape's time with
  the counted jobs.

    python bench/job_metrics_overhead.py [--jobs 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import urllib.request
from collections.abc import Sequence

from broker_adapter import open_broker
from broker_adapter.clock import SystemClock
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from workers.context import JobContext
from workers.dispatcher import Dispatcher
from workers.job_metrics import JobMetrics
from workers.runs import Run
from workers.schedule_runs import RunLog
from workers.settlement import Settlement


def noop(i: int) -> None:
    """The job: nothing, so the dispatcher's own cost shows."""


def _app(n: int, tag: str) -> Scheduler:
    """An app on a fresh memory:// broker with ``n`` runs of a no-op job ready."""
    app = Scheduler(open_broker(f"memory://bench-{tag}"), max_workers=4, prefetch=256)
    job = app.job(name="bench.noop")(noop)
    for i in range(n):
        job.schedule(i)
    return app


def one_round(n: int, with_hook: bool, tag: str) -> tuple[float, float]:
    """CPU and wall seconds to run ``n`` ready jobs to the end."""
    app = _app(n, tag)
    hooks = [RunLog(app)]
    if with_hook:
        hooks.append(JobMetrics(app))
    d = Dispatcher(app, hooks=hooks)
    cpu, wall = time.process_time(), time.perf_counter()
    done = 0
    while done < n:
        done += d.run_until_idle(timeout_s=60)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    d.close()
    app.close()
    return cpu, wall


def hook_alone(n: int) -> tuple[float, float]:
    """µs per job of the hook's three calls, and ms of one scrape after ``n`` jobs."""
    app = Scheduler(open_broker("memory://bench-hook"))
    job = app.job(name="bench.noop")(noop)
    receipt = job.schedule(1)
    spec = app.registry.get("bench.noop")
    consumer = app.broker.consumer("g", [app.settings.topic])
    message = consumer.pull(1, 1000)[0]
    assert message.msg_id == receipt.msg_id
    clock = SystemClock()
    ctx = JobContext(spec, JobCall("bench.noop", (1,)), message, None, lambda: clock.now_ms())
    ctx.mark_started()
    run = Run(message, spec, ctx.call, ctx)
    metrics = JobMetrics(app, stats=False)
    start = time.perf_counter()
    for _ in range(n):
        metrics.before_start(run, ctx)
        metrics.after_job(run, ctx, None)
        metrics.before_settle(message, "bench.noop", run, Settlement.ACK, "")
    per_job = (time.perf_counter() - start) / n * 1e6
    url = metrics.serve(0)
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        resp.read()
    scrape_ms = (time.perf_counter() - start) * 1000
    metrics.stop_serving()
    consumer.close()
    app.close()
    return per_job, scrape_ms


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per round (default 20000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each (default 5)")
    args = p.parse_args(argv)
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    without: list[tuple[float, float]] = []
    with_: list[tuple[float, float]] = []
    for r in range(args.rounds):
        without.append(one_round(args.jobs, False, f"a{r}"))
        with_.append(one_round(args.jobs, True, f"b{r}"))
    n = args.jobs
    cpu0 = statistics.median(c for c, _ in without) / n * 1e6
    cpu1 = statistics.median(c for c, _ in with_) / n * 1e6
    wall0 = statistics.median(w for _, w in without) / n * 1e6
    wall1 = statistics.median(w for _, w in with_) / n * 1e6
    print(f"end to end, {n} no-op jobs x {args.rounds} rounds on memory:// (median):")
    print(f"  without JobMetrics: {cpu0:6.1f} us CPU/job, {wall0:6.1f} us wall/job")
    print(f"  with JobMetrics:    {cpu1:6.1f} us CPU/job, {wall1:6.1f} us wall/job")
    print(f"  added:              {cpu1 - cpu0:6.1f} us CPU/job, {wall1 - wall0:6.1f} us wall/job")
    per_job, scrape_ms = hook_alone(200_000)
    print(f"the hook alone: {per_job:.2f} us per job (before_start + after_job + before_settle)")
    print(f"one /metrics scrape: {scrape_ms:.1f} ms")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
