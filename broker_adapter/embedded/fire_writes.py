"""FireWrites: how a fire reaches the store, and the fires held in memory until then.

A fire moves due entries from ``wheel`` to their topics' ``ready`` keys: it
deletes their wheel keys (a big chunk with one range tombstone), puts the ready
rows, moves the counters from pending to fired and stores the new fire position,
all in one write batch. The broker's memory (tails, fresh rows, counters, fire
position) changes at once, so pulls hand the fired messages out from memory
(:class:`~.fresh.FreshRows`).

**Held fires** (issue 16). At ~1 job per due millisecond each fire's write ran
right after a timed wait, on memory the wait left cold: ~52 us of CPU against
7.4 us back to back (``bench/wake_cost.py``). So a fire made by a pull (``hold``)
adds its operations to one *held* batch, written once it is
:attr:`FireWrites.hold_ms` old by a pull about to wait (a quiet moment, not on
the way to a job's start), by the wheel thread when no pull does, or by the fire
that would hold more than :data:`HOLD_MAX` entries: one write per ~``hold_ms``
instead of one per due millisecond.

The core keeps the one invariant this needs (see
:class:`~broker_adapter.embedded.core.BrokerCore`): the store is always an
earlier state of the broker, never a mix. Every write of the core writes the
held batch first, and ``BrokerCore.store``, the way to the store for everything
else, writes it before handing the store out. A reader therefore never sees a
fired message as pending (an abort never answers ``ABORTED`` for a message a pull
has), and a ``kill -9`` loses at most the held batch: its entries are still in
``wheel`` on disk, so the restart fires them again (at least once).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.counters import TopicCounters
from broker_adapter.embedded.fresh import FreshRows
from broker_adapter.embedded.store import RocksStore
from broker_adapter.embedded.timing_wheel import Entry

#: Default of :attr:`FireWrites.hold_ms`: how old held fires get before a pull about
#: to wait (or the wheel thread) writes them (0: every fire writes at once).
DEFAULT_HOLD_MS = 10
#: Most entries held (a burst's chunks, ~1,000 each, gain little from holding): a
#: fire that leaves more held writes them all.
HOLD_MAX = 256
# A fired chunk this big deletes its wheel keys with one range tombstone.
_RANGE_DELETE_MIN = 256


class FireWrites:
    """Builds each fire's write batch, and writes it at once or holds it (broker lock
    held for every call).

    :param store: the store the fires go to.
    :param counters: the topics' counters (a fire moves pending to fired).
    :param fresh: the fired rows pulls read from memory.
    :param tails: topic id -> greatest ready key (the core's; a fire moves it).
    :param prefixes: topic id -> its key prefix (the core's).
    :param hold_ms: see :data:`DEFAULT_HOLD_MS`.
    """

    def __init__(
        self,
        store: RocksStore,
        counters: TopicCounters,
        fresh: FreshRows,
        tails: dict[int, bytes],
        prefixes: dict[int, bytes],
        hold_ms: int = DEFAULT_HOLD_MS,
    ) -> None:
        self._store = store
        self._counters = counters
        self._fresh = fresh
        self._tails = tails
        self._prefixes = prefixes
        self.hold_ms = hold_ms
        self._hold_s = hold_ms / 1000
        self._batch: Any = None  # the held batch, or None
        #: Entries fired and not yet written (0: nothing held).
        self.held = 0
        self._since = 0.0  # time.monotonic() when the held batch was started

    def fire(
        self, entries: Sequence[Entry], upto: bytes, handles: tuple[Any, Any, Any], hold: bool
    ) -> tuple[dict[int, int], bool]:
        """Fire ``entries`` (popped from the wheel, in key order; every wheel key
        below ``upto``, the fire position before them, fired or was aborted): change
        the memory and write, or hold with ``hold``. Returns how many fired per
        topic id, and whether this started a held batch (the wheel thread then has
        to be up by :meth:`write_by` in case no pull writes it).

        :param handles: the ``wheel``, ``ready`` and ``meta`` family handles.
        :raises ChronoqError: the write failed; the fire stays held (memory has
            it), the next write tries again.
        """
        h_wheel, h_ready, h_meta = handles
        started = self._batch is None
        batch = self._store.batch() if started else self._batch
        prefix = self._prefixes
        chunk: dict[int, tuple[list[bytes], list[bytes]]] = {}
        # Everything below the last fired key has now fired or was aborted, so a
        # big chunk is one range tombstone; small ones stay point deletes
        # (many range tombstones in a memtable slow reads down).
        ranged = len(entries) >= _RANGE_DELETE_MIN
        if ranged:
            batch.delete_range(upto, K.next_key(entries[-1][0]), h_wheel)
        put = batch.put
        last_tid, head = -1, b""
        keys: list[bytes] = []
        records: list[bytes] = []
        for wkey, tid, record in entries:
            if not ranged:
                batch.delete(wkey, h_wheel)
            if tid != last_tid:  # a chunk is mostly one topic
                rows = chunk.get(tid)
                if rows is None:
                    rows = chunk[tid] = ([], [])
                keys, records = rows
                last_tid, head = tid, prefix[tid]
            ready_key = head + wkey
            put(ready_key, record, h_ready)
            keys.append(ready_key)
            records.append(record)
        counts = {tid: len(rows[0]) for tid, rows in chunk.items()}
        self._counters.count(batch, h_meta, counts, fired=True)
        batch.put(K.META_FIRED_UPTO, K.next_key(entries[-1][0]), h_meta)
        self._fresh.keep(chunk, self._tails)  # memory first: a failed write leaves it held
        if started:
            self._since = time.monotonic()
        if hold and self._hold_s and self.held + len(entries) < HOLD_MAX:
            self._batch = batch
            self.held += len(entries)
            return counts, started
        try:
            self._store.write(batch, lazy=True)
        except BaseException:
            self._batch = batch  # held: the next write tries again
            self.held += len(entries)
            raise
        # (a fire that found nothing held leaves held at 0 meanwhile: readers of
        # BrokerCore.store do not queue on the lock for a write they need not wait for)
        self._batch = None
        self.held = 0
        return counts, False

    def write(self) -> None:
        """Write the held batch, if any.

        :raises ChronoqError: the write failed; it stays held.
        """
        if self._batch is not None:
            self._store.write(self._batch, lazy=True)
            self._batch = None
            self.held = 0

    def write_old(self) -> None:
        """Write the held batch if it is :attr:`hold_ms` old (a pull about to wait, or
        the wheel thread's turn)."""
        if self._batch is not None and time.monotonic() - self._since >= self._hold_s:
            self.write()

    def write_by(self) -> float | None:
        """Seconds from now until the held batch is :attr:`hold_ms` old (negative
        once past); ``None`` when nothing is held."""
        if self._batch is None:
            return None
        return self._since + self._hold_s - time.monotonic()

    def drop(self) -> None:
        """Forget the held batch (the store was reloaded: its entries fire again)."""
        self._batch = None
        self.held = 0


__all__ = ["DEFAULT_HOLD_MS", "HOLD_MAX", "FireWrites"]
