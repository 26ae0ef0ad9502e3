"""TopicCounters: per topic, the messages pending on the wheel and those ever fired.

Both live in memory and, as absolute values, in ``meta`` (``O`` + topic prefix ->
pending, fired): every change puts the new values into the write batch that makes
it, so a batch carries the counters as they are after it. Batches must then be
written in the order they were built: the caller holds the broker lock from the
first change until its batch is written (see :mod:`~broker_adapter.embedded.core`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.store import RocksStore


class TopicCounters:
    """The pending and fired counters of every topic (broker lock held to change them).

    :param prefixes: topic id -> its 2-byte key prefix (the core's live mapping).
    """

    def __init__(self, prefixes: Mapping[int, bytes]) -> None:
        self._prefixes = prefixes
        self._pending: dict[int, int] = {}
        self._fired: dict[int, int] = {}

    def load(self, store: RocksStore) -> None:
        """Read the stored counters, dropping what memory had (a write that failed may
        have left memory ahead of the store)."""
        self._pending.clear()
        self._fired.clear()
        for key, value in store.scan(K.CF_META, K.META_COUNTERS, b"O", 1 << 30):
            tid = int(K.U16.unpack_from(key, 1)[0])
            self._pending[tid], self._fired[tid] = K.U64X2.unpack(value)

    def count(self, batch: Any, h_meta: Any, counts: Mapping[int, int], fired: bool) -> None:
        """Add ``counts`` (topic id -> n) to the pending counters, or with ``fired`` move
        them from pending to fired; in memory now and in ``batch`` (family ``h_meta``)."""
        prefixes, pending, fired_of = self._prefixes, self._pending, self._fired
        for tid, n in counts.items():
            if fired:
                pending[tid] = pending.get(tid, 0) - n
                fired_of[tid] = fired_of.get(tid, 0) + n
            else:
                pending[tid] = pending.get(tid, 0) + n
            value = K.U64X2.pack(max(pending[tid], 0), fired_of.get(tid, 0))
            batch.put(K.META_COUNTERS + prefixes[tid], value, h_meta)

    def add_one(self, batch: Any, h_meta: Any, tid: int) -> None:
        """:meth:`count` of one new pending message of topic ``tid``, without the dict
        (a single send's path, issue 16)."""
        pending = self._pending
        n = pending[tid] = pending.get(tid, 0) + 1
        value = K.U64X2.pack(n if n > 0 else 0, self._fired.get(tid, 0))  # noqa: FURB136
        batch.put(K.META_COUNTERS + self._prefixes[tid], value, h_meta)

    def known(self, tid: int) -> bool:
        """Whether topic ``tid`` has counters (a message was ever sent, retried or
        dead-lettered to it)."""
        return tid in self._pending

    def pending(self, tid: int) -> int:
        """Messages of topic ``tid`` waiting on the wheel."""
        return max(self._pending.get(tid, 0), 0)

    def fired(self, tid: int) -> int:
        """Messages ever fired into topic ``tid`` (dead letters included)."""
        return self._fired.get(tid, 0)


__all__ = ["TopicCounters"]
