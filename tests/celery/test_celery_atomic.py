"""The one-round-trip publish path (:mod:`workers.celery.atomic`) on the
session's real redis-server: the message it pushes is kombu's, it publishes only
what Celery does not have, stores ``SENT`` with it, and steps aside where it cannot
carry a message. The suites that run real workers run it end to end."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Exchange, Queue

from scheduler.scheduler import Scheduler
from tests.celery.conftest import Chronoq, wait_for
from workers.celery import RUN_TASK, CeleryExecutor, celery_app_for
from workers.celery.atomic import PUBLISHED, REPUBLISHED, AtomicPublisher, NotScriptable
from workers.celery.publish import PublishSession, publish
from workers.celery.results import SENT_STATE

#: The generic task's args (job name, its args, its kwargs) and kwargs.
ARGS = (["t.record", ["x", 1], {"k": None}], {})


@pytest.fixture
def app(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    celery = celery_app_for(Scheduler(f"rocksdb://{tmp_path / 'data'}"), redis_url)
    yield celery
    celery.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def atomic(app: Any) -> Iterator[AtomicPublisher]:
    opened = AtomicPublisher.open(app)
    assert opened is not None  # broker and backend: one Redis database
    yield opened
    opened.close()


def _envelope(raw: bytes) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(raw)
    message["properties"].pop("delivery_tag")  # a fresh uuid per publish
    return message


@pytest.mark.parametrize("options", [{}, {"priority": 5}], ids=["default", "priority-5"])
def test_it_pushes_what_kombu_pushes_to_the_same_list(
    app: Any, atomic: AtomicPublisher, client: redis.Redis, options: dict[str, Any]
) -> None:
    # Given one task published through kombu's batch and one through the script
    session = PublishSession(app, 10)
    try:
        publish(app, session.producer, RUN_TASK, *ARGS, "same-id", options)
        session.flush()
    finally:
        session.close()
    keys = client.keys("celery*")
    [key] = [k for k in keys if not k.startswith(b"celery-task-meta")]
    by_kombu = client.rpop(key)
    assert isinstance(by_kombu, bytes)
    atomic.add(RUN_TASK, *ARGS, "same-id", options)
    assert atomic.flush() == {"same-id": PUBLISHED}
    # Then the script pushed the same message (all but the delivery tag) to the same list
    by_script = client.rpop(key)
    assert isinstance(by_script, bytes)
    assert _envelope(by_script) == _envelope(by_kombu)
    assert (key == b"celery") is (not options)  # a priority has its own list, as in kombu


def test_it_publishes_what_celery_lacks_and_returns_what_it_has(
    app: Any, atomic: AtomicPublisher, client: redis.Redis
) -> None:
    # Given tasks Celery has in every kind of state, and one it has never seen
    backend = app.backend
    backend.store_result("ok", 42, "SUCCESS")
    backend.store_result("running", None, "STARTED")
    backend.store_result("failed", ValueError("boom"), "FAILURE")
    backend.store_result("pending", None, "PENDING")
    backend.mark_as_revoked("revoked")
    client.set("celery-task-meta-queued", json.dumps({"status": SENT_STATE}))
    ids = ["new", "ok", "running", "failed", "pending", "revoked", "queued"]
    # When all are published in one batch
    for task_id in ids:
        atomic.add(RUN_TASK, *ARGS, task_id, {})
    replies = atomic.flush()
    # Then the new, PENDING, FAILURE and REVOKED ones were pushed (the last two as a
    # retry over the old state), each with SENT stored, expiring like results ...
    assert {i: replies[i] for i in ("new", "pending")} == {"new": PUBLISHED, "pending": REPUBLISHED}
    assert replies["failed"] == REPUBLISHED and replies["revoked"] == REPUBLISHED
    pushed = [json.loads(m)["headers"]["id"] for m in client.lrange("celery", 0, -1)]
    assert sorted(pushed) == ["failed", "new", "pending", "revoked"]
    for task_id in pushed:
        assert backend.get_task_meta(task_id, cache=False)["status"] == SENT_STATE
        ttl_ms = client.pttl(f"celery-task-meta-{task_id}")
        assert 0 < ttl_ms <= app.conf.result_expires.total_seconds() * 1000
    # ... and the others were not pushed; their stored meta came back, untouched
    ok = replies["ok"]
    assert isinstance(ok, dict) and ok["status"] == "SUCCESS" and ok["result"] == 42
    assert isinstance(replies["running"], dict) and replies["running"]["status"] == "STARTED"
    assert isinstance(replies["queued"], dict) and replies["queued"]["status"] == SENT_STATE
    assert backend.get_task_meta("ok", cache=False)["status"] == "SUCCESS"
    assert backend.get_task_meta("running", cache=False)["status"] == "STARTED"


def test_an_unreadable_stored_state_is_never_published_over(
    atomic: AtomicPublisher, client: redis.Redis
) -> None:
    client.set("celery-task-meta-garbled", b"\x80not json")
    atomic.add(RUN_TASK, *ARGS, "garbled", {})
    assert atomic.flush() == {"garbled": None}
    assert client.llen("celery") == 0
    assert client.get("celery-task-meta-garbled") == b"\x80not json"


def test_a_named_exchange_is_not_scriptable_and_nothing_is_sent(
    app: Any, atomic: AtomicPublisher, client: redis.Redis
) -> None:
    app.conf.task_queues = [_topic_queue()]
    with pytest.raises(NotScriptable, match="exchange 'shop'"):
        atomic.add(RUN_TASK, *ARGS, "topical", {"queue": "orders"})
    atomic.discard()
    assert atomic.flush() == {}
    assert client.get("celery-task-meta-topical") is None
    assert client.llen("orders") == 0


def test_it_steps_aside_where_broker_and_backend_are_not_one_redis_database(
    tmp_path: Path, redis_url: str
) -> None:
    scheduler = Scheduler(f"rocksdb://{tmp_path / 'data'}")
    other_db = redis_url.rsplit("/", 1)[0] + "/1"
    apart = celery_app_for(scheduler, redis_url, result_backend=other_db)
    in_memory = Celery("m", broker="memory://", backend=redis_url, set_as_current=False)
    # A RedisBackend subclass that finds its server another way (no connection made)
    sentinel = celery_app_for(
        scheduler, redis_url, result_backend="sentinel://127.0.0.1:1/0;sentinel://127.0.0.1:2/0"
    )
    try:
        assert AtomicPublisher.open(apart) is None
        assert AtomicPublisher.open(in_memory) is None
        assert type(sentinel.backend).__name__ == "SentinelBackend"
        assert AtomicPublisher.open(sentinel) is None
    finally:
        for app in (apart, in_memory, sentinel):
            app.close()
        scheduler.close()


def test_the_executor_goes_back_to_kombu_for_a_route_the_script_cannot_carry(
    tmp_path: Path, redis_url: str, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job routed through a topic exchange (no worker: the task stays queued)
    chronoq = Chronoq(tmp_path / "data", redis_url)
    chronoq.celery.conf.task_queues = [Queue("celery"), _topic_queue()]

    @chronoq.scheduler.job(name="t.topical", executor="celery", queue="orders")
    def topical() -> None:
        """Never runs here."""

    caplog.set_level(logging.INFO, logger="chronoq.workers.CeleryExecutor")
    chronoq.start()
    try:
        # When it is due
        receipt = chronoq.handle("t.topical").schedule()
        # Then the executor published it through kombu's topic routing, once, and
        # keeps to that path from then on, saying so
        wait_for("the queued task", lambda: client.llen("orders") == 1)
        [raw] = client.lrange("orders", 0, -1)
        assert json.loads(raw)["headers"]["id"] == receipt.msg_id
        assert chronoq.dispatcher is not None
        executor = chronoq.dispatcher.executors["celery"]
        assert isinstance(executor, CeleryExecutor)
        assert executor.publisher.script_publisher is None
        assert executor.publisher.script_path_off
        assert any("through kombu from now on" in r.getMessage() for r in caplog.records)
        wait_for("SENT stored", lambda: b'"SENT"' in (client.get(
            f"celery-task-meta-{receipt.msg_id}") or b""))  # fmt: skip
    finally:
        chronoq.close()


def _topic_queue() -> Queue:
    return Queue("orders", Exchange("shop", type="topic"), routing_key="orders.close")


def test_the_executor_fails_a_run_whose_stored_state_it_cannot_read(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    # Given a job whose task id already holds an entry no Celery meta reads as
    chronoq = Chronoq(tmp_path / "data", redis_url).start()
    try:
        receipt = chronoq.handle("t.record").schedule("x", delay=1.0)
        client.set(f"celery-task-meta-{receipt.msg_id}", b"\x80garbled")

        # When it is due
        def failed_once() -> Any:
            view = chronoq.scheduler.broker.query(receipt.msg_id)
            return view is not None and view.error is not None and view

        view = wait_for("the failed attempt", failed_once)
        # Then that attempt failed, saying why (chronoq's retry policy takes it from
        # there), nothing was published, and the entry is left as it was
        assert "UNREADABLE" in view.error and view.attempts == 1
        assert client.llen("celery") == 0
        assert client.get(f"celery-task-meta-{receipt.msg_id}") == b"\x80garbled"
    finally:
        chronoq.close()
