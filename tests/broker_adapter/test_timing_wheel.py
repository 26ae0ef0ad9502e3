"""Property tests: key encoding keeps time order; the wheel behaves like a sorted list."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from broker_adapter.embedded import keys as K
from broker_adapter.embedded import timing_wheel
from broker_adapter.embedded.records import Record, encode
from broker_adapter.embedded.store import RocksStore
from broker_adapter.embedded.timing_wheel import TimingWheel

times = st.integers(min_value=0, max_value=K.MAX_TIME_MS)
seqs = st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(times, seqs, times, seqs)
def test_wheel_key_bytes_sort_like_time_then_seq(t1: int, s1: int, t2: int, s2: int) -> None:
    a, b = K.wheel_key(t1, s1), K.wheel_key(t2, s2)
    assert (a < b) == ((t1, s1) < (t2, s2))
    assert K.wheel_time(a) == t1


@given(times, st.integers(min_value=0, max_value=(1 << 64) - 1), st.integers(1, K.MAX_TOPICS))
def test_message_id_locates_wheel_key_and_topic(t: int, seq: int, tid: int) -> None:
    wkey = K.wheel_key(t, seq)
    raw = K.make_id(wkey, tid)
    msg_id = raw.hex()
    assert K.parse_id(msg_id) == raw
    assert K.id_wheel_key(raw) == wkey
    assert K.id_tid(raw) == tid


@given(st.text(max_size=10), st.binary(max_size=33))
def test_parse_id_rejects_malformed(text: str, blob: bytes) -> None:
    assert K.parse_id(text) is None or len(text) == 32
    if len(blob) != 16:
        assert K.parse_id(blob.hex()) is None


@given(
    st.integers(1, 0xFFFF),
    st.integers(0, 0xFFFF),
    times,
    times,
    st.binary(min_size=16, max_size=16),
    st.text(max_size=20),
    st.text(max_size=10),
    st.binary(max_size=200),
)
def test_record_round_trip(
    tid: int, attempts: int, due: int, born: int, raw: bytes, key: str, tags: str, body: bytes
) -> None:
    data = encode(tid, attempts, due, born, raw, key.encode(), tags.encode(), b'{"a":"b"}', body)
    rec = Record(data)
    assert (rec.tid, rec.attempts, rec.deliver_at, rec.born, rec.raw_id) == (
        tid,
        attempts,
        due,
        born,
        raw,
    )
    assert (rec.key or "", rec.tags or "", rec.props, rec.body) == (key, tags, {"a": "b"}, body)


class WheelAgainstSortedList(RuleBasedStateMachine):
    """The wheel (tiny window, tiny memory cap) must pop exactly what a sorted list would."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="chronoq-wheel-")
        self.store = RocksStore(self.dir)
        self.wheel = TimingWheel(
            self.store, K.wheel_key(0, 0), window_ms=40, step_ms=10, max_entries=6, chunk=3
        )
        self.now = 1_000
        self.seq = 0
        self.model: list[bytes] = []

    @rule(delay=st.integers(min_value=0, max_value=300))
    def schedule(self, delay: int) -> None:
        self.seq += 1
        key = K.wheel_key(self.now + delay, self.seq)
        record = encode(1, 0, self.now + delay, self.now, key[2:] + b"\x00\x01", b"", b"", b"", b"")
        self.store.cf[K.CF_WHEEL].put(key, record)
        self.wheel.schedule(key, 1, record)
        self.model.append(key)
        self.model.sort()

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(min_value=0))
    def cancel(self, pick: int) -> None:
        key = self.model.pop(pick % len(self.model))
        self.store.cf[K.CF_WHEEL].delete(key)
        self.wheel.cancel(key)

    @rule(ms=st.integers(min_value=0, max_value=120))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def top_up(self) -> None:  # a pull's refill at a quiet moment (BrokerCore.top_up)
        self.wheel.refill(self.now)

    @rule(limit=st.integers(min_value=1, max_value=8))
    def pop_due(self, limit: int) -> None:
        got = [entry[0] for entry in self.wheel.pop_due(self.now, limit)]
        due = [k for k in self.model if K.wheel_time(k) <= self.now][:limit]
        assert got == due
        for key in got:  # the broker deletes what fired, in the same batch
            self.store.cf[K.CF_WHEEL].delete(key)
            self.model.remove(key)

    @invariant()
    def next_due_is_not_late(self) -> None:
        nxt = self.wheel.next_due_ms()
        if self.model:
            assert nxt is not None and nxt <= K.wheel_time(self.model[0])
        assert all(key < self.wheel.watermark for key in self.wheel.held_keys())

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# The default suite runs a short model check (the suite sits at its time
# budget); the `slow` runs below search ten times deeper.
WheelAgainstSortedList.TestCase.settings = settings(
    max_examples=20, stateful_step_count=40, deadline=None
)
test_wheel_against_sorted_list = WheelAgainstSortedList.TestCase


