"""What only the memory broker has: named sharing in one process, firing with no
thread, URL parameters, retention on a manual clock. The contract itself is
``tests/conformance/`` (the ``memory`` param)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from broker_adapter import open_broker
from broker_adapter.clock import ManualClock, SystemClock
from broker_adapter.errors import InvalidArgument
from broker_adapter.memory import SHARED, MemoryBroker
from broker_adapter.message import Message
from broker_adapter.results import MessageState, SendStatus
from tests.helpers import pull_one


@pytest.fixture
def name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A broker name of this test's own; no broker of it is left open afterwards."""
    yield f"test-{request.node.name}"
    assert f"test-{request.node.name}" not in SHARED.names()


def test_open_broker_serves_memory_urls(manual_clock: ManualClock) -> None:
    with open_broker("memory://", clock=manual_clock) as broker:
        assert isinstance(broker, MemoryBroker) and broker.name is None


def test_two_opens_of_one_name_share_one_broker(name: str, manual_clock: ManualClock) -> None:
    app = open_broker(f"memory://{name}", clock=manual_clock)
    test = open_broker(f"memory://{name}")  # no clock: shares the open broker's
    r = app.send(Message("t", b"x", key="k", delay_ms=1_000))
    assert test.query(r.msg_id) is not None
    assert test.send(Message("t", b"y", key="k")).status is SendStatus.DUPLICATE
    manual_clock.advance(1_000)
    with test.consumer("g", ["t"]) as c:
        assert pull_one(c).msg_id == r.msg_id
    app.close()
    assert test.query(r.msg_id) is not None  # one handle closed: the data stays
    test.close()


def test_the_last_close_drops_a_named_broker(name: str, manual_clock: ManualClock) -> None:
    first = MemoryBroker(name, clock=manual_clock)
    r = first.send(Message("t", b"x", delay_ms=1_000))
    first.close()
    with MemoryBroker(name, clock=manual_clock) as again:
        assert again.query(r.msg_id) is None and again.pending() == []


def test_private_brokers_share_nothing(manual_clock: ManualClock) -> None:
    with MemoryBroker(clock=manual_clock) as a, MemoryBroker(clock=manual_clock) as b:
        r = a.send(Message("t", b"x", key="k", delay_ms=1_000))
        assert b.query(r.msg_id) is None
        assert b.send(Message("t", b"x", key="k", delay_ms=1_000)).status is SendStatus.OK


def test_a_second_open_with_another_clock_or_setting_is_refused(
    name: str, manual_clock: ManualClock
) -> None:
    with MemoryBroker(name, clock=manual_clock, retention_ms=60_000) as broker:
        with pytest.raises(InvalidArgument, match="another clock"):
            MemoryBroker(name, clock=ManualClock())
        with pytest.raises(InvalidArgument, match="retention_ms=60000"):
            open_broker(f"memory://{name}?retention_ms=1000")
        with MemoryBroker(name, retention_ms=60_000) as same:
            assert same.clock is manual_clock
        assert broker.stats().pending == 0  # refused opens took no handle


@pytest.mark.parametrize(
    "url", ["memory://?retention=5", "memory://x?retention_ms=soon", "memory://?max_delay_ms=0"]
)
def test_bad_url_parameters_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_broker(url)


def test_url_parameters_become_settings() -> None:
    with open_broker("memory://?max_body_bytes=10") as broker:
        assert isinstance(broker, MemoryBroker) and broker.max_body_bytes == 10


def test_a_manual_clock_advance_fires_at_once_with_no_thread(manual_clock: ManualClock) -> None:
    threads = threading.active_count()
    with MemoryBroker(clock=manual_clock) as broker:
        r = broker.send(Message("t", b"x", delay_ms=5_000))
        assert threading.active_count() == threads
        manual_clock.advance(5_000)
        view = broker.query(r.msg_id)
        assert view is not None and view.state is MessageState.READY


def test_on_the_system_clock_a_waiting_pull_gets_the_message_when_due() -> None:
    with MemoryBroker(clock=SystemClock()) as broker:
        c = broker.consumer("g", ["t"])
        r = broker.send(Message("t", b"x", delay_ms=50))
        got = c.pull(max_messages=1, wait_ms=10_000)  # nobody advances anything
        assert [m.msg_id for m in got] == [r.msg_id]


def test_retention_forgets_fired_messages_and_their_keys(manual_clock: ManualClock) -> None:
    with MemoryBroker(clock=manual_clock, retention_ms=60_000) as broker:
        c = broker.consumer("g", ["t"])
        due = manual_clock.now_ms() + 1_000
        r = broker.send(Message("t", b"x", key="cron:a:1", deliver_at_ms=due))
        manual_clock.advance(1_000)
        assert c.ack(pull_one(c))
        manual_clock.advance(59_999)
        assert broker.query(r.msg_id) is not None  # not yet past retention
        again = broker.send(Message("t", b"x", key="cron:a:1", deliver_at_ms=due))
        assert again.status is SendStatus.DUPLICATE
        manual_clock.advance(1)
        assert broker.query(r.msg_id) is None
        assert broker.send(Message("t", b"x", key="cron:a:1", deliver_at_ms=due)).status is (
            SendStatus.OK
        )


def test_retention_keeps_what_a_group_has_not_read(manual_clock: ManualClock) -> None:
    with MemoryBroker(clock=manual_clock, retention_ms=60_000) as broker:
        c = broker.consumer("g", ["t"])
        r = broker.send(Message("t", b"x"))
        manual_clock.advance(10 * 60_000)
        assert broker.query(r.msg_id) is not None
        assert pull_one(c).msg_id == r.msg_id


def test_body_reads_a_known_message(manual_clock: ManualClock) -> None:
    with MemoryBroker(clock=manual_clock) as broker:
        r = broker.send(Message("t", b"payload", delay_ms=1_000))
        assert (broker.body(r.msg_id), broker.body("nope")) == (b"payload", None)
