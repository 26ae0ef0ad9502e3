"""Held fires (issue 16): a pull's fire writes to the store up to ``fire_hold_ms`` later.

Every reader must see such a fire as done: an abort, reschedule or prefix abort
answers "already delivered" for a message a pull has, a query shows it in flight,
a backup and a close have it fired; a write that carries counters writes the held
fires first; ``kill -9`` with fires held loses nothing (their entries are still on
the wheel on disk and fire again). The brokers here hold for a minute, so only
these rules can have written a fire; each test first checks that the fire it acts
on is held (``BrokerCore.held_fires``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.base import Consumer
from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.errors import InvalidArgument
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortStatus,
    MessageState,
    ReceivedMessage,
    RescheduleStatus,
)
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(60)

CHILD = Path(__file__).with_name("held_child.py")
HOLD_MS = 60_000


@pytest.fixture
def holding(data_dir: Path) -> Iterator[EmbeddedBroker]:
    """A broker on the system clock whose pulls hold their fires for a minute."""
    b = EmbeddedBroker(str(data_dir), fire_hold_ms=HOLD_MS)
    try:
        yield b
    finally:
        b.close()


def pull_held(broker: EmbeddedBroker, consumer: Consumer, key: str) -> ReceivedMessage:
    """Send a message due in 0.2 s and pull it: the waiting pull fires it and holds the
    write. Retried when the wheel thread happened to fire it first (it writes)."""
    for attempt in range(5):
        due = int(time.time() * 1000) + 200
        broker.send(Message(topic="t", body=b"x", key=f"{key}:{attempt}", deliver_at_ms=due))
        (m,) = consumer.pull(10, wait_ms=5000)
        if broker.core.held_fires:
            return m
        consumer.ack(m)
    raise AssertionError("no pull held its fire in 5 tries")


def test_an_abort_of_a_message_a_pull_has_answers_already_delivered(
    holding: EmbeddedBroker,
) -> None:
    consumer = holding.consumer("g", ["t"])
    m = pull_held(holding, consumer, "order")
    assert holding.abort(msg_id=m.msg_id).status is AbortStatus.ALREADY_DELIVERED
    assert holding.core.held_fires == 0, "the abort's read wrote the held fire first"
    # by key too (a second held fire)
    m2 = pull_held(holding, consumer, "order2")
    assert m2.key is not None
    result = holding.abort(key=m2.key, topic="t")
    assert (result.status, result.msg_id) == (AbortStatus.ALREADY_DELIVERED, m2.msg_id)
    assert consumer.ack(m) and consumer.ack(m2)


def test_reschedule_and_prefix_abort_of_a_held_fire_find_it_delivered(
    holding: EmbeddedBroker,
) -> None:
    consumer = holding.consumer("g", ["t"])
    m = pull_held(holding, consumer, "order")
    moved = holding.reschedule(msg_id=m.msg_id, delay_ms=60_000)
    assert moved.status is RescheduleStatus.ALREADY_DELIVERED
    m2 = pull_held(holding, consumer, "later")
    result = holding.abort_prefix("t", "later:")
    assert (result.aborted, result.already_delivered) == (0, (m2.key,))
    assert consumer.ack(m) and consumer.ack(m2)


def test_a_query_shows_a_held_fire_in_flight(holding: EmbeddedBroker) -> None:
    consumer = holding.consumer("g", ["t"])
    m = pull_held(holding, consumer, "order")
    view = holding.query(m.msg_id)
    assert view is not None and view.state is MessageState.INFLIGHT
    assert holding.stats().topics["t"].pending == 0
    assert holding.pending(topic="t") == []
    assert consumer.ack(m)
    view = holding.query(m.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_a_backup_has_the_held_fires(holding: EmbeddedBroker, tmp_path: Path) -> None:
    consumer = holding.consumer("g", ["t"])
    m = pull_held(holding, consumer, "order")
    holding.backup(tmp_path / "copy")
    # A manual clock stands still: nothing fires in the copy, what it has is the backup's.
    with EmbeddedBroker(str(tmp_path / "copy"), clock=ManualClock(1_000)) as copy:
        view = copy.query(m.msg_id)
        assert view is not None and view.state is MessageState.READY
        assert copy.stats().topics["t"].pending == 0
    assert consumer.ack(m)


def test_close_writes_the_held_fires(data_dir: Path) -> None:
    broker = EmbeddedBroker(str(data_dir), fire_hold_ms=HOLD_MS)
    consumer = broker.consumer("g", ["t"])
    m = pull_held(broker, consumer, "order")
    fired = broker.stats().topics["t"].fired_total  # 2 if a first try was not held
    broker.close()
    with EmbeddedBroker(str(data_dir), clock=ManualClock(1_000)) as again:
        view = again.query(m.msg_id)
        assert view is not None and view.state is MessageState.READY
        stats = again.stats().topics["t"]
        assert (stats.pending, stats.fired_total) == (0, fired)


def test_the_wheel_thread_writes_what_no_pull_wrote(data_dir: Path) -> None:
    with EmbeddedBroker(str(data_dir), fire_hold_ms=30) as broker:
        consumer = broker.consumer("g", ["t"])
        m = pull_held(broker, consumer, "order")
        # no pull fires again: the wheel thread writes it once it was held its time
        eventually(lambda: broker.core.held_fires == 0, timeout=5, what="held fire written")
        assert consumer.ack(m)


def test_many_held_fires_are_each_delivered_once_in_order(holding: EmbeddedBroker) -> None:
    consumer = holding.consumer("g", ["t"])
    due = int(time.time() * 1000) + 300
    sent = holding.send_batch(
        [Message(topic="t", body=b"%d" % i, deliver_at_ms=due + i // 20) for i in range(6000)]
    )
    got: list[str] = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline:
        batch = consumer.pull(100, wait_ms=1000)
        got += [m.msg_id for m in batch]
        consumer.ack_batch(batch)
    assert got == [r.msg_id for r in sent]


def test_fire_hold_ms_is_checked_and_read_from_the_url(data_dir: Path) -> None:
    with pytest.raises(InvalidArgument, match="fire_hold_ms"):
        EmbeddedBroker(str(data_dir), fire_hold_ms=-1)
    opts = EmbeddedBroker.url_options("rocksdb:///x?fire_hold_ms=0", "/x", {"fire_hold_ms": "0"})
    assert opts == {"fire_hold_ms": 0}


def _journal(path: Path) -> tuple[list[str], list[int]]:
    pulled, held = [], []
    for line in path.read_text().splitlines():
        kind, _, value = line.partition(" ")
        if kind == "pulled":
            pulled.append(value)
        elif kind == "held":
            held.append(int(value))
    return pulled, held


@pytest.mark.parametrize("mode", ["held", "send-after"])
def test_kill_9_with_held_fires_loses_nothing(tmp_path: Path, mode: str) -> None:
    data, journal = tmp_path / "data", tmp_path / "journal.txt"
    journal.touch()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    n = 40
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(data), str(journal), mode, str(n)], env=env
    )
    try:
        eventually(
            lambda: "ready" in journal.read_text() or child.poll() is not None,
            timeout=30,
            what="the child pulled its messages",
        )
        assert child.poll() is None, "the child died on its own"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    pulled, held = _journal(journal)
    assert len(pulled) == n
    assert held[0] > 0, "the child's pulls held no fire: nothing was tested"
    if mode == "send-after":
        assert held[1] == 0, "the send wrote the held fires first"
    with EmbeddedBroker(str(data)) as broker:
        stats = broker.stats().topics["t"]
        later = 1 if mode == "send-after" else 0
        # the counters agree with the wheel: every message counted once
        assert stats.pending + stats.fired_total == n + later
        with broker.consumer("g", ["t"]) as consumer:  # none was acked: all come again
            again: list[str] = []
            deadline = time.monotonic() + 20
            while len(again) < n and time.monotonic() < deadline:
                batch = consumer.pull(64, wait_ms=500)
                again += [m.msg_id for m in batch]
                consumer.ack_batch(batch)
        assert sorted(again) == sorted(pulled)
        stats = broker.stats().topics["t"]
        assert (stats.pending, stats.fired_total) == (later, n)
