"""The app every namespaced host runs with ``chronoq run tests.netns.app:app``.

Each run appends one JSON line when it starts to its process's ledger,
``$NETNS_RUNS/<host>-<pid>.jsonl``: the job (``j``), key (``k``), message id
(``m``), attempt (``a``), host (``h``), pid (``p``), start time in epoch ms
(``t``), and the due time (``d``, the keyed job's) or occurrence (``f``, the
interval job's); a keyed job writes a second line when it ends (``e``: 1), so a
run cut short by a ``kill -9`` shows as a start without an end. Lines are short and written with one ``O_APPEND`` ``write``,
so the job threads of one process never interleave them, and a ``kill -9``
loses no line a run finished writing. The broker URL is the environment's
``CHRONOQ_BROKER_URL``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from typing import Any

from scheduler.scheduler import Scheduler
from workers import current_job

#: Environment: the ledger directory, this host's name, and how long (ms) a keyed
#: job works after recording its start (so that a killed host has runs in flight).
RUNS_ENV = "NETNS_RUNS"
HOST_ENV = "NETNS_HOST"
JOB_MS_ENV = "NETNS_JOB_MS"
#: The keyed job, and the interval job (every :data:`TICK_S` seconds).
WORK = "netns.work"
TICK = "netns.tick"
TICK_S = 2

app = Scheduler()

_lock = threading.Lock()
_fd: int | None = None


def _ledger() -> int:
    global _fd
    with _lock:
        if _fd is None:
            path = os.path.join(os.environ[RUNS_ENV], f"{os.environ[HOST_ENV]}-{os.getpid()}.jsonl")
            _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return _fd


def _record(job: str, **fields: Any) -> None:
    run = current_job()
    line = {
        "j": job,
        "m": run.message.msg_id,
        "a": run.message.attempts,
        "h": os.environ[HOST_ENV],
        "p": os.getpid(),
        "t": int(time.time() * 1000),
        **fields,
    }
    os.write(_ledger(), (json.dumps(line, separators=(",", ":")) + "\n").encode())


@app.job(name=WORK)
def work(key: str, due_ms: int) -> None:
    """One keyed job: records its start, works :data:`JOB_MS_ENV` ms, records its end."""
    _record(WORK, k=key, d=due_ms)
    time.sleep(int(os.environ.get(JOB_MS_ENV, "0")) / 1000)
    _record(WORK, k=key, e=1)


# No misfire limit and every missed occurrence run: an outage must not skip one.
@app.every(timedelta(seconds=TICK_S), name=TICK, misfire_grace_time=None, coalesce="all")
def tick() -> None:
    """The interval job: records its occurrence."""
    _record(TICK, f=current_job().fire_ms)
