"""The app of the ``chronoq run`` kill -9 soak: one job that records each run.

``chronoq run bench.soak_app:app`` (``CHRONOQ_BROKER_URL`` names the broker,
``SOAK_LEDGER`` the ledger directory) runs ``soak.record``; each run appends
``R id attempt t pid`` to ``SOAK_LEDGER/run-<pid>.log`` before it works. The
soak's producer calls :func:`define` on its own Scheduler, so the names agree.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench.soak_ledger import LedgerFile
from scheduler.scheduler import Scheduler
from workers import current_job

#: The job's name.
JOB = "soak.record"
#: Seconds each run works, so that kills land with runs in flight.
WORK_S = 0.01

_files: dict[int, LedgerFile] = {}
_lock = threading.Lock()


def _ledger() -> LedgerFile:
    with _lock:  # one file per process (fork-safe: keyed by pid)
        pid = os.getpid()
        found = _files.get(pid)
        if found is None:
            found = _files[pid] = LedgerFile(Path(os.environ["SOAK_LEDGER"]) / f"run-{pid}.log")
        return found


def define(scheduler: Scheduler) -> None:
    """Register ``soak.record`` on ``scheduler``."""

    @scheduler.job(name=JOB)
    def record(tag: str) -> None:
        ctx = current_job()
        _ledger().run(ctx.msg_id, ctx.attempt)
        time.sleep(WORK_S)


app = Scheduler()  # CHRONOQ_BROKER_URL from the environment; opened on first use
define(app)
