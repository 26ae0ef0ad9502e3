"""DueIndex: a memory broker's pending first sends in due order, for ``find_pending``.

The wheel is a heap: good at "what is due next", no good at "the next 100 after
this position". The index keeps each pending first send (never fired, not
aborted) in a bucket of :data:`BUCKET_MS` of due time; bucket numbers are kept
sorted, and a bucket is sorted only when read. Reading on from a position
``(due, seq)`` therefore costs the buckets it passes, not the whole wheel; adding
and removing are O(1) (plus a sorted insert of a new bucket number).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from broker_adapter.memory.records import Copy

#: Width of a bucket, ms of due time.
BUCKET_MS = 1_024

#: A position in due order: ``(due_ms, seq)``.
Position = tuple[int, int]


class DueIndex:
    """Pending first copies by ``(due_ms, seq)`` (guarded by the store's lock)."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[int, Copy]] = {}
        self._numbers: list[int] = []  # sorted keys of _buckets
        self._size = 0

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

    def discard(self, copy: Copy) -> None:
        """Forget ``copy`` (fired, aborted or moved); nothing if it is not indexed."""
        number = copy.due_ms // BUCKET_MS
        bucket = self._buckets.get(number)
        if bucket is None or bucket.pop(copy.seq, None) is None:
            return
        self._size -= 1
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

    def count_between(
        self, lo: int, hi: int, topic: str | None, budget: int
    ) -> tuple[int, bool, int]:
        """How many copies are due in ``[lo, hi)`` (of ``topic``'s messages only, if
        given): ``(count, exact, work)``. A bucket wholly inside the range counts as
        one step of work without a topic, else each copy looked at counts one. Past
        ``budget`` steps the rest of the range is extrapolated from the density of
        the part counted (``exact`` false)."""
        numbers, buckets = self._numbers, self._buckets
        first = bisect.bisect_left(numbers, lo // BUCKET_MS)
        end = bisect.bisect_left(numbers, (hi - 1) // BUCKET_MS + 1)
        total = work = 0
        for i in range(first, end):
            number = numbers[i]
            bucket = buckets[number]
            start = number * BUCKET_MS
            if topic is None and lo <= start and start + BUCKET_MS <= hi:
                total += len(bucket)
                work += 1
            else:
                total += sum(
                    1
                    for c in bucket.values()
                    if lo <= c.due_ms < hi and (topic is None or c.message.topic == topic)
                )
                work += len(bucket)
            if work >= budget and i + 1 < end:
                covered = start + BUCKET_MS - lo
                return total + round(total * (hi - lo - covered) / covered), False, work
        return total, True, work


def _order(copy: Copy) -> Position:
    return copy.due_ms, copy.seq


__all__ = ["BUCKET_MS", "DueIndex", "Position"]
