"""BrokerCore.fresh_rows: what a pull reads from memory right after a fire is what the
store holds, from every cursor (real RocksDB directory), and it steps aside whenever
it could differ: a fire below the topic's tail, a dead letter, a deletion, a reopen."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import fresh as fresh_module
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import encode
from tests.conftest import START_MS


def pend(core: BrokerCore, topic: str, due_ms: int, n: int = 1) -> list[bytes]:
    """Put ``n`` messages due at ``due_ms`` for ``topic`` on the wheel, as a send does
    (but with any due time, also one before the fire position); their wheel keys."""
    with core.lock:
        tid = core.topic_id(topic)
        entries = []
        for _ in range(n):
            wkey = K.wheel_key(due_ms, core.take_seqs(1))
            record = encode(tid, 0, due_ms, core.now(), K.make_id(wkey, tid), b"", b"", b"", b"x")
            entries.append((wkey, tid, record))
        core.write_pending(core.store.batch(), entries)
    return [entry[0] for entry in entries]


def dead_letter(core: BrokerCore, topic: str) -> bytes:
    """Append a dead letter to ``topic``'s ready keys, as a nack past max attempts does."""
    with core.lock:
        tid = core.topic_id(topic)
        batch = core.store.batch()
        record = encode(tid, 1, core.now(), START_MS, b"\x00" * 16, b"", b"", b"", b"d")
        wkey = core.append_ready(batch, tid, core.now(), record)
        core.write(batch)
    return wkey


def stored(core: BrokerCore, tid: int, cursor: bytes, limit: int) -> list[tuple[bytes, bytes]]:
    return core.store.scan(K.CF_READY, cursor, K.topic_range(tid)[1], limit)


def fire_all(core: BrokerCore, clock: ManualClock, until_ms: int, chunk: int = 1000) -> None:
    clock.set(max(until_ms, clock.now_ms()))
    while core.fire_due(chunk):
        pass


def assert_fresh_is_stored(core: BrokerCore, tid: int) -> int:
    """From every cursor a pull can have (each key, just past each key, the topic's
    start and end), fresh rows, when held, are the store's; how many cursors were
    answered from memory."""
    lo, hi = K.topic_range(tid)
    keys = [key for key, _ in stored(core, tid, lo, 1 << 20)]
    answered = 0
    for cursor in [lo, hi, *keys, *(key + b"\x00" for key in keys)]:
        for limit in (1, 3, 1 << 20):
            held = core.fresh_rows(tid, cursor, limit)
            if held is not None:
                answered += 1
                assert held == stored(core, tid, cursor, limit), (cursor.hex(), limit)
    tail = core.tails.get(tid)
    assert tail == (keys[-1] if keys else None)  # the tail is the greatest stored key
    return answered


