"""DueIndex.count_between (memory://'s count_pending) against a brute-force count:
copies of several topics added and discarded at random over many spans, ranges
that start and end inside spans, cover whole ones or fall within one bucket."""

from __future__ import annotations

import random

from broker_adapter.memory.due_index import BUCKET_MS, SPAN_MS, DueIndex
from broker_adapter.memory.records import Copy, StoredMessage


def _copy(topic: str, due: int, seq: int) -> Copy:
    msg = StoredMessage(f"m{seq}", topic, b"", None, None, {}, due, due, 0, 0)
    return Copy(msg, topic, due, 0, seq)


def test_counts_equal_a_brute_force_count() -> None:
    rng = random.Random(3)
    index = DueIndex()
    live: dict[int, Copy] = {}
    for seq in range(6_000):
        due = rng.randrange(40 * SPAN_MS)
        copy = _copy(rng.choice("abc"), due, seq)
        index.add(copy)
        live[seq] = copy
        if rng.random() < 0.3:  # fired, aborted or moved
            gone = live.pop(rng.choice(list(live)))
            index.discard(gone)
    ranges = [(0, 40 * SPAN_MS), (SPAN_MS, 2 * SPAN_MS), (5, 6), (BUCKET_MS - 1, BUCKET_MS + 1)]
    for _ in range(100):
        lo = rng.randrange(41 * SPAN_MS)
        ranges.append((lo, lo + rng.choice((1, 700, BUCKET_MS, SPAN_MS + 13, 9 * SPAN_MS))))
    for lo, hi in ranges:
        for topic in (None, "a", "c", "zz"):
            want = sum(1 for c in live.values() if lo <= c.due_ms < hi and topic in (None, c.topic))
            assert index.count_between(lo, hi, topic) == want, (lo, hi, topic)
    for copy in list(live.values()):
        index.discard(copy)
    assert index.count_between(0, 50 * SPAN_MS, None) == 0
    assert index.count_between(0, 50 * SPAN_MS, "a") == 0
