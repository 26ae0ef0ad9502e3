"""kombu's Redis transport with one client per channel
(:mod:`workers.celery_transport`), on the session's real redis-server: the apps
chronoq makes use it, it keeps kombu's unacked bookkeeping as it is, and it makes
one client per connection pool instead of one per call. The suites that run real
workers run it end to end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Queue

from scheduler.scheduler import Scheduler
from workers.celery_app import celery_app_for
from workers.celery_transport import TRANSPORT_PATH, RedisChannel, RedisTransport


@pytest.fixture
def connection(redis_url: str) -> Iterator[Any]:
    conn = Connection(redis_url, transport=TRANSPORT_PATH)
    try:
        yield conn
    finally:
        conn.release()


def test_apps_for_redis_brokers_use_it_and_others_keep_their_own(tmp_path: Path) -> None:
    scheduler = Scheduler(f"rocksdb://{tmp_path / 'data'}")
    for url in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0"):
        app = celery_app_for(scheduler, url)
        assert app.conf.broker_transport == TRANSPORT_PATH
        assert isinstance(_transport(app), RedisTransport)
    assert celery_app_for(scheduler, "memory://").conf.broker_transport is None
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
