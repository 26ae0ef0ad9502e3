"""The conformance factory of the Redis adapter: brokers on the session redis-server."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import redis

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import ManualClock


@dataclass
class RedisFactory:
    """RedisBrokers on one Redis URL; ``cleanup`` flushes it (data survives a close)."""

    url: str
    can_reopen: bool = True

    def open(self, clock: ManualClock) -> BrokerAdapter:
        from broker_adapter.redis import RedisBroker

        return RedisBroker.from_url(self.url, clock=clock)

    def cleanup(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.flushall()
        finally:
            client.close()


def make_redis(request: pytest.FixtureRequest) -> RedisFactory:
    """A factory on the session's redis-server, flushed first."""
    url: str = request.getfixturevalue("redis_url")
    return RedisFactory(url)
