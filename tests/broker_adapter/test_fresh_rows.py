"""BrokerCore.fresh_rows: what a pull reads from memory right after a fire is what the
store holds (real RocksDB directory), and it steps aside whenever it could differ."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import core as core_module
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import encode
from tests.conftest import START_MS


@pytest.fixture
def core(data_dir: Path, manual_clock: ManualClock) -> Iterator[BrokerCore]:
    c = BrokerCore(data_dir, manual_clock)
    try:
        yield c
    finally:
        c.close()


def pend(core: BrokerCore, topic: str, due_ms: int, n: int = 1) -> None:
    """Put ``n`` messages due at ``due_ms`` for ``topic`` on the wheel, as a send does."""
    with core.lock:
        tid = core.topic_id(topic)
        entries = []
        for _ in range(n):
            wkey = K.wheel_key(due_ms, core.take_seqs(1))
            record = encode(tid, 0, due_ms, core.now(), K.make_id(wkey, tid), b"", b"", b"", b"x")
            entries.append((wkey, tid, record))
        core.write_pending(core.store.batch(), entries)


def stored(core: BrokerCore, tid: int, cursor: bytes, limit: int) -> list[tuple[bytes, bytes]]:
    return core.store.scan(K.CF_READY, cursor, K.topic_range(tid)[1], limit)


def fire_all(core: BrokerCore, clock: ManualClock, until_ms: int) -> None:
    clock.set(until_ms)
    while core.fire_due(1000):
        pass


def test_rows_held_after_fires_are_the_stored_rows_from_any_cursor_they_cover(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    for i in range(5):  # five chunks: each fire appends to what is held
        pend(core, "t", START_MS + 10 + i, n=3)
    fire_all(core, manual_clock, START_MS + 100)
    tid = core.topic_ids["t"]
    everything = stored(core, tid, K.topic_range(tid)[0], 100)
    assert len(everything) == 15
    keys = [key for key, _ in everything]
    for at, key in enumerate(keys):
        for cursor in (key, key + b"\x00"):  # a key, and a cursor just past one
            first = at if cursor == key else at + 1
            for limit in (1, 4, 100):
                assert core.fresh_rows(tid, cursor, limit) == everything[first : first + limit]
                assert core.fresh_rows(tid, cursor, limit) == stored(core, tid, cursor, limit)
    # Older than what is held (the topic's very start): the store must be read.
    assert core.fresh_rows(tid, K.topic_range(tid)[0], 100) is None


def test_a_dead_letter_on_a_topic_makes_pulls_read_the_store(
    core: BrokerCore, manual_clock: ManualClock
) -> None:
    pend(core, "t", START_MS + 10, n=2)
    fire_all(core, manual_clock, START_MS + 20)
    tid = core.topic_ids["t"]
    last = core.tails[tid]
    assert core.fresh_rows(tid, last, 10) is not None
    with core.lock:  # a dead letter appended to the same topic's ready keys
        batch = core.store.batch()
        record = encode(tid, 1, START_MS + 20, START_MS, b"\x00" * 16, b"", b"", b"", b"d")
        core.append_ready(batch, tid, START_MS + 20, record)
        core.write(batch)
    assert core.fresh_rows(tid, last, 10) is None
    assert len(stored(core, tid, last, 10)) == 2  # the last fired one and the dead letter
    # The next fire starts what is held afresh, from its own chunk.
    pend(core, "t", START_MS + 30)
    fire_all(core, manual_clock, START_MS + 40)
    tail = core.tails[tid]
    assert core.fresh_rows(tid, tail, 10) == stored(core, tid, tail, 10)
    assert core.fresh_rows(tid, last, 10) is None


def test_what_is_held_is_bounded_and_restarts_from_the_newest_chunk(
    core: BrokerCore, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_module, "FRESH_MAX", 4)
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
    finally:
        c.close()
