"""BrokerCore on its own: sequence numbers, topics, counters, firing and wake-ups, on a real
RocksDB directory; and the seam rule that no part of the embedded broker reads another
object's underscore names."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import core as core_module
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import Record, encode
from tests.conftest import START_MS
from tests.helpers import eventually

EMBEDDED = Path(core_module.__file__).parent


def pend(core: BrokerCore, topic: str, due_ms: int, body: bytes = b"") -> bytes:
    """Put one message for ``topic`` on the wheel the way a send does; its wheel key."""
    with core.lock:
        tid = core.topic_id(topic)
        wkey = K.wheel_key(due_ms, core.take_seqs(1))
        record = encode(tid, 0, due_ms, core.now(), K.make_id(wkey, tid), b"", b"", b"", body)
        core.write_pending(core.store.batch(), [(wkey, tid, record)])
    return wkey


def ready_keys(core: BrokerCore, tid: int) -> list[bytes]:
    lo, hi = K.topic_range(tid)
    return [key for key, _ in core.store.scan(K.CF_READY, lo, hi, 1000)]


# ------------------------------------------------------------------ sequence numbers


def test_sequence_numbers_are_consecutive_and_never_reused_after_reopen(
    data_dir: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_module, "SEQ_BLOCK", 10)  # cross several reserved blocks
    handed_out: list[int] = []
    for _ in range(3):
        core = BrokerCore(data_dir, manual_clock)
        try:
            with core.lock:
                first = core.take_seqs(7)
                handed_out += range(first, first + 7)
                handed_out += [core.next_seq() for _ in range(15)]
        finally:
            core.close()
    assert len(set(handed_out)) == len(handed_out), "a sequence number was used twice"
    assert handed_out == sorted(handed_out)


# ------------------------------------------------------------------------- topics


def test_topics_are_registered_durably_with_ids_names_and_prefixes(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    with_ids = {}
    core = BrokerCore(data_dir, manual_clock)
    try:
        for name in ("orders", "%RETRY%g", "orders", "mail"):
            with_ids[name] = core.topic_id(name)
    finally:
        core.close()
    assert with_ids == {"orders": 1, "%RETRY%g": 2, "mail": 3}
    core = BrokerCore(data_dir, manual_clock)
    try:
        assert dict(core.topic_ids) == with_ids
        assert dict(core.topic_names) == {tid: name for name, tid in with_ids.items()}
        assert core.prefixes[3] == K.tid_bytes(3)
        assert core.topic_id("later") == 4
    finally:
        core.close()


# ------------------------------------------------------------- counters and firing


def test_counters_follow_pending_fired_aborted_and_dead_letters_across_reopen(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    core = BrokerCore(data_dir, manual_clock)
    try:
        due = START_MS + 1_000
        keys = [pend(core, "t", due, body=bytes([i])) for i in range(3)]
        tid = core.topic_ids["t"]
        assert (core.pending_count(tid), core.fired_count(tid)) == (3, 0)

        record = core.store.cf[K.CF_WHEEL].get(keys[2])
        assert record is not None
        core.abort_pending(keys[2], tid, record)
        assert core.store.cf[K.CF_WHEEL].get(keys[2]) is None
        assert core.store.cf[K.CF_ABORTED].get(keys[2]) is not None
        assert core.pending_count(tid) == 2

        assert core.fire_due(100) == {}, "nothing is due before its time"
        manual_clock.advance(1_000)
        assert core.fire_due(100) == {tid: 2}, "the aborted one does not fire"
        assert (core.pending_count(tid), core.fired_count(tid)) == (0, 2)

        dlq = core.topic_id("%DLQ%g")
        batch = core.store.batch()
        with core.lock:
            core.append_ready(batch, dlq, core.now(), record)
            core.write(batch)
        assert (core.pending_count(dlq), core.fired_count(dlq)) == (0, 1)
    finally:
        core.close()
    core = BrokerCore(data_dir, manual_clock)
    try:
        assert (core.pending_count(tid), core.fired_count(tid)) == (0, 2)
        assert core.fired_count(dlq) == 1
    finally:
        core.close()


def test_firing_moves_entries_to_ready_and_advances_tails_and_fire_position(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    core = BrokerCore(data_dir, manual_clock)
    try:
        a = pend(core, "a", START_MS + 10, b"a1")
        b = pend(core, "b", START_MS + 20, b"b1")
        later = pend(core, "a", START_MS + 30, b"a2")
        ta, tb = core.topic_ids["a"], core.topic_ids["b"]
        assert core.tails.get(ta) is None and core.fired_upto <= a
        next_due = core.next_due_ms()  # when the wheel needs the thread: no later than that
        assert next_due is not None and next_due <= START_MS + 10

        manual_clock.advance(20)
        assert core.fire_due(1) == {ta: 1}, "the limit bounds one chunk"
        assert core.fire_due(10) == {tb: 1}
        assert ready_keys(core, ta) == [core.prefixes[ta] + a]
        assert (core.tails[ta], core.tails[tb]) == (core.prefixes[ta] + a, core.prefixes[tb] + b)
        assert a < b < core.fired_upto <= later
        assert core.store.cf[K.CF_WHEEL].get(a) is None
        fired = core.store.cf[K.CF_READY].get(core.prefixes[ta] + a)
        assert fired is not None and Record(fired).body == b"a1"
    finally:
        core.close()
    core = BrokerCore(data_dir, manual_clock)  # tails and fire position come back
    try:
        assert (core.tails[ta], core.tails[tb]) == (core.prefixes[ta] + a, core.prefixes[tb] + b)
        assert b < core.fired_upto <= later
        manual_clock.advance(10)
        assert core.fire_due(10) == {ta: 1}
        assert ready_keys(core, ta) == [core.prefixes[ta] + a, core.prefixes[ta] + later]
    finally:
        core.close()


class SteppedClock:
    """A clock a test may set backwards (as NTP may step a system clock)."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def step_to(self, now_ms: int) -> None:
        self.now = now_ms

    def subscribe(self, listener: Callable[[], None]) -> None:
        pass  # nobody waits on this clock in these tests

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        pass


