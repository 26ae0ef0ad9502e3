"""Fixtures shared by every suite: a fresh data directory, a manual clock, and a real
redis-server for the session."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker_adapter.clock import ManualClock
from tests.redis_server import RedisServer

#: Where every ManualClock in the tests starts (2023-11-14T22:13:20Z).
START_MS = 1_700_000_000_000


@pytest.fixture(scope="module", autouse=True)
def _module_garbage_collected() -> Iterator[None]:
    """Collect a module's garbage when it ends: a socket or file it left unclosed
    then fails its own last test (``ResourceWarning`` is an error here) instead of
    whichever later test happens to run a collection."""
    yield
    gc.collect()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty directory for one broker's RocksDB data (not created yet)."""
    return tmp_path / "chronoq-data"


@pytest.fixture
def manual_clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock(START_MS)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real ``redis-server`` for the session on a free 127.0.0.1 port (skips when
    it is not installed, fails on ``CI=true``)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL, flushed before and after the test."""
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    client.flushall()
    try:
        yield redis_server.url
    finally:
        client.flushall()
        client.close()
