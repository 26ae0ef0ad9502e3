"""Cron jobs: a seconds-precision heartbeat, an overlapping slow job, a daily job in a zone.

* ``heartbeat``: ``*/1 * * * * *``, six fields with seconds first, so it fires
  every second of the demo; occurrences older than 2 s (say, left from an earlier
  run) are skipped by ``misfire_grace_time``.
* ``slow_report``: every 2 s, but each run takes 3 s; with ``max_running=1`` a fire
  while the previous run still goes is skipped (one log line each).
* ``cleanup``: ``0 5 * * *`` in ``Asia/Shanghai``, daily at 05:00 shop time,
  whatever the server's zone; it does not fire during the demo, but its next
  occurrence is armed as a pending message (printed at start).

Each occurrence is one message keyed ``cron:<name>:<fire_ms>``, so two workers
on one broker never run an occurrence twice. The demo stops itself after
``--seconds`` (default 5; ``CRON_DEMO_SECONDS`` under ``chronoq run``)::

    chronoq run examples.cron_jobs:app
    python examples/cron_jobs.py --seconds 8
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from datetime import UTC, datetime

from scheduler.scheduler import Scheduler
from workers import current_job, on_start, stop_app

app = Scheduler(
    os.environ.get("CHRONOQ_BROKER_URL") or "rocksdb://./chronoq-data", topic="cron.demo"
)
SECONDS = float(os.environ.get("CRON_DEMO_SECONDS") or 5)

_lock = threading.Lock()
_runs: dict[str, int] = {"heartbeat": 0, "slow_report": 0, "cleanup": 0}


def _count(name: str) -> int:
    with _lock:
        _runs[name] += 1
        return _runs[name]


@app.cron("*/1 * * * * *", misfire_grace_time=2, name="demo.heartbeat")
def heartbeat() -> None:
    """Fires every second."""
    n = _count("heartbeat")
    due = datetime.fromtimestamp(current_job().due_ms / 1000, UTC)
    print(f"heartbeat #{n} for {due:%H:%M:%S} UTC")


@app.cron("*/2 * * * * *", max_running=1, misfire_grace_time=2, timeout=10, name="demo.slow_report")
def slow_report() -> None:
    """Fires every 2 s and takes 3 s, so every other fire is skipped."""
    n = _count("slow_report")
    print(f"slow_report #{n} started")
    if current_job().cancelled.wait(3):  # a cooperative job: stops early on shutdown
        print(f"slow_report #{n} cancelled")
    else:
        print(f"slow_report #{n} done")


@app.cron("0 5 * * *", tz="Asia/Shanghai", misfire_grace_time=3600, name="demo.cleanup")
def cleanup() -> None:
    """Daily at 05:00 Shanghai time."""
    _count("cleanup")
    print("cleanup ran")


def _finish() -> None:
    with _lock:
        runs = dict(_runs)
    print(
        f"summary: heartbeat ran {runs['heartbeat']} times, slow_report "
        f"{runs['slow_report']}, cleanup {runs['cleanup']}"
    )
    stop_app(app)


@on_start(app)
def announce() -> None:
    """Show the armed occurrences and stop the demo after ``SECONDS``."""
    for view in app.pending(topic=app.settings.topic):
        when = datetime.fromtimestamp(view.deliver_at_ms / 1000, UTC)
        print(f"armed {view.key} at {when.isoformat(timespec='seconds')}")
    cron = cleanup.cron
    assert cron is not None
    nxt = cron.trigger.local(cron.trigger.next_fire_ms(app.clock.now_ms()))
    print(f"cleanup next runs at {nxt.isoformat()} (Asia/Shanghai)")
    timer = threading.Timer(SECONDS, _finish)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    """Run the demo in this process for ``--seconds``."""
    global SECONDS
    import logging

    parser = argparse.ArgumentParser(description="chronoq cron demo")
    parser.add_argument("--seconds", type=float, default=SECONDS)
    SECONDS = parser.parse_args(argv).seconds
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s")
    try:
        app.run()
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
