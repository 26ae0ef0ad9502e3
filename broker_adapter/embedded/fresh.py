"""FreshRows: the entries a fire just wrote to ``ready``, held for the pulls that follow.

A pull right after a fire would otherwise scan the store (two RocksDB iterators,
~5 us) for the few entries the fire has in hand: reading them from memory saved
~5 % of a steady consumer's CPU per message at 2,000 messages/s (issue 16,
``bench/burst_drain.py --spread-s``).

What is held for a topic (at most :data:`FRESH_MAX` keys) is *every* stored ready
key of the topic from the first held one on, in order, so a read from a cursor at
or after the first held key returns what a scan of the store would. That holds by
construction: only a fire adds (after its write, broker lock held); a fired chunk
starts the held list afresh when its first key lies above the topic's tail (the
greatest stored ready key), is appended only when the held list ends at that tail,
and a chunk written at or below the tail drops the topic's list (a scan would find
its keys among the held ones). The broker drops a topic's list when anything else
writes or deletes its ready keys (a dead letter, retention) and all of them on a
reload. Lists are appended to (records first) and never shortened, so a reader
without the lock sees a consistent prefix.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

#: Most fired entries held per topic (~250 B each: its key and record).
FRESH_MAX = 4096

#: topic id -> (ready keys, records), each in key order.
Chunk = Mapping[int, tuple[list[bytes], list[bytes]]]


def last_from(keys: list[bytes], cursor: bytes, end: int) -> int:
    """``bisect_left(keys, cursor, 0, end)`` searched from ``end`` back in growing steps:
    a pull's cursor is at or near the end of what was fired (the chunk it waits for),
    so this reads the last few keys rather than a bisection's dozen cold ones."""
    step = 1
    hi = end
    while True:
        at = hi - step
        if at <= 0:
            return bisect.bisect_left(keys, cursor, 0, hi)
        if keys[at] < cursor:
            return bisect.bisect_left(keys, cursor, at + 1, hi)
        hi = at
        step += step


class FreshRows:
    """The newest fired entries per topic; written under the broker lock, read by any thread."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[list[bytes], list[bytes]]] = {}

    def clear(self) -> None:
        """Hold nothing (the store was reloaded)."""
        self._held.clear()

    def drop(self, tid: int) -> None:
        """Hold nothing of topic ``tid`` until its next fire."""
        self._held.pop(tid, None)

    def keep(self, chunk: Chunk, tails: dict[int, bytes]) -> None:
        """After a fire's write: note its ``chunk`` and move the topics' ``tails`` (topic
        id -> greatest stored ready key, read before this chunk) to its keys (broker
        lock held). The chunk's lists are kept, not copied: the caller lets go of them.
        """
        held = self._held
        for tid, (keys, records) in chunk.items():
            tail = tails.get(tid)
            if tail is not None and keys[0] <= tail:
                # Written below the tail (not in key order: nothing fires so today, but
                # a store scan would find these keys where a held list would not).
                held.pop(tid, None)
                if keys[-1] > tail:
                    tails[tid] = keys[-1]
                continue
            old = held.get(tid)
            if old is not None and old[0][-1] == tail and len(old[0]) + len(keys) <= FRESH_MAX:
                # Records first: a reader bounded by the keys' length finds each record.
                old[1].extend(records)
                old[0].extend(keys)
            else:  # every stored key from keys[0] on is in this chunk
                held[tid] = (keys, records)
            tails[tid] = keys[-1]

    def rows(self, tid: int, cursor: bytes, limit: int) -> list[tuple[bytes, bytes]] | None:
        """Up to ``limit`` ``(ready key, record)`` pairs of topic ``tid`` from ``cursor`` on,
        as a scan of the store would return them; ``None`` when the store must be read
        (nothing held, or ``cursor`` before the first held key). Any thread, no lock."""
        held = self._held.get(tid)
        if held is None:
            return None
        keys, records = held
        end = len(keys)
        if not end or cursor < keys[0]:
            return None
        at = last_from(keys, cursor, end)
        stop = min(end, at + limit)
        return list(zip(keys[at:stop], records[at:stop], strict=True))


__all__ = ["FRESH_MAX", "Chunk", "FreshRows", "last_from"]
