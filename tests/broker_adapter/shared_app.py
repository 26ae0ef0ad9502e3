"""The app of the shared-directory tests: one job that records each run.

``record(key)`` appends ``KEY PID`` to the file ``CHRONOQ_TEST_RUNS`` names (one
short ``O_APPEND`` write per run, so lines of concurrent processes never mix).
The broker URL comes from ``CHRONOQ_BROKER_URL``. ``python shared_app.py NAME
COUNT JOURNAL`` is a scheduling process: it schedules ``COUNT`` keyed runs,
journals each acknowledged one (``acked KEY``) and each failed attempt
(``failed KEY ERROR``), and retries a failed one until it is acknowledged.
"""

from __future__ import annotations

import os
import sys
import time

from broker_adapter.errors import ChronoqError
from scheduler.scheduler import Scheduler

app = Scheduler()  # CHRONOQ_BROKER_URL from the environment


@app.job(name="shared.record")
def record(key: str) -> None:
    """Append one line saying this process ran ``key``."""
    fd = os.open(os.environ["CHRONOQ_TEST_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{key} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@app.job(name="shared.slow", max_attempts=5)
def slow(key: str) -> None:
    """Record ``begin-KEY``, take ``CHRONOQ_TEST_SLOW_S`` seconds (default 1), record ``KEY``."""
    record(f"begin-{key}")
    time.sleep(float(os.environ.get("CHRONOQ_TEST_SLOW_S", "1")))
    record(key)


def schedule_all(name: str, count: int, journal_path: str) -> None:
    """Schedule ``count`` keyed runs of :func:`record`, retrying each until acknowledged."""
    with open(journal_path, "a", buffering=1) as journal:
        broker = app.broker
        journal.write(f"role {getattr(broker, 'role', None)} {getattr(broker, 'owner_pid', 0)}\n")
        for i in range(count):
            key = f"{name}-{i}"
            while True:
                try:
                    record.schedule(key, key=key, delay=(i % 7) / 20)
                except ChronoqError as e:  # the owner went away: retry (keyed: safe)
                    journal.write(f"failed {key} {type(e).__name__}\n")
                    time.sleep(0.02)
                    continue
                journal.write(f"acked {key}\n")
                time.sleep(0.002)  # a steady stream, so a kill lands mid-way
                break
        journal.write(f"role {getattr(broker, 'role', None)} {getattr(broker, 'owner_pid', 0)}\n")
    app.close()


if __name__ == "__main__":
    schedule_all(sys.argv[1], int(sys.argv[2]), sys.argv[3])