@pytest.mark.slow
def test_wheel_against_sorted_list_deep() -> None:
    """The model check with 200 examples (`pytest -m slow`)."""
    run_state_machine_as_test(
        WheelAgainstSortedList,
        settings=settings(max_examples=200, stateful_step_count=40, deadline=None),
    )


def test_refill_in_chunks_loses_nothing(tmp_path: object) -> None:
    """More entries due in one window than a chunk holds: all fire, in order."""
    store = RocksStore(str(tmp_path))
    try:
        wheel = TimingWheel(
            store, K.wheel_key(0, 0), window_ms=40, step_ms=10, max_entries=6, chunk=3
        )
        assert wheel.pop_due(1_000, 10) == []
        keys = []
        for seq in range(10):
            key = K.wheel_key(1_100 + seq % 3, seq)
            store.cf[K.CF_WHEEL].put(
                key, encode(1, 0, 1_100, 1_000, key[2:] + b"\x00\x01", b"", b"", b"", b"")
            )
            wheel.schedule(key, 1, b"")
            keys.append(key)
        fired = []
        for _ in range(10):
            batch = wheel.pop_due(1_105, 4)
            for key, _tid, _rec in batch:
                store.cf[K.CF_WHEEL].delete(key)
            fired += [entry[0] for entry in batch]
        assert fired == sorted(keys)
    finally:
        store.close()


def test_firing_refills_a_step_after_a_top_up_would(tmp_path: object) -> None:
    """A top-up (``refill(now)``, a pull's quiet moment) loads once the window shrank
    by a step; firing's own refill waits one step more, as a fallback."""
    store = RocksStore(str(tmp_path))
    try:
        wheel = TimingWheel(store, K.wheel_key(0, 0), window_ms=40, step_ms=10)
        keys = [K.wheel_key(t, t) for t in range(1_000, 1_100, 5)]
        for key in keys:
            record = encode(1, 0, 1_000, 1_000, key[2:] + b"\x00\x01", b"", b"", b"", b"")
            store.cf[K.CF_WHEEL].put(key, record)
            wheel.schedule(key, 1, record)

        def fire(now_ms: int) -> list[int]:
            fired = [entry[0] for entry in wheel.pop_due(now_ms, 100)]
            for key in fired:  # the broker deletes what fired
                store.cf[K.CF_WHEEL].delete(key)
            return [K.wheel_time(key) for key in fired]

        def held_until() -> int:
            return K.wheel_time(wheel.held_keys()[-1])

        assert fire(990) == []
        assert held_until() == 1_025  # loaded up to 990 + 40
        assert fire(1_001) == [1_000]
        assert held_until() == 1_025  # shrunk by 11 ms: firing does not load yet
        assert wheel.refill(1_001) == 3  # the top-up does (1030, 1035, 1040)
        assert wheel.refill(1_001) == 0  # once per step
        assert fire(1_021) == [1_005, 1_010, 1_015, 1_020]
        assert held_until() == 1_040  # shrunk by 20 ms: not yet
        assert fire(1_022) == []
        assert held_until() == 1_060  # by 21: the fallback loads
    finally:
        store.close()


def test_wheel_against_sorted_list_dropping_fired_entries_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same model check with the run's fired head deleted after every pop."""
    monkeypatch.setattr(timing_wheel, "_COMPACT_MIN", 1)
    run_state_machine_as_test(
        WheelAgainstSortedList,
        settings=settings(max_examples=15, stateful_step_count=40, deadline=None),
    )


@pytest.mark.slow
def test_wheel_against_sorted_list_dropping_fired_entries_deep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """That model check with 150 examples (`pytest -m slow`)."""
    monkeypatch.setattr(timing_wheel, "_COMPACT_MIN", 1)
    run_state_machine_as_test(
        WheelAgainstSortedList,
        settings=settings(max_examples=150, stateful_step_count=40, deadline=None),
    )
