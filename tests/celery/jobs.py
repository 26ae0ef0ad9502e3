"""The jobs of the Celery tests, run by a real worker: ``celery -A tests.celery.jobs worker``.

The worker and the test process both call :func:`define` on their own Scheduler,
so the job names agree. Every run appends one JSON record to the Redis list
``runs`` (job, task id, pid, attempt, tag): that list is what the tests assert on.

Environment (set by :class:`tests.celery.conftest.CeleryWorker`):
``CHRONOQ_CELERY_BROKER_URL`` (broker, result backend and the ``runs`` list),
``CQ_VISIBILITY`` (the Redis transport's ``visibility_timeout``, seconds).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis

from scheduler.scheduler import Scheduler
from scheduler.spec import RetryPolicy
from workers import current_job
from workers.celery import celery_app_for

RUNS = "runs"
#: Set by a test to let a blocked ``t.slow`` run finish.
RELEASE = "release"

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


class Flaky(Exception):
    """A failure worth a chronoq retry."""


def _redis() -> redis.Redis:
    url = os.environ["CHRONOQ_CELERY_BROKER_URL"]
    with _lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url)
        return client


def _record(job: str, tag: str) -> dict[str, Any]:
    ctx = current_job()
    rec = {
        "job": job,
        "task_id": ctx.msg_id,
        "attempt": ctx.attempt,
        "due_ms": ctx.due_ms,
        "start_ms": time.time() * 1000,
        "pid": os.getpid(),
        "tag": tag,
    }
    _redis().rpush(RUNS, json.dumps(rec))
    return rec


def celery_conf(visibility_s: float) -> dict[str, Any]:
    """Celery settings of both sides: a short restore cycle so abandoned messages
    come back within about a second of ``visibility_s``."""
    return {
        "broker_transport_options": {
            "visibility_timeout": visibility_s,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            "socket_connect_timeout": 2,
        },
        "worker_hijack_root_logger": False,
    }


def define(scheduler: Scheduler) -> None:
    """Register the test jobs on ``scheduler``."""

    @scheduler.job(name="t.record", executor="celery")
    def record(tag: str) -> str:
        _record("t.record", tag)
        return tag.upper()

    @scheduler.job(name="t.quick", executor="celery", retry=RetryPolicy.fixed(0.5))
    def quick(tag: str) -> str:
        _record("t.quick", tag)
        return tag

    @scheduler.job(name="t.flaky", executor="celery", retry=RetryPolicy.fixed(0.2), max_attempts=3)
    def flaky(tag: str) -> str:
        rec = _record("t.flaky", tag)
        if rec["attempt"] == 1:
            raise Flaky(f"first attempt of {tag}")
        return "ok"

    @scheduler.job(name="t.broken", executor="celery", max_attempts=1)
    def broken(tag: str) -> None:
        _record("t.broken", tag)
        raise ValueError(f"{tag} is broken")

    @scheduler.job(name="t.slow", executor="celery")
    def slow(tag: str) -> str:
        _record("t.slow", tag)
        deadline = time.monotonic() + 60
        while not _redis().exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "released"


scheduler = Scheduler("rocksdb://./unused-by-the-worker")  # the worker never opens it
define(scheduler)
app = celery_app_for(
    scheduler,
    os.environ.get("CHRONOQ_CELERY_BROKER_URL"),
    **celery_conf(float(os.environ.get("CQ_VISIBILITY", "3600"))),
)


@app.task(name="t.plain")  # type: ignore[untyped-decorator]
def plain(tag: str) -> str:
    """A user's own Celery task, scheduled with ``schedule_task``."""
    from celery import current_task

    rec = {"job": "t.plain", "task_id": current_task.request.id, "pid": os.getpid(), "tag": tag}
    _redis().rpush(RUNS, json.dumps(rec))
    return tag
