"""What the memory broker does for the runtime calls beyond the contract: its due
index (against a sorted-list model), bounded find_pending pages, rate limits and
semaphores shared by the handles of one named broker, and reschedules racing the
real clock."""

from __future__ import annotations

import threading
import time
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.clock import ManualClock
from broker_adapter.memory import MemoryBroker
from broker_adapter.memory.due_index import BUCKET_MS, DueIndex
from broker_adapter.memory.finder import SCAN_BUDGET
from broker_adapter.memory.key_index import KeyIndex
from broker_adapter.memory.records import Copy, StoredMessage
from broker_adapter.message import Message
from broker_adapter.results import RescheduleResult, RescheduleStatus
from tests.helpers import assert_nothing, pull_one, pull_until


def _copy(due: int, seq: int) -> Copy:
    msg = StoredMessage(f"m{seq}", "t", b"", None, None, {}, due, due, 0, 0)
    return Copy(msg, "t", due, 0, seq)


@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 5 * BUCKET_MS), st.integers(0, 30)),
        max_size=80,
    ),
    after=st.tuples(st.integers(-1, 5 * BUCKET_MS), st.integers(-1, 100)),
)
def test_due_index_reads_on_in_due_order_like_a_sorted_list(
    ops: list[tuple[bool, int, int]], after: tuple[int, int]
) -> None:
    index = DueIndex()
    model: dict[int, Copy] = {}
    for seq, (add, due, pick) in enumerate(ops):
        if add or not model:
            copy = _copy(due, seq)
            index.add(copy)
            model[seq] = copy
        else:
            victim = sorted(model)[pick % len(model)]
            index.discard(model.pop(victim))
    assert len(index) == len(model)
    expected = sorted(
        (c for c in model.values() if (c.due_ms, c.seq) > after), key=lambda c: (c.due_ms, c.seq)
    )
    assert list(index.after(after)) == expected


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["put", "drop", "under"]),
            st.sampled_from(["t", "u"]),
            st.text(alphabet="ab:\U0010ffff", min_size=1, max_size=4),
        ),
        max_size=60,
    )
)
def test_key_index_lists_the_keys_under_a_prefix_like_a_dict(
    ops: list[tuple[str, str, str]],
) -> None:
    index = KeyIndex()
    model: dict[tuple[str, str], StoredMessage] = {}
    for op, topic, key in ops:
        if op == "put":
            msg = _copy(0, len(model)).message
            index.put(topic, key, msg)
            model[(topic, key)] = msg
        elif op == "drop" and (topic, key) in model:
            index.drop(topic, key, model.pop((topic, key)))
        else:
            prefix = key[:2]
            listed = [k for k in dict.fromkeys(index.under(topic, prefix)) if index.get(topic, k)]
            expected = sorted(k for t, k in model if t == topic and k.startswith(prefix))
            assert listed == expected
            assert all(index.get(topic, k) is model[(topic, k)] for k in listed)


def test_find_pending_does_bounded_work_and_keeps_a_cursor_on_short_pages() -> None:
    with MemoryBroker(clock=ManualClock()) as b:
        b.send_batch([Message("a", b"x", delay_ms=1_000) for _ in range(SCAN_BUDGET + 10)])
        late = b.send(Message("b", b"y", delay_ms=2_000)).msg_id
        first = b.find_pending("b")
        assert first.messages == [] and first.cursor is not None
        second = b.find_pending("b", cursor=first.cursor)
        assert [v.msg_id for v in second.messages] == [late] and second.cursor is None


def test_many_moves_of_one_message_deliver_it_once() -> None:
    clock = ManualClock()
    with MemoryBroker(clock=clock) as b:
        c = b.consumer("g", ["t"])
        sent = b.send(Message("t", b"x", delay_ms=1_000))
        for n in range(5_000):  # the cancelled copies are dropped from the heap meanwhile
            b.reschedule(sent.msg_id, delay_ms=2_000 + n % 7)
        assert b.stats().topics["t"].pending == 1
        clock.advance(2_010)
        assert pull_one(c).msg_id == sent.msg_id
        assert_nothing(c, wait_ms=50)


def test_rate_limits_and_slots_are_shared_by_the_handles_of_one_name() -> None:
    clock = ManualClock()
    with (
        MemoryBroker("runtime-shared", clock=clock) as app,
        MemoryBroker("runtime-shared") as other,
    ):
        assert app.acquire_rate("r", 1, 1_000) == 0
        assert other.acquire_rate("r", 1, 1_000) > 0
        assert app.acquire_slot("s", 1, "run-1", 1_000)
        assert not other.acquire_slot("s", 1, "run-2", 1_000)
        assert other.release_slot("s", "run-1")


def test_reschedules_racing_the_real_clock_deliver_each_message_once() -> None:
    seen: Counter[str] = Counter()
    with MemoryBroker() as b:
        c = b.consumer("g", ["t"])
        for _ in range(10):
            due = int(time.time() * 1000) + 30
            sent = b.send_batch([Message("t", b"x", deliver_at_ms=due) for _ in range(100)])
            ids = [r.msg_id for r in sent]
            answers: dict[str, RescheduleResult] = {}

            def move(part: list[str], into: dict[str, RescheduleResult]) -> None:
                for n, msg_id in enumerate(part):
                    into[msg_id] = b.reschedule(msg_id, delay_ms=(0, 1, 20)[n % 3])

            time.sleep(max(due - time.time() * 1000 - 2, 0) / 1000)
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
                expected = due if answer.status is RescheduleStatus.ALREADY_DELIVERED else None
                assert m.deliver_at_ms == (expected or answer.deliver_at_ms)
            seen.update(a.status.name for a in answers.values())
        assert_nothing(c, wait_ms=100)
    assert seen["RESCHEDULED"] > 0
