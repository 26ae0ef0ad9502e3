"""What the embedded broker does for the runtime calls beyond the contract: moves of
messages in and out of the near window, the ``moves`` family (lookups after a
reopen, dropped by retention), bounded find_pending pages, and reschedules racing
the real clock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.finder import NARROW_KEYS, SCAN_BUDGET
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortStatus,
    MessageState,
    RescheduleResult,
    RescheduleStatus,
    SendStatus,
)
from tests.helpers import assert_nothing, eventually, pull_one, pull_until

pytestmark = pytest.mark.timeout(120)

HOUR = 3_600_000


@pytest.fixture
def broker(data_dir: Path, manual_clock: ManualClock) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(str(data_dir), clock=manual_clock)
    try:
        yield b
    finally:
        b.close()


def moves(broker: EmbeddedBroker) -> int:
    """How many entries the ``moves`` family holds."""
    return sum(1 for _ in broker.core.store.cf[K.CF_MOVES].keys())  # noqa: SIM118 - Rdict


def test_a_message_in_the_near_window_moved_later_does_not_fire_at_its_old_time(
    broker: EmbeddedBroker, manual_clock: ManualClock
) -> None:
    c = broker.consumer("g", ["t"])
    sent = broker.send(Message("t", b"x", delay_ms=300))  # within the 1 s near window
    manual_clock.advance(100)
    assert broker.reschedule(sent.msg_id, delay_ms=5_000).status is RescheduleStatus.RESCHEDULED
    manual_clock.advance(200)
    assert_nothing(c)
    manual_clock.advance(4_800)
    assert pull_one(c).msg_id == sent.msg_id


def test_a_far_message_moved_into_the_near_window_fires_on_time(
    broker: EmbeddedBroker, manual_clock: ManualClock
) -> None:
    c = broker.consumer("g", ["t"])
    sent = broker.send(Message("t", b"x", delay_ms=HOUR))  # on disk only
    broker.send(Message("t", b"y", delay_ms=400))  # the window is loaded past now
    manual_clock.advance(100)
    broker.reschedule(sent.msg_id, delay_ms=200)
    manual_clock.advance(199)
    assert_nothing(c, wait_ms=100)
    manual_clock.advance(1)
    assert pull_one(c).msg_id == sent.msg_id


def test_a_moved_message_is_found_by_id_and_key_after_a_reopen(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        sent = b.send(Message("t", b"x", key="k", delay_ms=5_000))
        b.reschedule(sent.msg_id, delay_ms=9_000)
        b.reschedule(key="k", topic="t", delay_ms=7_000)
        assert moves(b) == 1  # one entry per message, whatever the number of moves
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        view = b.query(sent.msg_id)
        assert view is not None and view.deliver_at_ms == manual_clock.now_ms() + 7_000
        dup = b.send(Message("t", b"x", key="k", delay_ms=1))
        assert (dup.status, dup.msg_id, dup.deliver_at_ms) == (
            SendStatus.DUPLICATE,
            sent.msg_id,
            manual_clock.now_ms() + 7_000,
        )
        assert b.abort(key="k", topic="t").status is AbortStatus.ABORTED
        view = b.query(sent.msg_id)
        assert view is not None and view.state is MessageState.ABORTED
        assert b.stats().topics["t"].pending == 0


def test_retention_drops_the_moves_of_trimmed_messages(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    with EmbeddedBroker(tmp_path / "d", clock=clock, retention_ms=HOUR) as b:
        c = b.consumer("g", ["t"])
        fired = b.send(Message("t", b"f", key="f", delay_ms=1_000)).msg_id
        aborted = b.send(Message("t", b"a", key="a", delay_ms=1_000)).msg_id
        unkeyed = b.send(Message("t", b"u", delay_ms=1_000)).msg_id
        for msg_id in (fired, aborted, unkeyed):
            b.reschedule(msg_id, delay_ms=2_000)
        b.abort(aborted)
        assert moves(b) == 3
        clock.advance(2_000)
        for m in pull_until(c, 2):
            assert c.ack(m)
        clock.advance(2 * HOUR)
        eventually(lambda: moves(b) == 0, what="the moves are trimmed with their messages")
        assert b.query(fired) is None and b.query(aborted) is None


def test_find_pending_does_bounded_work_and_keeps_a_cursor_on_short_pages(
    broker: EmbeddedBroker,
) -> None:
    now = broker.core.now()
    broker.send_batch(
        [Message("a", b"x", deliver_at_ms=now + 1_000) for _ in range(SCAN_BUDGET + 10)]
    )
    late = broker.send(Message("b", b"y", deliver_at_ms=now + 2_000)).msg_id
    first = broker.find_pending("b")
    assert first.messages == [] and first.cursor is not None  # the budget ran out
    second = broker.find_pending("b", cursor=first.cursor)
    assert [v.msg_id for v in second.messages] == [late] and second.cursor is None


def test_find_pending_by_a_narrow_prefix_reads_the_keys_not_the_wheel(
    broker: EmbeddedBroker,
) -> None:
    now = broker.core.now()
    broker.send_batch(
        [
            Message("t", b"x", key=f"order:{i}:close", deliver_at_ms=now + 1_000)
            for i in range(SCAN_BUDGET + 10)
        ]
    )
    mine = broker.send(Message("t", b"m", key="zzz:1", deliver_at_ms=now + 2_000)).msg_id
    page = broker.find_pending("t", key_prefix="zzz:")
    assert [v.msg_id for v in page.messages] == [mine] and page.cursor is None


def test_find_pending_by_a_wide_prefix_pages_through_the_wheel(broker: EmbeddedBroker) -> None:
    now = broker.core.now()
    n = NARROW_KEYS + 50
    sent = broker.send_batch(
        [Message("t", b"x", key=f"w:{i:05d}", deliver_at_ms=now + 1_000 + i) for i in range(n)]
    )
    seen: list[str] = []
    cursor = None
    while True:
        page = broker.find_pending("t", key_prefix="w:", limit=500, cursor=cursor)
        seen.extend(v.msg_id for v in page.messages)
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == [r.msg_id for r in sent]


def test_a_cursor_of_another_broker_kind_is_malformed(broker: EmbeddedBroker) -> None:
    from broker_adapter.errors import InvalidArgument
    from broker_adapter.memory.finder import encode_cursor

    broker.send(Message("t", b"x", delay_ms=1_000))
    with pytest.raises(InvalidArgument):
        broker.find_pending("t", cursor=encode_cursor((1, 2)))


def test_reschedules_racing_the_real_clock_deliver_each_message_once(data_dir: Path) -> None:
    """With the system clock: reschedule messages from two threads around the moment
    they fall due; each is delivered exactly once, at the time its answer says."""
    seen: Counter[str] = Counter()
    with EmbeddedBroker(str(data_dir)) as b:
        c = b.consumer("g", ["t"])
        for _ in range(10):
            due = b.core.now() + 30
            ids = [
                r.msg_id
                for r in b.send_batch([Message("t", b"x", deliver_at_ms=due) for _ in range(100)])
            ]
            answers: dict[str, RescheduleResult] = {}

            def move(part: list[str], into: dict[str, RescheduleResult]) -> None:
                for n, msg_id in enumerate(part):
                    into[msg_id] = b.reschedule(msg_id, delay_ms=(0, 1, 20)[n % 3])

            time.sleep(max(due - b.core.now() - 2, 0) / 1000)
            threads = [threading.Thread(target=move, args=(ids[i::2], answers)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            got = pull_until(c, len(ids), timeout=10, max_messages=100)
            for m in got:
                c.ack(m)
            assert Counter(m.msg_id for m in got) == Counter(ids)
            for m in got:
                answer = answers[m.msg_id]
                if answer.status is RescheduleStatus.RESCHEDULED:
                    assert m.deliver_at_ms == answer.deliver_at_ms
                else:
                    assert answer.status is RescheduleStatus.ALREADY_DELIVERED
                    assert m.deliver_at_ms == due
            seen.update(a.status.name for a in answers.values())
        assert_nothing(c, wait_ms=100)
    assert seen["RESCHEDULED"] > 0
