"""At connect, the Redis adapters say once per server whether a crash of that Redis
loses acknowledged sends (``broker_adapter/redis/persistence.py``), against real
``redis-server`` processes started with each persistence setting.

The kill -9 durability test with ``appendfsync always`` (a thread sending keyed
messages, Redis killed mid-load and restarted, 0 acknowledged sends lost) is
``tests/redis/test_aof_restart.py``; the ``everysec`` loss is measured by
``bench/redis_fsync_loss.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.redis import RedisBroker
from broker_adapter.redis.async_broker import AsyncRedisBroker
from broker_adapter.redis.persistence import Persistence, assess, forget_checked
from tests.redis_server import RedisClusterProcs, RedisSentinelProcs, RedisServer

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(120)]

LOGGER = "chronoq.broker_adapter.RedisBroker"


@pytest.fixture(autouse=True)
def fresh_checks() -> Iterator[None]:
    """Each test sees its servers checked for the first time in this process."""
    forget_checked()
    yield
    forget_checked()


def persistence_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and "Redis " in r.getMessage()]


def open_and_close(url: str) -> None:
    RedisBroker.from_url(url + "?fire=0").close()


def test_no_persistence_warns_once_per_server_naming_the_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given: a Redis without AOF and without snapshots
    server = RedisServer(tmp_path / "r", appendfsync=None, save="").start()
    try:
        caplog.set_level(logging.DEBUG, logger=LOGGER)
        # When: two brokers connect to it in this process
        open_and_close(server.url)
        open_and_close(server.url)
        # Then: one WARNING names the server, the risk and the fix
        lines = persistence_lines(caplog)
        assert len(lines) == 1, [r.getMessage() for r in lines]
        text = lines[0].getMessage()
        assert lines[0].levelno == logging.WARNING
        assert f"127.0.0.1:{server.port}" in text
        assert "no persistence" in text and "appendonly yes" in text
        assert "appendfsync always" in text
    finally:
        server.stop()


def test_snapshots_only_warn_that_a_crash_loses_sends_since_the_last_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "r", save="3600 1").start()
    try:
        caplog.set_level(logging.DEBUG, logger=LOGGER)
        open_and_close(server.url)
        [line] = persistence_lines(caplog)
        assert line.levelno == logging.WARNING
        assert "only RDB snapshots" in line.getMessage()
    finally:
        server.stop()


def test_aof_with_fsync_always_is_quiet_and_everysec_is_an_info_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    always = RedisServer(tmp_path / "always", appendfsync="always").start()
    everysec = RedisServer(tmp_path / "everysec", appendfsync="everysec").start()
    try:
        caplog.set_level(logging.INFO, logger=LOGGER)
        # When: brokers connect to each
        open_and_close(always.url)
        open_and_close(everysec.url)
        # Then: nothing about `always`; an INFO note (not a warning) about `everysec`
        lines = persistence_lines(caplog)
        assert not [r for r in lines if f":{always.port}" in r.getMessage()]
        [note] = [r for r in lines if f":{everysec.port}" in r.getMessage()]
        assert note.levelno == logging.INFO
        assert "everysec" in note.getMessage() and "1 s" in note.getMessage()
    finally:
        always.stop()
        everysec.stop()


def test_the_async_adapter_checks_at_its_first_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "r").start()

    async def connect() -> None:
        broker = AsyncRedisBroker.from_url(server.url)
        try:
            assert persistence_lines(caplog) == []  # nothing connects before the first call
            await broker.stats()
        finally:
            await broker.close()

    try:
        caplog.set_level(logging.INFO, logger=LOGGER)
        asyncio.run(connect())
        [line] = persistence_lines(caplog)
        assert line.levelno == logging.WARNING and f":{server.port}" in line.getMessage()
    finally:
        server.stop()


def test_every_cluster_master_is_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cluster = RedisClusterProcs(tmp_path / "cluster", masters=3).start()
    try:
        caplog.set_level(logging.INFO, logger=LOGGER)
        RedisBroker.from_url(cluster.url + "?fire=0").close()
        text = "\n".join(r.getMessage() for r in persistence_lines(caplog))
        for node in cluster.nodes:
            assert text.count(f"127.0.0.1:{node.port} runs with no persistence") == 1, text
    finally:
        cluster.stop()


def test_a_sentinel_master_is_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    procs = RedisSentinelProcs(tmp_path / "sentinel").start()
    try:
        caplog.set_level(logging.INFO, logger=LOGGER)
        RedisBroker.from_url(procs.url + "?fire=0").close()
        [line] = persistence_lines(caplog)
        assert line.levelno == logging.WARNING
        assert "Sentinel service 'chronoq'" in line.getMessage()
    finally:
        procs.stop()


@pytest.mark.parametrize(
    ("settings", "level"),
    [
        (Persistence(aof=True, appendfsync="always", snapshots=False), None),
        (Persistence(aof=True, appendfsync="everysec", snapshots=None), logging.INFO),
        (Persistence(aof=True, appendfsync=None, snapshots=None), logging.INFO),
        (Persistence(aof=True, appendfsync="no", snapshots=True), logging.WARNING),
        (Persistence(aof=False, appendfsync="always", snapshots=True), logging.WARNING),
        (Persistence(aof=False, appendfsync=None, snapshots=None), logging.WARNING),
    ],
)
def test_assess_levels(settings: Persistence, level: int | None) -> None:
    verdict = assess("h:1", settings)
    assert (verdict[0] if verdict else None) == level
