"""The searches of the firing pull's hot path (issue 16): the timing wheel's
``due_end`` (the due entries at a run's head) and fresh rows' ``last_from`` (a
pull's cursor near the end of what was fired) answer exactly as ``bisect_left``,
for every probe and bound, on sorted lists of the shapes they get; and a
consumer's ``has_new`` hint agrees with what a take finds (real RocksDB directory)."""

from __future__ import annotations

import random
from bisect import bisect_left
from pathlib import Path

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.consumer import EmbeddedConsumer
from broker_adapter.embedded.fresh import last_from
from broker_adapter.embedded.timing_wheel import Entry, due_end
from broker_adapter.message import Message
from tests.conftest import START_MS
from tests.helpers import eventually


def wheel_run(rng: random.Random, n: int) -> list[Entry]:
    """A sorted run of ``n`` wheel entries, several due in the same millisecond."""
    keys = sorted(K.wheel_key(START_MS + rng.randrange(50), seq) for seq in range(n))
    return [(key, 1, b"r") for key in keys]


def test_due_end_is_bisect_left_for_every_bound_and_window() -> None:
    rng = random.Random(16)
    for n in (0, 1, 2, 3, 7, 64, 300):
        run = wheel_run(rng, n)
        for ms in range(START_MS - 1, START_MS + 52):
            probe = (K.wheel_key(ms, 0),)
            for lo in {0, n // 3, n // 2, n}:
                for hi in {lo, min(n, lo + 1), min(n, lo + 5), n}:
                    assert due_end(run, probe, lo, hi) == bisect_left(run, probe, lo, hi)


def test_last_from_is_bisect_left_for_every_cursor() -> None:
    rng = random.Random(19)
    for n in (1, 2, 3, 5, 8, 100, 1000):
        keys = sorted(
            {K.wheel_key(START_MS + rng.randrange(4 * n), rng.randrange(9)) for _ in range(n)}
        )
        cursors = [keys[0][:-1], *keys, *(k + b"\x00" for k in keys), b"\xff" * 17]
        for end in {1, len(keys) // 2 or 1, len(keys)}:
            for cursor in cursors:
                assert last_from(keys, cursor, end) == bisect_left(keys, cursor, 0, end)


def test_has_new_says_whether_a_take_finds_messages(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    with EmbeddedBroker(tmp_path / "b", clock=clock) as broker:
        consumer = broker.consumer("g", ["t"])
        assert isinstance(consumer, EmbeddedConsumer)
        assert not consumer.has_new()
        broker.send(Message(topic="t", body=b"1", delay_ms=10))
        assert not consumer.has_new()  # pending, not fired
        clock.advance(10)  # the wheel thread fires (a manual clock)
        eventually(consumer.has_new, what="the fired message's tail")
        assert [m.body for m in consumer.pull(10, 0)] == [b"1"]
        assert not consumer.has_new()
        assert consumer.pull(10, 0) == []
