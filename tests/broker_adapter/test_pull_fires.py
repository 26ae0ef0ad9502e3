"""Embedded broker: a waiting pull fires the next due chunk itself (issue 16).

With the system clock, a pull that would wait past the wheel's next due time takes
the duty to fire it (``BrokerCore.take_fire_duty``): the wheel thread then plans to
wake ``FIRE_DUTY_GRACE_MS`` later. With a manual clock the wheel thread fires, as
tests that move the clock expect.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.embedded.core import FIRE_DUTY_GRACE_MS
from broker_adapter.errors import BrokerClosed
from broker_adapter.message import Message
from broker_adapter.results import MessageState, ReceivedMessage
from broker_adapter.timer_slack import tighten
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def wall_broker(data_dir: Path) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(str(data_dir))  # the system clock
    try:
        yield b
    finally:
        b.close()


def test_a_waiting_pull_takes_the_duty_and_gets_its_message(wall_broker: EmbeddedBroker) -> None:
    consumer = wall_broker.consumer("g", ["t"])
    due = int(time.time() * 1000) + 1500
    sent = wall_broker.send(Message(topic="t", body=b"x", deliver_at_ms=due))
    got: list[ReceivedMessage] = []
    puller = threading.Thread(target=lambda: got.extend(consumer.pull(10, wait_ms=10_000)))
    puller.start()
    core = wall_broker.core
    # The pull waits for the due time itself: the wheel thread is to wake after it.
    eventually(lambda: core.wheel_wake_ms(due) == due + FIRE_DUTY_GRACE_MS, timeout=5)
    puller.join(15)
    assert [m.msg_id for m in got] == [sent.msg_id]
    assert got[0].deliver_at_ms == due
    assert consumer.ack(got[0])


def test_a_pull_that_ends_first_leaves_the_firing_to_the_wheel(
    wall_broker: EmbeddedBroker,
) -> None:
    consumer = wall_broker.consumer("g", ["t"])
    due = int(time.time() * 1000) + 600
    sent = wall_broker.send(Message(topic="t", body=b"x", deliver_at_ms=due))
    assert consumer.pull(10, wait_ms=100) == []  # ends before the due time: no duty
    assert wall_broker.core.wheel_wake_ms(due) == due

    # No pull waits now: the wheel thread fires it on time; a later pull finds it ready.
    def ready() -> bool:
        view = wall_broker.query(sent.msg_id)
        return view is not None and view.state is MessageState.READY

    eventually(ready, timeout=5)
    (m,) = consumer.pull(10, wait_ms=1000)
    assert m.msg_id == sent.msg_id


def test_with_a_manual_clock_the_wheel_thread_fires(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    broker = EmbeddedBroker(str(data_dir), clock=manual_clock)
    try:
        consumer = broker.consumer("g", ["t"])
        due = manual_clock.now_ms() + 60_000
        sent = broker.send(Message(topic="t", body=b"x", deliver_at_ms=due))
        got: list[ReceivedMessage] = []
        puller = threading.Thread(target=lambda: got.extend(consumer.pull(10, wait_ms=3000)))
        puller.start()
        time.sleep(0.2)
        assert broker.core.wheel_wake_ms(due) == due  # the pull took no duty
        manual_clock.advance(60_000)  # the wheel thread wakes on the move and fires
        puller.join(10)
        assert [m.msg_id for m in got] == [sent.msg_id]
    finally:
        broker.close()


def _prctl(option: int, value: int = 0) -> int:
    return int(ctypes.CDLL(None).prctl(option, value, 0, 0, 0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl timer slack is Linux's")
def test_a_pull_that_fires_tightens_its_threads_timer_slack(wall_broker: EmbeddedBroker) -> None:
    consumer = wall_broker.consumer("g", ["t"])
    due = int(time.time() * 1000) + 300
    wall_broker.send(Message(topic="t", body=b"x", deliver_at_ms=due))
    seen: list[tuple[int, int, int]] = []

    def pull() -> None:
        _prctl(29, 50_000)  # PR_SET_TIMERSLACK: Linux's default, whatever was inherited
        before = _prctl(30)  # PR_GET_TIMERSLACK
        got = consumer.pull(10, wait_ms=5000)
        seen.append((before, len(got), _prctl(30)))

    puller = threading.Thread(target=pull)
    puller.start()
    puller.join(10)
    assert seen == [(50_000, 1, 1)]  # it waited for the due time at 1 ns slack
    checker: list[tuple[bool, int]] = []

    def check() -> None:
        _prctl(29, 50_000)
        checker.append((tighten(), _prctl(30)))

    t = threading.Thread(target=check)
    t.start()
    t.join(10)
    assert checker == [(True, 1)]


def test_closing_the_broker_ends_a_pull_waiting_to_fire(data_dir: Path) -> None:
    broker = EmbeddedBroker(str(data_dir))
    consumer = broker.consumer("g", ["t"])
    due = int(time.time() * 1000) + 3000
    broker.send(Message(topic="t", body=b"x", deliver_at_ms=due))
    errors: list[BaseException] = []

    def pull() -> None:
        try:
            consumer.pull(10, wait_ms=20_000)
        except BrokerClosed as e:
            errors.append(e)

    puller = threading.Thread(target=pull)
    puller.start()
    eventually(lambda: broker.core.wheel_wake_ms(due) == due + FIRE_DUTY_GRACE_MS, timeout=5)
    broker.close()
    puller.join(10)
    assert not puller.is_alive()
    assert len(errors) == 1
