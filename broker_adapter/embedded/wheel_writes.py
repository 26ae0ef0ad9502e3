"""WheelWrites: the embedded broker core's changes of the wheel, one write batch each.

A mixin of :class:`~broker_adapter.embedded.core.BrokerCore` (its methods are the
core's, on the core's state): adding entries (sends, retries, requeued dead
letters), appending dead letters to ``ready``, aborting and moving pending
entries. Each puts the new counters into its batch, and writes the held fires
first (:meth:`WheelWrites._write`; see the core's docstring), so the store never
has a change without the fires memory had before it. The methods marked *lock
held* are called with :attr:`BrokerCore.lock <broker_adapter.embedded.core.BrokerCore.lock>`
held from the first such call until the batch is written.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from broker_adapter.embedded import keys as K

if TYPE_CHECKING:
    from broker_adapter.embedded.counters import TopicCounters
    from broker_adapter.embedded.fire_writes import FireWrites
    from broker_adapter.embedded.fresh import FreshRows
    from broker_adapter.embedded.store import RocksStore
    from broker_adapter.embedded.timing_wheel import Entry, TimingWheel


class WheelWrites:
    """The core's writes of wheel entries (a mixin; the core sets the state below)."""

    if TYPE_CHECKING:
        _lock: threading.RLock
        _store: RocksStore
        _h_wheel: Any
        _h_ready: Any
        _h_meta: Any
        _counters: TopicCounters
        _fires: FireWrites
        _fresh: FreshRows
        _wheel: TimingWheel
        _prefixes: dict[int, bytes]
        _tails: dict[int, bytes]

        def now(self) -> int: ...
        def next_seq(self) -> int: ...
        def _written(self) -> RocksStore: ...

    def _write(self, batch: Any) -> None:
        """Apply ``batch`` after the held fires (lock held): the store never has a
        change without the fires memory had before it (its counters count them)."""
        self._written().write(batch)

    def write_pending(self, batch: Any, entries: Sequence[Entry]) -> None:
        """Add ``entries`` to the wheel: put them in ``batch``, count them pending, apply
        ``batch`` (with whatever else it holds), then note them in the near window
        (lock held, since their sequence numbers were reserved).

        :param entries: ``(wheel key, topic id, record)``, wheel keys from :meth:`take_seqs`.
        """
        h_wheel = self._h_wheel
        put = batch.put
        counts: dict[int, int] = {}
        for wkey, tid, record in entries:
            put(wkey, record, h_wheel)
            counts[tid] = counts.get(tid, 0) + 1
        self._counters.count(batch, self._h_meta, counts, fired=False)
        self._write(batch)
        schedule = self._wheel.schedule
        for entry in entries:
            schedule(*entry)

    def write_one(self, batch: Any, wkey: bytes, tid: int, record: bytes) -> None:
        """:meth:`write_pending` of the one entry ``(wkey, tid, record)``: the same puts
        in the same order, without the lists and loops a batch needs (a single send's
        path, issue 16; lock held)."""
        batch.put(wkey, record, self._h_wheel)
        self._counters.add_one(batch, self._h_meta, tid)
        (self._written() if self._fires.held else self._store).write(batch)
        self._wheel.schedule(wkey, tid, record)

    def write(self, batch: Any) -> None:
        """Apply ``batch``, one that adds nothing to the wheel (see :meth:`write_pending`);
        lock held if it was built with a *lock held* method."""
        with self._lock:
            self._write(batch)

    def append_ready(self, batch: Any, tid: int, at_ms: int, record: bytes) -> bytes:
        """Put ``record`` at the end of topic ``tid``'s ready keys in ``batch``, fired at
        broker time ``at_ms`` (a dead letter: counted as sent and fired); returns its
        wheel key (lock held until ``batch`` is written with :meth:`write`)."""
        wkey = K.wheel_key(at_ms, self.next_seq())
        ready_key = self._prefixes[tid] + wkey
        batch.put(ready_key, record, self._h_ready)
        self._counters.count(batch, self._h_meta, {tid: 1}, fired=False)
        self._counters.count(batch, self._h_meta, {tid: 1}, fired=True)
        self._fresh.drop(tid)  # not a fire: pulls read the store until the next one
        tail = self._tails.get(tid)
        if tail is None or ready_key > tail:
            self._tails[tid] = ready_key
        return wkey

    def abort_pending(self, wkey: bytes, tid: int, record: bytes) -> None:
        """Replace the pending wheel entry ``wkey`` of topic ``tid`` (holding ``record``)
        with an abort tombstone, in one write."""
        self.abort_many(((wkey, tid, record),))

    def abort_many(self, entries: Sequence[Entry]) -> None:
        """Replace pending wheel entries (read under :attr:`lock`, still held) with abort
        tombstones, all in one write."""
        if not entries:
            return
        store = self._store
        with self._lock:
            batch = store.batch()
            h_wheel, h_aborted = self._h_wheel, store.handle[K.CF_ABORTED]
            stamp = K.U64.pack(self.now())
            counts: dict[int, int] = {}
            for wkey, tid, record in entries:
                batch.delete(wkey, h_wheel)
                batch.put(wkey, stamp + record, h_aborted)
                counts[tid] = counts.get(tid, 0) - 1
            self._counters.count(batch, self._h_meta, counts, fired=False)
            self._write(batch)
            for wkey, _tid, _record in entries:
                self._wheel.cancel(wkey)

    def locate(self, first: bytes) -> bytes:
        """The current wheel key of the message first scheduled at ``first`` (see
        :mod:`~broker_adapter.embedded.keys`: ``first`` unless it was rescheduled); under
        :attr:`lock` for an answer no reschedule is changing."""
        return self._store.cf[K.CF_MOVES].get(first) or first

    def move_pending(self, batch: Any, old: bytes, entry: Entry) -> None:
        """Move a pending message from wheel key ``old`` to ``entry`` (a new wheel key from
        :meth:`next_seq`, same topic): delete, put and whatever ``batch`` holds (the
        move's record in ``moves``) in one write, then the same in the near window, so
        the wheel thread fires it at the new time only (lock held since ``old`` was
        read)."""
        batch.delete(old, self._h_wheel)
        batch.put(entry[0], entry[2], self._h_wheel)
        self._write(batch)
        self._wheel.cancel(old)
        self._wheel.schedule(*entry)


__all__ = ["WheelWrites"]
