"""Fired messages are trimmed after the retention time, once every group has passed them."""

from __future__ import annotations

from pathlib import Path

from broker_adapter import ManualClock, Message, MessageState
from broker_adapter.embedded import EmbeddedBroker
from tests.helpers import eventually, pull_one

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
