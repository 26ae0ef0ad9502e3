"""The dispatcher's slot is free once Celery accepted the publish; the chronoq
message waits in flight for the task's outcome and settles from it, also across
a dispatcher restart or crash (task id == message id keeps it one run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from broker_adapter import MessageState
from tests.celery import jobs
from tests.celery.conftest import (
    BOTH_PUBLISH_PATHS,
    BOTH_PUBLISH_PATHS_SLOW_GENERAL,
    ROOT,
    CeleryWorker,
    Chronoq,
    runs,
    wait_for,
)
from workers.celery import CeleryExecutor

pytestmark = pytest.mark.external_service


def _state(chronoq: Chronoq, msg_id: str) -> MessageState | None:
    view = chronoq.scheduler.broker.query(msg_id)
    return None if view is None else view.state


def _executor(chronoq: Chronoq) -> CeleryExecutor:
    """The running dispatcher's Celery executor."""
    assert chronoq.dispatcher is not None
    executor = chronoq.dispatcher.executors["celery"]
    assert isinstance(executor, CeleryExecutor)
    return executor


def _release_slow_jobs(url: str) -> None:
    client = redis.Redis.from_url(url)
    client.set(jobs.RELEASE, 1)
    client.close()


def _done_once_without_republishing(chronoq: Chronoq, redis_url: str, msg_id: str) -> None:
    """Let the waiting slow task finish; its message ends DONE after the one run
    it had, and this dispatcher published nothing (it waited for that run)."""
    _release_slow_jobs(redis_url)
    wait_for("DONE", lambda: _state(chronoq, msg_id) is MessageState.DONE)
    assert [r["task_id"] for r in runs(redis_url, "t.slow")] == [msg_id]
    assert _executor(chronoq).published == 0


def test_a_published_job_frees_its_slot_while_its_task_runs(tmp_path: Path, redis_url: str) -> None:
    # Given a dispatcher with two slots (max_workers=1, prefetch=1) and a roomy worker
    worker = CeleryWorker(redis_url, concurrency=6).start()
    chronoq = Chronoq(tmp_path / "data", redis_url, max_workers=1, prefetch=1).start()
    try:
        # When three slow tasks (more than the slots) and then a quick one are due
        slow = [chronoq.handle("t.slow").schedule(f"s{i}") for i in range(3)]
        quick = chronoq.handle("t.record").schedule("q", delay=0.2)
        # Then all four were published while the slow ones still run ...
        wait_for("three slow runs at once", lambda: len(runs(redis_url, "t.slow")) == 3)
        wait_for("the quick job DONE", lambda: _state(chronoq, quick.msg_id) is MessageState.DONE)
        # ... and each slow message waits in flight for its task's outcome
        assert {_state(chronoq, r.msg_id) for r in slow} == {MessageState.INFLIGHT}
        _release_slow_jobs(redis_url)
        for r in slow:
            wait_for("DONE", lambda r=r: _state(chronoq, r.msg_id) is MessageState.DONE)
        assert sorted(x["task_id"] for x in runs(redis_url, "t.slow")) == sorted(
            r.msg_id for r in slow
        )
    finally:
        chronoq.close()
        worker.stop()


def test_a_message_stays_invisible_while_its_task_runs_past_the_invisible_time(
    tmp_path: Path, redis_url: str, worker: CeleryWorker
) -> None:
    # Given a dispatcher whose messages are invisible for 1 s, and a task that runs longer
    chronoq = Chronoq(tmp_path / "data", redis_url, invisible_ms=1000).start()
    try:
        receipt = chronoq.handle("t.slow").schedule("long")
        wait_for("the run", lambda: runs(redis_url, "t.slow"))
        # When three invisible times pass while the outcome is awaited
        time.sleep(3)
        assert _state(chronoq, receipt.msg_id) is MessageState.INFLIGHT
        _release_slow_jobs(redis_url)
        # Then the dispatcher kept extending it: never redelivered, one attempt, DONE
        wait_for("DONE", lambda: _state(chronoq, receipt.msg_id) is MessageState.DONE)
        view = chronoq.scheduler.broker.query(receipt.msg_id)
        assert view is not None and view.attempts == 1
        assert [r["task_id"] for r in runs(redis_url, "t.slow")] == [receipt.msg_id]
    finally:
        chronoq.close()


@BOTH_PUBLISH_PATHS_SLOW_GENERAL
def test_a_dispatcher_restarted_mid_task_ends_done_exactly_once(
    tmp_path: Path, redis_url: str, publish_script: bool, worker: CeleryWorker
) -> None:
    # Given a slow task running on the worker, published by a first dispatcher
    first = Chronoq(tmp_path / "data", redis_url, publish_script=publish_script).start()
    receipt = first.handle("t.slow").schedule("r")
    wait_for("the run", lambda: runs(redis_url, "t.slow"))
    # When that dispatcher stops before the outcome (its message is released)
    first.close()
    second = Chronoq(tmp_path / "data", redis_url, publish_script=publish_script).start()
    try:
        # Then the next dispatcher finds the task SENT and waits instead of publishing
        assert second.dispatcher is not None
        wait_for("the redelivery", lambda: second.dispatcher is not None
                 and second.dispatcher.awaiting == 1)  # fmt: skip
        _done_once_without_republishing(second, redis_url, receipt.msg_id)
    finally:
        second.close()