def test_broker_time_never_goes_back_nor_behind_the_fire_position(data_dir: Path) -> None:
    clock = SteppedClock(START_MS)
    core = BrokerCore(data_dir, clock)
    try:
        pend(core, "t", START_MS + 5_000)
        clock.step_to(START_MS + 5_000)
        assert core.fire_due(10)
        clock.step_to(START_MS + 1_000)
        assert core.now() == START_MS + 5_000
        clock.step_to(START_MS + 6_000)
        assert core.now() == START_MS + 6_000
    finally:
        core.close()
    core = BrokerCore(data_dir, SteppedClock(START_MS))  # restarted with the clock behind
    try:
        assert core.now() == START_MS + 5_000, "time starts at the fire position"
    finally:
        core.close()


# ----------------------------------------------------------------------- wake-ups


def sleeper(core: BrokerCore, wake_ms: int) -> threading.Thread:
    """A thread waiting in ``wait_for_work`` as the wheel thread does, once it sleeps."""
    thread = threading.Thread(target=core.wait_for_work, args=(wake_ms, 60.0), daemon=True)
    thread.start()
    eventually(lambda: core.planned_wake_ms == wake_ms, what="the sleeper is waiting")
    return thread


def test_wake_if_before_wakes_only_for_something_earlier(core: BrokerCore) -> None:
    wake = core.now() + 3_600_000
    thread = sleeper(core, wake)
    core.wake_if_before(wake)  # not earlier: it sleeps on
    thread.join(0.2)
    assert thread.is_alive() and core.planned_wake_ms == wake
    core.wake_if_before(wake - 1)
    thread.join(10)
    assert not thread.is_alive()
    assert core.planned_wake_ms == 0, "awake: no planned wake-up"


def test_a_clock_move_or_an_earlier_kick_ends_the_wait(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    thread = sleeper(core, core.now() + 3_600_000)
    manual_clock.advance(1)  # the core listens to its clock
    thread.join(10)
    assert not thread.is_alive()

    core.kick()  # a kick while it works is not lost: the next wait returns at once
    thread = threading.Thread(
        target=core.wait_for_work, args=(core.now() + 3_600_000, 60.0), daemon=True
    )
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_close_stops_listening_to_the_clock_and_frees_the_directory(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    BrokerCore(data_dir, manual_clock).close()
    manual_clock.advance(1)  # no listener left to call into a closed core
    BrokerCore(data_dir, manual_clock).close()  # the directory is free again


# ------------------------------------------------------------------------- the seams


def foreign_private_reads(path: Path) -> list[str]:
    """``x._name`` in ``path`` where ``x`` is not ``self`` or ``cls`` (dunders allowed)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


def test_the_check_finds_a_foreign_private_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(broker):\n    return broker._groups, self._ok, broker.__class__\n")
    assert foreign_private_reads(sample) == ["sample.py:2: ._groups"]


def test_no_part_of_the_embedded_broker_reads_another_objects_private_names() -> None:
    found = [hit for path in sorted(EMBEDDED.glob("*.py")) for hit in foreign_private_reads(path)]
    assert found == []
