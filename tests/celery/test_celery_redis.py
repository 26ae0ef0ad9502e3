"""Celery's Redis transport and result backend as chronoq's apps use them
(:mod:`workers.celery.redis_transport`, :mod:`workers.celery.redis_backend`), on the session's real redis-server. The transport
keeps kombu's unacked bookkeeping as it is and makes one client per connection
pool instead of one per call; the backend stores and publishes a result in one
round trip and, like Celery's, never overwrites a ``SUCCESS``. The suites that run
real workers run both end to end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.exceptions import BackendStoreError
from kombu import Connection, Queue

from scheduler.scheduler import Scheduler
from workers.celery import celery_app_for
from workers.celery.redis_backend import RedisResultBackend
from workers.celery.redis_transport import TRANSPORT_PATH, RedisChannel, RedisTransport
from workers.celery.results import sent_meta


@pytest.fixture
def connection(redis_url: str) -> Iterator[Any]:
    conn = Connection(redis_url, transport=TRANSPORT_PATH)
    try:
        yield conn
    finally:
        conn.release()


def test_apps_for_redis_urls_use_both_and_others_keep_their_own(tmp_path: Path) -> None:
    scheduler = Scheduler(f"rocksdb://{tmp_path / 'data'}")
    for url in ("redis://127.0.0.1:1/3", "rediss://127.0.0.1:1/3?ssl_cert_reqs=none"):
        app = celery_app_for(scheduler, url)
        assert app.conf.broker_transport == TRANSPORT_PATH
        assert isinstance(_transport(app), RedisTransport)
        assert isinstance(app.backend, RedisResultBackend)
        kwargs = app.backend.connparams
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("127.0.0.1", 1, 3)
    other = celery_app_for(scheduler, "memory://", result_backend="cache+memory://")
    assert other.conf.broker_transport is None
    assert not isinstance(other.backend, RedisResultBackend)
    chosen = celery_app_for(scheduler, "redis://127.0.0.1:1/0", broker_transport="redis")
    assert not isinstance(_transport(chosen), RedisTransport)


def _transport(app: Any) -> Any:
    conn = app.connection_for_write()  # nothing connects until used
    try:
        return conn.transport
    finally:
        conn.release()


def test_a_channel_makes_one_client_per_pool(connection: Any) -> None:
    channel = connection.default_channel
    assert isinstance(channel, RedisChannel)
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
        assert first.connection_pool is channel.pool
    given = object()
    with channel.conn_or_acquire(given) as client:
        assert client is given
    channel._pool = None  # what kombu does after a disconnect
    with channel.conn_or_acquire() as renewed:
        assert renewed is not first
        assert renewed.connection_pool is channel.pool


def test_delivery_ack_and_unacked_restore_work_as_kombu_s(redis_url: str, connection: Any) -> None:
    queue = Queue("chronoq.transport-test")
    raw = redis.Redis.from_url(redis_url)
    try:
        with connection.Producer() as producer:
            for body in ("a", "b"):
                producer.publish({"n": body}, routing_key=queue.name, declare=[queue])
        consumer_channel = connection.channel()
        bound = queue(consumer_channel)
        first = bound.get(no_ack=False)
        second = bound.get(no_ack=False)
        assert [first.payload, second.payload] == [{"n": "a"}, {"n": "b"}]
        # Both wait in kombu's unacked hash until acked (what redelivery rests on).
        assert raw.hlen("unacked") == 2 and raw.zcard("unacked_index") == 2
        first.ack()
        assert raw.hlen("unacked") == 1
        # Closing the channel with a message unacked puts it back on the queue.
        consumer_channel.close()
        assert raw.hlen("unacked") == 0
        again = queue(connection.channel()).get(no_ack=True)
        assert again is not None and again.payload == {"n": "b"}
    finally:
        raw.close()


@pytest.fixture
def backend(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    app = celery_app_for(
        Scheduler(f"rocksdb://{tmp_path / 'data'}"),
        redis_url,
        result_expires=600,
        result_failure_expires=60,
    )
    try:
        yield app.backend
    finally:
        app.close()


def _stored(backend: Any, task_id: str) -> tuple[dict[str, Any], int]:
    key = backend.get_key_for_task(task_id)
    return backend.decode(backend.client.get(key)), int(backend.client.ttl(key))


def _next_message(listener: Any, timeout_s: float) -> dict[str, Any] | None:
    """The next published message (subscribe confirmations skipped), or ``None``."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        message = listener.get_message(timeout=left)
        if message is not None:
            return dict(message)
    return None


def test_a_result_is_stored_with_its_expiry_and_published(backend: Any) -> None:
    listener = backend.client.pubsub(ignore_subscribe_messages=True)
    try:
        listener.subscribe(backend.get_key_for_task("t1"))
        backend.client.set(backend.get_key_for_task("t1"), backend.encode(sent_meta("t1")))
        backend.mark_as_done("t1", {"n": 1})
        meta, ttl = _stored(backend, "t1")
        assert (meta["status"], meta["result"], meta["task_id"]) == ("SUCCESS", {"n": 1}, "t1")
        assert 590 <= ttl <= 600
        message = _next_message(listener, 5.0)
        assert message is not None
        assert backend.decode(message["data"])["status"] == "SUCCESS"
        assert backend.get_task_meta("t1")["result"] == {"n": 1}
    finally:
        listener.close()


def test_a_failure_keeps_result_failure_expires(backend: Any) -> None:
    backend.mark_as_failure("t2", ValueError("bad input"))
    meta, ttl = _stored(backend, "t2")
    assert meta["status"] == "FAILURE" and "bad input" in str(meta["result"])
    assert 50 <= ttl <= 60


def test_a_success_is_never_overwritten(backend: Any) -> None:
    """Celery's rule (a lost worker's late failure must not hide the success), kept
    atomically: nothing is written or published over it."""
    backend.mark_as_done("t3", 1)
    listener = backend.client.pubsub(ignore_subscribe_messages=True)
    try:
        listener.subscribe(backend.get_key_for_task("t3"))
        backend.mark_as_failure("t3", RuntimeError("late duplicate"))
        backend.mark_as_done("t3", 2)
        assert _stored(backend, "t3")[0]["result"] == 1
        assert _next_message(listener, 1.0) is None
    finally:
        listener.close()


def test_an_oversized_result_is_refused_and_nothing_is_stored(backend: Any) -> None:
    backend._MAX_STR_VALUE_SIZE = 100
    with pytest.raises(BackendStoreError, match="too large"):
        backend.mark_as_done("t4", "x" * 200)
    assert backend.client.get(backend.get_key_for_task("t4")) is None


def test_another_serializer_takes_celery_s_own_path(tmp_path: Path, redis_url: str) -> None:
    app = celery_app_for(
        Scheduler(f"rocksdb://{tmp_path / 'data'}"),
        redis_url,
        result_serializer="pickle",
        result_accept_content=["pickle", "json"],
    )
    try:
        app.backend.mark_as_done("t5", {"n": 5})
        app.backend.mark_as_failure("t5", RuntimeError("late"))  # SUCCESS kept here too
        assert app.backend.get_task_meta("t5")["result"] == {"n": 5}
    finally:
        app.close()
