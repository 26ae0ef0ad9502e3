"""A pull that may wait takes the fire duty ahead (issue 16): the server's wheel thread
plans to wake past a due time a long-polling client will fire itself, and still fires
what no pull does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.embedded.core import FIRE_DUTY_GRACE_MS
from broker_adapter.message import Message
from broker_adapter.results import MessageState
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.handlers import FIRE_DUTY_AHEAD_MS
from broker_adapter.server.server import BrokerServer
from tests.helpers import eventually


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[BrokerServer]:
    """A server in this process (its core is inspected), on a free loopback port."""
    server = BrokerServer(tmp_path / "data", "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.shutdown(drain_s=0)


def _url(server: BrokerServer) -> str:
    return f"chronoq://127.0.0.1:{server.port}"


def test_a_waiting_pull_takes_the_fire_duty_ahead(inproc: BrokerServer) -> None:
    core = inproc.broker.core
    before = core.now()
    assert core.wheel_wake_ms(before) == before  # nobody promised to fire it
    with RemoteBroker.from_url(_url(inproc)) as broker:
        c = broker.consumer("g", ["t"])
        assert c.pull(1, wait_ms=20) == []  # waits on the server: nothing is due
    # The wheel thread would now wake past a due time within the horizon, not at it.
    assert core.wheel_wake_ms(before) == before + FIRE_DUTY_GRACE_MS
    assert FIRE_DUTY_AHEAD_MS <= FIRE_DUTY_GRACE_MS


def test_a_pull_that_does_not_wait_takes_no_duty(inproc: BrokerServer) -> None:
    core = inproc.broker.core
    with RemoteBroker.from_url(_url(inproc)) as broker:
        c = broker.consumer("g", ["t"])
        before = core.now()
        assert c.pull(1, wait_ms=0) == []  # a poll fires nothing: the wheel thread must
    assert core.wheel_wake_ms(before) == before


def test_what_no_pull_fires_the_wheel_thread_still_fires(inproc: BrokerServer) -> None:
    with RemoteBroker.from_url(_url(inproc)) as broker:
        c = broker.consumer("g", ["t"])
        assert c.pull(1, wait_ms=5) == []  # the duty is taken ahead ...
        sent = broker.send(Message("t", b"x", delay_ms=5))  # ... and nobody pulls again
        eventually(lambda: _state(broker, sent.msg_id) is MessageState.READY, timeout=5)
        got = c.pull(1, wait_ms=1000)
        assert [m.msg_id for m in got] == [sent.msg_id]


def test_a_returning_pull_fires_its_due_message_itself(inproc: BrokerServer) -> None:
    with RemoteBroker.from_url(_url(inproc)) as broker:
        c = broker.consumer("g", ["t"])
        assert c.pull(1, wait_ms=5) == []
        sent = broker.send(Message("t", b"x", delay_ms=30))
        got = c.pull(1, wait_ms=5000)  # waits, and fires the chunk at its due time
        assert [m.msg_id for m in got] == [sent.msg_id]
        assert got[0].attempts == 1


def _state(broker: RemoteBroker, msg_id: str) -> MessageState | None:
    view = broker.query(msg_id)
    return None if view is None else view.state
