"""CeleryExecutor end to end: chronoq fires, a real Celery worker subprocess runs,
the outcome comes back to ``query(msg_id)``.

Given a redis-server, a worker and a dispatcher; when a job is scheduled; then
the worker runs it under ``task_id == msg_id`` and the chronoq message settles
as the task ended.
"""

from __future__ import annotations

import pytest

from broker_adapter import AbortStatus, MessageState
from tests.celery import jobs
from tests.celery.conftest import CeleryWorker, Chronoq, runs, wait_for
from workers.celery import schedule_task, task_job

pytestmark = pytest.mark.external_service


def _state(chronoq: Chronoq, msg_id: str, *states: MessageState) -> bool:
    view = chronoq.scheduler.broker.query(msg_id)
    return view is not None and view.state in states


def test_job_fires_on_the_worker_and_query_says_done(
    chronoq: Chronoq, worker: CeleryWorker, redis_url: str
) -> None:
    receipt = chronoq.handle("t.record").schedule("a", delay=0.3)
    wait_for("DONE", lambda: _state(chronoq, receipt.msg_id, MessageState.DONE))
    [rec] = runs(redis_url)
    assert rec["task_id"] == receipt.msg_id  # idempotency key: task id == message id
    assert rec["pid"] == worker.pid  # ran in the worker process, not here
    assert rec["due_ms"] == receipt.deliver_at_ms
    result = chronoq.celery.AsyncResult(receipt.msg_id)
    assert result.state == "SUCCESS" and result.result == "A"


def test_cancel_before_fire_means_the_task_never_runs(
    chronoq: Chronoq, worker: CeleryWorker, redis_url: str
) -> None:
    record = chronoq.handle("t.record")
    cancelled = record.schedule("cancelled", delay=1.0, key="order:1")
    kept = record.schedule("kept", delay=1.2, key="order:2")
    assert record.cancel(key="order:1") is AbortStatus.ABORTED
    wait_for("the kept job", lambda: _state(chronoq, kept.msg_id, MessageState.DONE))
    assert [r["tag"] for r in runs(redis_url)] == ["kept"]
    assert _state(chronoq, cancelled.msg_id, MessageState.ABORTED)
    assert chronoq.celery.AsyncResult(cancelled.msg_id).state == "PENDING"  # never published


def test_failure_is_retried_by_chronoq_under_the_same_task_id(
    chronoq: Chronoq, worker: CeleryWorker, redis_url: str
) -> None:
    receipt = chronoq.handle("t.flaky").schedule("f")
    wait_for("DONE after a retry", lambda: _state(chronoq, receipt.msg_id, MessageState.DONE))
    recs = runs(redis_url, "t.flaky")
    assert [r["attempt"] for r in recs] == [1, 2]  # chronoq's retry, not Celery's
    assert {r["task_id"] for r in recs} == {receipt.msg_id}
    view = chronoq.scheduler.broker.query(receipt.msg_id)
    assert view is not None and view.attempts == 2


def test_last_failure_dead_letters_with_the_task_error(
    chronoq: Chronoq, worker: CeleryWorker, redis_url: str
) -> None:
    receipt = chronoq.handle("t.broken").schedule("b")
    wait_for("DEAD", lambda: _state(chronoq, receipt.msg_id, MessageState.DEAD))
    view = chronoq.scheduler.broker.query(receipt.msg_id)
    assert view is not None and view.error is not None
    assert "ValueError: b is broken" in view.error
    assert len(runs(redis_url, "t.broken")) == 1  # max_attempts=1: no retry anywhere


def test_schedule_task_sends_an_existing_celery_task_later(
    chronoq: Chronoq, worker: CeleryWorker, redis_url: str
) -> None:
    receipt = schedule_task(
        jobs.plain, ("p",), countdown=0.3, key="receipt:1", scheduler=chronoq.scheduler
    )
    again = schedule_task(
        jobs.plain, ("p",), countdown=5, key="receipt:1", scheduler=chronoq.scheduler
    )
    assert again.duplicate and again.msg_id == receipt.msg_id  # keyed: idempotent
    wait_for("DONE", lambda: _state(chronoq, receipt.msg_id, MessageState.DONE))
    [rec] = runs(redis_url, "t.plain")
    assert rec["task_id"] == receipt.msg_id and rec["pid"] == worker.pid
    assert task_job(chronoq.scheduler, jobs.plain).spec.executor == "celery"
