"""Fired messages are trimmed after the retention time, once every group has passed them;
their business keys go with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_adapter import ManualClock, Message, MessageState, SendStatus
from broker_adapter.embedded import EmbeddedBroker, retention
from broker_adapter.embedded import keys as K
from tests.helpers import eventually, pull_one, pull_until

HOUR = 3_600_000


def test_trim_drops_consumed_messages_past_retention_and_keeps_the_rest(tmp_path: Path) -> None:
    clock = ManualClock()
    with EmbeddedBroker(tmp_path / "d", clock=clock, retention_ms=HOUR) as broker:
        fast = broker.consumer("fast", ["t"])
        slow = broker.consumer("slow", ["t"], invisible_ms=10 * HOUR)  # holds the 2nd
        first = broker.send(Message("t", b"1")).msg_id
        second = broker.send(Message("t", b"2")).msg_id
        aborted = broker.send(Message("t", b"3", delay_ms=1_000)).msg_id
        kept_abort = broker.send(Message("t", b"4", delay_ms=HOUR * 10)).msg_id
        broker.abort(aborted)
        broker.abort(kept_abort)
        for consumer in (fast, fast, slow):
            assert consumer.ack(pull_one(consumer))
        assert pull_one(slow).msg_id == second  # in flight in "slow" from now on
        view = broker.query(first)
        assert view is not None and view.state is MessageState.DONE

        clock.advance(2 * HOUR)  # past retention: the wheel thread trims on its next turn
        eventually(lambda: broker.query(first) is None, what="the consumed message is trimmed")
        assert broker.query(aborted) is None, "abort tombstones go once due + retention passed"
        view = broker.query(kept_abort)
        assert view is not None and view.state is MessageState.ABORTED
        kept = broker.query(second)  # the slow group has not passed it: kept
        assert kept is not None and kept.groups["slow"] is not MessageState.DONE


def entries(broker: EmbeddedBroker, cf: str) -> int:
    """How many entries column family ``cf`` holds."""
    return sum(1 for _ in broker.core.store.cf[cf].keys())  # noqa: SIM118 - Rdict


def key_entries(broker: EmbeddedBroker) -> int:
    """How many entries the key index holds."""
    return entries(broker, K.CF_KEYS)


def note_entries(broker: EmbeddedBroker) -> int:
    """How many retry/dead-letter notes the groups keep."""
    return entries(broker, K.CF_CONSUME)


def test_keys_of_trimmed_and_aborted_messages_are_forgotten(tmp_path: Path) -> None:
    clock = ManualClock()
    with EmbeddedBroker(tmp_path / "d", clock=clock, retention_ms=HOUR) as broker:
        c = broker.consumer("g", ["t"])
        start = clock.now_ms()
        fired = broker.send(Message("t", b"1", key="order-1", deliver_at_ms=start))
        broker.send(Message("t", b"2", key="order-2", delay_ms=1_000))
        assert broker.abort(key="order-2", topic="t").status.value == "ABORTED"
        assert c.ack(pull_one(c))
        again = Message("t", b"1", key="order-1", deliver_at_ms=start)
        assert broker.send(again).status is SendStatus.DUPLICATE  # fired at that time
        assert key_entries(broker) == 2

        clock.advance(2 * HOUR)
        eventually(lambda: key_entries(broker) == 0, what="both keys forgotten")
        assert broker.query(fired.msg_id) is None
        resent = broker.send(again)  # the old occurrence is past retention: a new message
        assert resent.status is SendStatus.OK and resent.msg_id != fired.msg_id


def test_a_key_taken_over_by_a_later_send_stays(tmp_path: Path) -> None:
    clock = ManualClock()
    with EmbeddedBroker(tmp_path / "d", clock=clock, retention_ms=HOUR) as broker:
        c = broker.consumer("g", ["t"])
        old = broker.send(Message("t", b"old", key="k"))
        assert c.ack(pull_one(c))
        later = broker.send(Message("t", b"new", key="k", delay_ms=10 * HOUR))
        assert later.status is SendStatus.OK
        clock.advance(2 * HOUR)
        eventually(lambda: broker.query(old.msg_id) is None, what="the old message trimmed")
        assert key_entries(broker) == 1
        dup = broker.send(Message("t", b"x", key="k", delay_ms=HOUR))
        assert (dup.status, dup.msg_id) == (SendStatus.DUPLICATE, later.msg_id)


def test_trimming_goes_in_chunks_and_firing_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "TRIM_CHUNK", 7)
    clock = ManualClock()
    with EmbeddedBroker(tmp_path / "d", clock=clock, retention_ms=HOUR) as broker:
        c = broker.consumer("g", ["t"])
        broker.send_batch([Message("t", b"", key=f"k{i}") for i in range(50)])
        broker.send_batch([Message("t", b"", key=f"a{i}", delay_ms=10) for i in range(20)])
        for i in range(20):
            broker.abort(key=f"a{i}", topic="t")
        assert c.ack_batch(pull_until(c, 50)) == [True] * 50
        assert key_entries(broker) == 70
        clock.advance(2 * HOUR)
        late = broker.send(Message("t", b"late", delay_ms=5))
        clock.advance(5)
        assert pull_one(c).msg_id == late.msg_id
        eventually(lambda: key_entries(broker) == 0, what="every key forgotten, 7 at a time")


def test_retry_and_dead_letter_notes_go_with_their_copies(tmp_path: Path) -> None:
    clock = ManualClock()
    with EmbeddedBroker(tmp_path / "d", clock=clock, retention_ms=HOUR) as broker:
        c = broker.consumer("g", ["t"])
        retried = broker.send(Message("t", b"r")).msg_id
        dead = broker.send(Message("t", b"d")).msg_id
        first = {m.msg_id: m for m in pull_until(c, 2)}
        assert c.nack(first[retried], delay_ms=1_000, reason="try again")
        assert c.dead_letter(first[dead], "unknown job")
        clock.advance(1_000)
        again = pull_one(c)
        assert again.msg_id == retried and c.nack(again, delay_ms=1_000)  # a newer note
        clock.advance(1_000)
        assert c.ack(pull_one(c))
        assert note_entries(broker) == 2
        view = broker.query(dead)
        assert view is not None and view.state is MessageState.DEAD

        clock.advance(2 * HOUR)
        eventually(lambda: note_entries(broker) == 0, what="both notes trimmed")
        assert broker.query(retried) is None and broker.query(dead) is None