def test_rows_held_after_fires_are_the_stored_rows_from_any_cursor_they_cover(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    for i in range(5):  # five chunks: each fire appends to what is held
        pend(core, "t", START_MS + 10 + i, n=3)
        fire_all(core, manual_clock, START_MS + 10 + i)
    tid = core.topic_ids["t"]
    everything = stored(core, tid, K.topic_range(tid)[0], 100)
    assert len(everything) == 15
    first = everything[0][0]
    assert core.fresh_rows(tid, first, 100) == everything  # all five chunks are held
    assert assert_fresh_is_stored(core, tid) > 0
    # Older than what is held (the topic's very start): the store must be read.
    assert core.fresh_rows(tid, K.topic_range(tid)[0], 100) is None


def test_a_fire_below_the_tail_drops_what_is_held(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    # The hole of the first version: a chunk fired below the tail was appended to the
    # held keys, which were then out of order, and a cursor moved past keys the store
    # has. Nothing fires out of order today; a wheel key below the fire position
    # (what two firing threads or a repair could write) makes one.
    pend(core, "t", START_MS + 10, n=3)
    pend(core, "t", START_MS + 20, n=3)
    fire_all(core, manual_clock, START_MS + 10)
    fire_all(core, manual_clock, START_MS + 20)
    tid = core.topic_ids["t"]
    assert core.fresh_rows(tid, core.tails[tid], 10) is not None
    late = pend(core, "t", START_MS + 15, n=2)  # below the fire position: fires next
    fire_all(core, manual_clock, START_MS + 21)
    lows = [core.prefixes[tid] + wkey for wkey in late]
    assert [key for key, _ in stored(core, tid, lows[0], 2)] == lows  # in the store...
    assert core.tails[tid] > lows[-1]  # ...below the tail, which stays
    assert core.fresh_rows(tid, lows[0], 10) is None  # so pulls read the store
    assert_fresh_is_stored(core, tid)
    # The next fire in order starts what is held afresh from its own chunk.
    pend(core, "t", START_MS + 30, n=2)
    fire_all(core, manual_clock, START_MS + 30)
    assert assert_fresh_is_stored(core, tid) > 0
    assert core.fresh_rows(tid, lows[0], 10) is None


def test_a_dead_letter_on_a_topic_makes_pulls_read_the_store(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    pend(core, "t", START_MS + 10, n=2)
    fire_all(core, manual_clock, START_MS + 20)
    tid = core.topic_ids["t"]
    last = core.tails[tid]
    assert core.fresh_rows(tid, last, 10) is not None
    dead_letter(core, "t")
    assert core.fresh_rows(tid, last, 10) is None
    assert len(stored(core, tid, last, 10)) == 2  # the last fired one and the dead letter
    assert_fresh_is_stored(core, tid)
    # A message due before the dead letter's key fires below the tail: still the store.
    pend(core, "t", START_MS + 20)
    fire_all(core, manual_clock, START_MS + 20)
    assert core.fresh_rows(tid, last, 10) is None
    assert_fresh_is_stored(core, tid)
    # The next fire above the tail starts what is held afresh, from its own chunk.
    pend(core, "t", START_MS + 30)
    fire_all(core, manual_clock, START_MS + 40)
    tail = core.tails[tid]
    assert core.fresh_rows(tid, tail, 10) == stored(core, tid, tail, 10)
    assert core.fresh_rows(tid, last, 10) is None
    assert_fresh_is_stored(core, tid)


def test_what_is_held_is_bounded_and_restarts_from_the_newest_chunk(
    core: BrokerCore, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fresh_module, "FRESH_MAX", 4)
    for i in range(3):
        pend(core, "t", START_MS + 10 + i, n=2)
    fire_all(core, manual_clock, START_MS + 11)  # one chunk of 4: all held
    tid = core.topic_ids["t"]
    first_two = stored(core, tid, K.topic_range(tid)[0], 100)
    assert core.fresh_rows(tid, first_two[0][0], 10) == first_two
    fire_all(core, manual_clock, START_MS + 12)  # 6 > 4: only the newest chunk is held
    newest = stored(core, tid, K.next_key(first_two[-1][0]), 100)
    assert len(newest) == 2
    assert core.fresh_rows(tid, first_two[0][0], 10) is None
    assert core.fresh_rows(tid, newest[0][0], 10) == newest


def test_deleted_ready_keys_make_pulls_read_the_store(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    pend(core, "t", START_MS + 10, n=4)
    fire_all(core, manual_clock, START_MS + 10)
    tid = core.topic_ids["t"]
    rows = stored(core, tid, K.topic_range(tid)[0], 10)
    with core.lock:  # as retention trims: a range of ready keys goes
        batch = core.store.batch()
        batch.delete_range(rows[0][0], rows[2][0], core.store.handle[K.CF_READY])
        core.write(batch)
        core.forget_fresh(tid)
    assert core.fresh_rows(tid, rows[0][0], 10) is None
    assert stored(core, tid, rows[0][0], 10) == rows[2:]
    assert_fresh_is_stored(core, tid)


def test_a_reopened_core_holds_nothing_until_it_fires(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    c = BrokerCore(data_dir, manual_clock)
    try:
        pend(c, "t", START_MS + 10)
        fire_all(c, manual_clock, START_MS + 20)
        tid = c.topic_ids["t"]
        assert c.fresh_rows(tid, c.tails[tid], 1) is not None
    finally:
        c.close()
    c = BrokerCore(data_dir, manual_clock)
    try:
        assert c.fresh_rows(tid, c.tails[tid], 1) is None
        assert_fresh_is_stored(c, tid)
        pend(c, "t", START_MS + 30, n=2)  # after a fire it holds that chunk again
        fire_all(c, manual_clock, START_MS + 30)
        assert assert_fresh_is_stored(c, tid) > 0
    finally:
        c.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_fires_dead_letters_and_reopens_keep_fresh_rows_equal_to_the_store(
    data_dir: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """A random mix, on two topics: sends due now, later or before the fire position
    (an out-of-order fire), fires in small and big chunks, dead letters, reopens."""
    monkeypatch.setattr(fresh_module, "FRESH_MAX", 16)
    rng = random.Random(seed)
    c = BrokerCore(data_dir, manual_clock)
    try:
        for _ in range(60):
            topic = rng.choice(("a", "b"))
            now = manual_clock.now_ms()
            op = rng.random()
            if op < 0.45:
                due = now + rng.choice((0, 1, 5, 20)) if rng.random() < 0.9 else now - 3
                pend(c, topic, due, n=rng.randint(1, 6))
            elif op < 0.8:
                fire_all(c, manual_clock, now + rng.randint(0, 10), chunk=rng.choice((1, 3, 50)))
            elif op < 0.93:
                dead_letter(c, topic)
            else:
                c.close()
                c = BrokerCore(data_dir, manual_clock)
            for name in ("a", "b"):
                if name in c.topic_ids:
                    assert_fresh_is_stored(c, c.topic_ids[name])
    finally:
        c.close()
