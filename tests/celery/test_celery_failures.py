"""The failures Celery users hit with ``apply_async(eta=...)``, and chronoq's answers:
a visibility timeout shorter than the delay, a Celery broker outage, a worker
killed mid-task (``acks_late``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from broker_adapter import MessageState
from tests.celery import jobs
from tests.celery.conftest import (
    BOTH_PUBLISH_PATHS_SLOW_GENERAL,
    CeleryWorker,
    Chronoq,
    runs,
    wait_for,
)
from tests.redis_server import RedisServer

pytestmark = pytest.mark.external_service


def _view_state(chronoq: Chronoq, msg_id: str) -> MessageState | None:
    view = chronoq.scheduler.broker.query(msg_id)
    return None if view is None else view.state


@BOTH_PUBLISH_PATHS_SLOW_GENERAL
def test_job_due_past_the_visibility_timeout_runs_exactly_once(
    tmp_path: Path, redis_url: str, publish_script: bool
) -> None:
    # Given a worker whose Redis transport redelivers anything unacked for 2 s
    worker = CeleryWorker(redis_url, visibility_s=2).start()
    chronoq = Chronoq(
        tmp_path / "data", redis_url, visibility_s=2, publish_script=publish_script
    ).start()
    try:
        # When the same delay (3 s > 2 s) goes through chronoq and through Celery's ETA
        receipt = chronoq.handle("t.record").schedule("chronoq", delay=3.0)
        eta = chronoq.celery.send_task("t.plain", ["eta"], countdown=3)
        wait_for(
            "the chronoq job", lambda: _view_state(chronoq, receipt.msg_id) is MessageState.DONE
        )
        # Then Celery's ETA copy, held unacked past the timeout, runs twice ...
        wait_for("the ETA task's second run", lambda: len(runs(redis_url, "t.plain")) >= 2)
        assert {r["task_id"] for r in runs(redis_url, "t.plain")} == {eta.id}
        # ... while chronoq's, published only when due and acked at once, ran once,
        # and nothing of it is left unacked for a later restore
        assert [r["task_id"] for r in runs(redis_url, "t.record")] == [receipt.msg_id]
        client = redis.Redis.from_url(redis_url)
        unacked = [v for v in client.hvals("unacked") if receipt.msg_id.encode() in v]
        client.close()
        assert unacked == []
    finally:
        chronoq.close()
        worker.stop()


@BOTH_PUBLISH_PATHS_SLOW_GENERAL
def test_celery_broker_down_then_back_nothing_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, publish_script: bool
) -> None:
    # Given a Celery broker of our own (AOF on) with a worker and a dispatcher
    server = RedisServer(tmp_path / "redis", aof=True).start()
    worker = CeleryWorker(server.url).start()
    chronoq = Chronoq(tmp_path / "data", server.url, publish_script=publish_script).start()
    caplog.set_level(logging.WARNING, logger="chronoq.workers.CeleryExecutor")
    try:
        # When the broker is down at the job's fire time
        server.stop()
        receipt = chronoq.handle("t.quick").schedule("outage", delay=0.2)

        def logged() -> bool:
            return any("unreachable" in r.getMessage() and receipt.msg_id in r.getMessage()
                       for r in caplog.records)  # fmt: skip

        wait_for("a failed publish logged", logged)
        wait_for("the message released for a retry",
                 lambda: _view_state(chronoq, receipt.msg_id) is MessageState.PENDING)  # fmt: skip
        view = chronoq.scheduler.broker.query(receipt.msg_id)
        assert view is not None and view.attempts == 0  # the outage counts no attempt
        # Then once it is back, the job runs, once, under its message id
        server.start()
        wait_for("DONE", lambda: _view_state(chronoq, receipt.msg_id) is MessageState.DONE, 90)
        assert [r["task_id"] for r in runs(server.url, "t.quick")] == [receipt.msg_id]
    finally:
        chronoq.close()
        worker.stop()
        server.stop()


def test_worker_killed_mid_task_runs_again_with_the_same_id(tmp_path: Path, redis_url: str) -> None:
    # Given a job running on worker 1 (acks_late: its message is unacked while it runs)
    first = CeleryWorker(redis_url, visibility_s=2).start()
    chronoq = Chronoq(tmp_path / "data", redis_url, visibility_s=2).start()
    second: CeleryWorker | None = None
    try:
        receipt = chronoq.handle("t.slow").schedule("k")
        wait_for("the first run", lambda: runs(redis_url, "t.slow"))
        # When worker 1 is killed mid-task and worker 2 starts
        first.kill()
        second = CeleryWorker(redis_url, visibility_s=2).start()
        wait_for("the second run", lambda: len(runs(redis_url, "t.slow")) >= 2)
        client = redis.Redis.from_url(redis_url)
        client.set(jobs.RELEASE, 1)
        client.close()
        # Then Celery ran it again under the same id, and chronoq saw one delivery
        wait_for("DONE", lambda: _view_state(chronoq, receipt.msg_id) is MessageState.DONE)
        recs = runs(redis_url, "t.slow")
        assert [r["task_id"] for r in recs] == [receipt.msg_id, receipt.msg_id]
        assert [r["pid"] for r in recs] == [first.pid, second.pid]
        view = chronoq.scheduler.broker.query(receipt.msg_id)
        assert view is not None and view.attempts == 1
    finally:
        chronoq.close()
        first.stop()
        if second is not None:
            second.stop()
