"""DueIndex: a memory broker's pending first sends in due order, for ``find_pending``.

The wheel is a heap: good at "what is due next", no good at "the next 100 after
this position". The index keeps each pending first send (never fired, not
aborted) in a bucket of :data:`BUCKET_MS` of due time; bucket numbers are kept
sorted, and a bucket is sorted only when read. Reading on from a position
``(due, seq)`` therefore costs the buckets it passes, not the whole wheel; adding
and removing are O(1) (plus a sorted insert of a new bucket number).

For ``count_pending`` the index also counts its copies per *span* of
:data:`SPAN_MS` (~65 s) of due time, in all and per topic (two dict updates per
add or discard), so counting a week costs its ~9,000 spans, not its copies.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from broker_adapter.memory.records import Copy

#: Width of a bucket, ms of due time.
BUCKET_MS = 1_024
#: Width of a span, whose copies are counted (in all and per topic) for count_pending.
SPAN_MS = 64 * BUCKET_MS

#: A position in due order: ``(due_ms, seq)``.
Position = tuple[int, int]


class DueIndex:
    """Pending first copies by ``(due_ms, seq)`` (guarded by the store's lock)."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[int, Copy]] = {}
        self._numbers: list[int] = []  # sorted keys of _buckets
        self._size = 0
        # count_pending: copies per span, its sorted span numbers, per (topic, span)
        self._span_counts: dict[int, int] = {}
        self._spans: list[int] = []
        self._topic_counts: dict[tuple[str, int], int] = {}

    def __len__(self) -> int:
        """Copies indexed."""
        return self._size

    def add(self, copy: Copy) -> None:
        """Index ``copy`` (just scheduled)."""
        number = copy.due_ms // BUCKET_MS
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = {}
            bisect.insort(self._numbers, number)
        bucket[copy.seq] = copy
        self._size += 1
        self._count_span(copy, 1)

    def discard(self, copy: Copy) -> None:
        """Forget ``copy`` (fired, aborted or moved); nothing if it is not indexed."""
        number = copy.due_ms // BUCKET_MS
        bucket = self._buckets.get(number)
        if bucket is None or bucket.pop(copy.seq, None) is None:
            return
        self._size -= 1
        self._count_span(copy, -1)
        if not bucket:
            del self._buckets[number]
            del self._numbers[bisect.bisect_left(self._numbers, number)]

    def after(self, position: Position) -> Iterator[Copy]:
        """The copies after ``position`` in ``(due, seq)`` order; stop iterating when
        done (each bucket is sorted only when reached). Do not change the index while
        iterating."""
        numbers = self._numbers
        for i in range(bisect.bisect_left(numbers, position[0] // BUCKET_MS), len(numbers)):
            bucket = self._buckets[numbers[i]]
            for copy in sorted(bucket.values(), key=_order):
                if (copy.due_ms, copy.seq) > position:
                    yield copy

    def count_between(self, lo: int, hi: int, topic: str | None) -> int:
        """How many copies are due in ``[lo, hi)`` (of ``topic``'s messages only, if
        given), exactly. Whole spans of :data:`SPAN_MS` inside the range count from
        their counters; the ragged ends from the buckets (a bucket wholly inside
        and no topic: its size; else its copies). The cost is the non-empty spans in
        the range plus at most two spans' buckets, however many copies are indexed."""
        inner_lo = -(-lo // SPAN_MS) * SPAN_MS
        inner_hi = hi // SPAN_MS * SPAN_MS
        if inner_lo >= inner_hi:
            return self._count_fine(lo, hi, topic)
        total = self._count_fine(lo, inner_lo, topic) + self._count_fine(inner_hi, hi, topic)
        spans = self._spans
        first = bisect.bisect_left(spans, inner_lo // SPAN_MS)
        end = bisect.bisect_left(spans, inner_hi // SPAN_MS)
        if topic is None:
            counts = self._span_counts
            return total + sum(counts[spans[i]] for i in range(first, end))
        by_topic = self._topic_counts
        return total + sum(by_topic.get((topic, spans[i]), 0) for i in range(first, end))

    def _count_fine(self, lo: int, hi: int, topic: str | None) -> int:
        """:meth:`count_between` bucket by bucket (for a range within two spans)."""
        if lo >= hi:
            return 0
        numbers, buckets = self._numbers, self._buckets
        first = bisect.bisect_left(numbers, lo // BUCKET_MS)
        end = bisect.bisect_left(numbers, (hi - 1) // BUCKET_MS + 1)
        total = 0
        for i in range(first, end):
            bucket = buckets[numbers[i]]
            start = numbers[i] * BUCKET_MS
            if topic is None and lo <= start and start + BUCKET_MS <= hi:
                total += len(bucket)
            else:
                total += sum(
                    1
                    for c in bucket.values()
                    if lo <= c.due_ms < hi and (topic is None or c.message.topic == topic)
                )
        return total

    def _count_span(self, copy: Copy, delta: int) -> None:
        """Add ``delta`` to the counters of the span ``copy`` is due in."""
        span = copy.due_ms // SPAN_MS
        counts = self._span_counts
        n = counts.get(span, 0) + delta
        if n:
            if span not in counts:
                bisect.insort(self._spans, span)
            counts[span] = n
        else:
            del counts[span]
            del self._spans[bisect.bisect_left(self._spans, span)]
        key = (copy.message.topic, span)
        n = self._topic_counts.get(key, 0) + delta
        if n:
            self._topic_counts[key] = n
        else:
            del self._topic_counts[key]


def _order(copy: Copy) -> Position:
    return copy.due_ms, copy.seq


__all__ = ["BUCKET_MS", "SPAN_MS", "DueIndex", "Position"]
