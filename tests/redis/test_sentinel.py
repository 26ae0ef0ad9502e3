"""``redis+sentinel://``: the broker reaches the master that Redis Sentinel names,
and follows it to the promoted replica after a failover."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker_adapter import open_broker
from broker_adapter.clock import ManualClock
from broker_adapter.errors import InvalidArgument
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.connect import open_client
from tests.conftest import START_MS
from tests.helpers import eventually, pull_until
from tests.redis_server import RedisSentinelProcs

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(120)]


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[RedisSentinelProcs]:
    procs = RedisSentinelProcs(tmp_path / "sentinel")
    try:
        yield procs.start()
    finally:
        procs.stop()


def test_sentinel_urls_reach_the_master_and_follow_a_failover(
    sentinel: RedisSentinelProcs,
) -> None:
    clock = ManualClock(START_MS)
    broker = open_broker(sentinel.url + "?retention_ms=600000", clock=clock)
    assert isinstance(broker, RedisBroker)  # open_broker knows the scheme
    with broker:
        c = broker.consumer("g", ["t"])
        first = broker.send(Message("t", b"before", delay_ms=1_000))
        master = redis.Redis(host="127.0.0.1", port=sentinel.master.port)
        try:
            assert master.hexists(f"{broker.keyspace.bases[0]}p:0", first.msg_id.split("-")[1])
            master.execute_command("WAIT", 1, 5_000)  # the replica has it
        finally:
            master.close()
        # When: the master dies; the sentinel promotes the replica
        sentinel.master.kill()

        def send_again() -> bool:
            try:
                return broker.send(Message("t", b"after", delay_ms=1_000)).status.name == "OK"
            except Exception:  # noqa: BLE001 - ConnectionFailed until the promotion
                return False

        eventually(send_again, timeout=60, what="a send after the failover")
        # Then: both messages fire from the new master
        clock.advance(1_000)
        got = pull_until(c, 2, timeout=30)
        assert sorted(m.body for m in got) == [b"after", b"before"]


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel:///svc",
        "redis+sentinel://h:x/svc",
        "redis+sentinel://h:1/svc/x",
    ],
)
def test_malformed_sentinel_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_client(url)