@BOTH_PUBLISH_PATHS_SLOW_GENERAL
def test_a_task_still_queued_in_celery_is_not_published_again_after_a_restart(
    tmp_path: Path, redis_url: str, publish_script: bool
) -> None:
    # Given a job published while no Celery worker runs: queued in Celery, not started
    first = Chronoq(tmp_path / "data", redis_url, publish_script=publish_script).start()
    receipt = first.handle("t.record").schedule("queued")
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for("SENT stored", lambda: b'"SENT"' in (client.get(
            f"celery-task-meta-{receipt.msg_id}") or b""))  # fmt: skip
        # When that dispatcher stops before the outcome and another one takes over
        first.close()
        second = Chronoq(tmp_path / "data", redis_url, publish_script=publish_script).start()
        worker = None
        try:
            assert second.dispatcher is not None
            wait_for("the redelivery awaited", lambda: second.dispatcher is not None
                     and second.dispatcher.awaiting == 1)  # fmt: skip
            # Then it waits for the queued task instead of publishing it again ...
            executor = _executor(second)
            assert executor.published == 0
            assert client.llen("celery") == 1  # the one queued publish, no second
            # ... and once a worker runs it, the message is DONE after one run
            worker = CeleryWorker(redis_url).start()
            wait_for("DONE", lambda: _state(second, receipt.msg_id) is MessageState.DONE)
            assert [r["task_id"] for r in runs(redis_url, "t.record")] == [receipt.msg_id]
            assert executor.published == 0
        finally:
            second.close()
            if worker is not None:
                worker.stop()
    finally:
        client.close()


def test_sent_never_hides_a_state_the_worker_already_wrote(tmp_path: Path, redis_url: str) -> None:
    # Given a task the worker already finished before chronoq's SENT write arrives
    from workers.celery.results import SENT_STATE, ResultWatcher

    chronoq = Chronoq(tmp_path / "data", redis_url)
    app = chronoq.celery
    app.backend.store_result("done-first", 42, "SUCCESS")
    watcher = ResultWatcher(app)
    client = redis.Redis.from_url(redis_url)
    try:
        # When SENT is stored for it and for a task with no state yet
        assert watcher.mark_sent(["done-first", "fresh"]) is True
        # Then the finished one keeps SUCCESS; the fresh one is SENT, expiring like results
        assert app.backend.get_task_meta("done-first", cache=False)["status"] == "SUCCESS"
        assert app.backend.get_task_meta("fresh", cache=False)["status"] == SENT_STATE
        ttl_ms = client.pttl("celery-task-meta-fresh")
        assert 0 < ttl_ms <= app.conf.result_expires.total_seconds() * 1000
    finally:
        client.close()
        watcher.close()
        chronoq.close()


@BOTH_PUBLISH_PATHS
def test_a_dispatcher_killed_mid_task_ends_done_exactly_once(
    tmp_path: Path, redis_url: str, publish_script: bool, worker: CeleryWorker
) -> None:
    # Given a dispatcher process (embedded broker in it) whose slow task runs on the worker
    data = tmp_path / "data"
    env = dict(os.environ, CHRONOQ_CELERY_BROKER_URL=redis_url, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.celery.dispatcher_proc", str(data), redis_url,
         str(publish_script)],
        cwd=str(ROOT), env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        msg_id = proc.stdout.readline().strip()
        wait_for("the run", lambda: runs(redis_url, "t.slow"))
    finally:
        # When it is killed (SIGKILL: no drain, its message is still in flight)
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    chronoq = Chronoq(data, redis_url, publish_script=publish_script).start()
    try:
        # Then a new dispatcher on the same data re-reads the message, finds the task
        # running under the same id, waits for it, and settles the message DONE once
        _done_once_without_republishing(chronoq, redis_url, msg_id)
    finally:
        chronoq.close()


@BOTH_PUBLISH_PATHS
def test_the_dispatcher_warms_the_celery_executor_up_before_the_first_job(
    tmp_path: Path, redis_url: str, publish_script: bool, worker: CeleryWorker
) -> None:
    # Given a dispatcher that has opened, with no job due yet
    chronoq = Chronoq(tmp_path / "data", redis_url, publish_script=publish_script).start()
    try:
        executor = _executor(chronoq)

        # Then its publisher already holds a producer (the script's or kombu's batch's) ...
        def publisher() -> object:
            publisher = executor.publisher
            return publisher.script_publisher if publish_script else publisher.kombu_session

        opened = wait_for("the publisher warm", publisher)
        # ... and its result thread runs ...
        wait_for("the result thread", lambda: executor.watcher.is_running)
        assert executor.watcher.is_running and executor.published == 0
        # ... and the first job goes through that publisher, once
        receipt = chronoq.handle("t.record").schedule("first")
        wait_for("DONE", lambda: _state(chronoq, receipt.msg_id) is MessageState.DONE)
        assert executor.published == 1 and publisher() is opened
        assert [r["task_id"] for r in runs(redis_url, "t.record")] == [receipt.msg_id]
    finally:
        chronoq.close()
