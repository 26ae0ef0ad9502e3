"""BrokerCore: the state every part of the embedded broker shares, behind one lock.

The core owns the RocksDB store, the broker lock, sequence numbers, the pending
and fired counters, the topic registry (ids, names, key prefixes), each topic's
tail in ``ready``, the fire position (``fired_upto``), the timing wheel and the
wheel thread's wake-ups. The helpers (:class:`~.group_registry.GroupRegistry`,
:class:`~.consumer.EmbeddedConsumer`, :class:`~.query.MessageQuery`,
:class:`~.retention.Retention`, :class:`~.firing.WheelThread`) and the broker
itself use only the public API below.

Lock order (the only place it is written down; every lock of the embedded broker):

1. ``GroupRegistry``'s lock (group creation and subscription);
2. a ``ConsumerGroup.lock`` (one group's cursors and in-flight messages);
3. the broker lock, :attr:`BrokerCore.lock` (wheel, sequence numbers, topics,
   counters, tails, fire position);
4. leaf locks, held for a few instructions and never while taking another: the
   wake-up condition of the wheel thread (:meth:`BrokerCore.kick`) and the ready
   signal of waiting pulls (:class:`~.consumer.ReadySignal`).

A thread may skip levels but never goes up. The core keeps its half of the rule
by construction: it imports nothing of the groups and calls out to nobody while
holding its lock (:meth:`BrokerCore.fire_due` returns what fired instead of telling
the groups). Its methods that do a whole change take the (reentrant) lock
themselves. The ones that help a caller build a write batch say *lock held*
(:meth:`~BrokerCore.take_seqs`, :meth:`~BrokerCore.next_seq`,
:meth:`~BrokerCore.append_ready`, :meth:`~BrokerCore.write_pending`,
:meth:`~BrokerCore.move_pending`): the caller
holds :attr:`BrokerCore.lock` from its first such call until the batch is written,
because a batch carries counters as absolute values, so batches must be written in
the order they were built (and re-taking the lock per call would cost a send ~5 %).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from broker_adapter.clock import Clock, SystemClock
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.fresh import FreshRows
from broker_adapter.embedded.store import RocksStore
from broker_adapter.embedded.timing_wheel import Entry, TimingWheel
from broker_adapter.errors import InvalidArgument

#: Sequence numbers reserved (persisted as a high-water mark) per write of ``meta``.
SEQ_BLOCK = 1 << 20
#: How long the wheel thread sleeps past a due time a waiting pull fires itself
#: (:meth:`BrokerCore.take_fire_duty`): it fires then only if no pull did (the
#: dispatcher stopped pulling, e.g. every slot busy). Longer: fewer idle wakes
#: (at 1,000 jobs/s, 4 ms cost the wheel thread 35 us of CPU per job, 20 ms 10 us).
FIRE_DUTY_GRACE_MS = 20
# A fired chunk this big deletes its wheel keys with one range tombstone.
_RANGE_DELETE_MIN = 256


class BrokerCore:
    """The shared state of one embedded broker's data directory.

    The attributes below are read-only views for hot loops (an attribute read, not a
    call); what changes them is the core's methods.

    :ivar store: the RocksDB store; its ``meta``, ``consume``, ``keys`` and ``ready``
        families are free for all to read, and to write where no core state is involved
        (cursors, group notes, subscriptions).
    :ivar lock: the broker lock (level 3 of the lock order): hold it to make several
        core calls one atomic step; never take a group lock while holding it.
    :ivar topic_ids: topic name -> id.
    :ivar topic_names: topic id -> name.
    :ivar prefixes: topic id -> its 2-byte key prefix.
    :ivar tails: topic id -> its greatest ``ready`` key (a pull skips a topic whose
        cursor is past its tail without reading the store).
    :param path: data directory; one process owns it at a time.
    :param clock: the time source; the core subscribes :meth:`kick` to it.
    :param durability: see :data:`~broker_adapter.embedded.store.DURABILITY_MODES`.
    :param window_ms: the near window of the timing wheel held in memory.
    :raises BrokerLocked: when another process owns ``path``.
    :raises InvalidArgument: for an unknown ``durability``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        clock: Clock,
        *,
        durability: str = "wal",
        window_ms: int = 1000,
    ) -> None:
        store = self._store = RocksStore(path, durability)
        self._clock = clock
        self._lock = threading.RLock()
        self._window_ms = window_ms
        self._topic_ids: dict[str, int] = {}
        self._topic_names: dict[int, str] = {}
        self._prefixes: dict[int, bytes] = {}
        self._pending: dict[int, int] = {}
        self._fired: dict[int, int] = {}
        self._tails: dict[int, bytes] = {}
        self._fresh = FreshRows()  # the newest fired entries per topic, for pulls
        self.store: RocksStore = store
        self.lock: threading.RLock = self._lock
        self.topic_ids: Mapping[str, int] = self._topic_ids
        self.topic_names: Mapping[int, str] = self._topic_names
        self.prefixes: Mapping[int, bytes] = self._prefixes
        self.tails: Mapping[int, bytes] = self._tails
        self._last_now = 0
        # Family handles of the hot paths, set by _load_state; dropped in close() (they
        # keep the DB open).
        self._h_wheel: Any = None
        self._h_ready: Any = None
        self._h_meta: Any = None
        try:
            self._load_state()
        except BaseException:  # a corrupt directory: do not leave it locked
            self._h_wheel = self._h_ready = self._h_meta = None
            store.close()
            raise
        self._wake = threading.Condition(threading.Lock())
        # The system clock's ms reading floors: the wheel thread reads time.time() to
        # wake at a due millisecond's start, not up to 1 ms after it (issue 16).
        self._wall = isinstance(clock, SystemClock)
        self._duty_ms = 0  # a pull fires what is due up to then itself (broker ms)
        self._kicked = False
        self._planned_wake = 0
        clock.subscribe(self.kick)

    def _load_state(self) -> None:
        """Read the in-memory state from the store: on open, and after a reopen (writes
        refused meanwhile may have left the memory ahead of the store)."""
        store = self._store
        handle = store.handle
        self._h_wheel = handle[K.CF_WHEEL]
        self._h_ready = handle[K.CF_READY]
        self._h_meta = handle[K.CF_META]
        for key, value in store.scan(K.CF_META, K.META_TOPIC, b"U", 1 << 30):
            self._remember_topic(key[1:].decode(), int(K.U16.unpack(value)[0]))
        self._pending.clear()  # counters of writes that failed go too
        self._fired.clear()
        for key, value in store.scan(K.CF_META, K.META_COUNTERS, b"O", 1 << 30):
            tid = int(K.U16.unpack_from(key, 1)[0])
            self._pending[tid], self._fired[tid] = K.U64X2.unpack(value)
        seq = store.cf[K.CF_META].get(K.META_SEQ)
        self._seq = self._seq_hi = int(K.U64.unpack(seq)[0]) if seq else 1
        fired_upto = store.cf[K.CF_META].get(K.META_FIRED_UPTO) or K.wheel_key(0, 0)
        self._fired_upto: bytes = fired_upto
        self._last_now = max(self._last_now, K.wheel_time(fired_upto))
        self._fresh.clear()  # what the store has is read from it from now on
        for tid in self._topic_names:
            lo, hi = K.topic_range(tid)
            tail = store.last_key(K.CF_READY, lo, hi)
            if tail is not None:
                self._tails[tid] = tail
        self._wheel = TimingWheel(store, fired_upto, window_ms=self._window_ms)

    def resume_writes(self) -> bool:
        """Whether the store takes writes; after a full disk, try (at most every
        :data:`~.store.RESUME_PROBE_S`, when there seems to be room) to reopen it and
        reload the in-memory state, behind the broker lock. Called by the wheel thread
        and before a send, so writing resumes by itself once space is freed."""
        store = self._store
        if store.writable:
            return True
        with self._lock:
            if store.writable or not store.resume_due():
                return store.writable
            self._h_wheel = self._h_ready = self._h_meta = None  # or the old DB stays open
            resumed = store.resume()
            if resumed:
                self._load_state()
            else:  # read-only meanwhile: reads go on
                self._h_wheel, self._h_ready, self._h_meta = (
                    store.handle.get(K.CF_WHEEL),
                    store.handle.get(K.CF_READY),
                    store.handle.get(K.CF_META),
                )
            return resumed

    @property
    def fired_upto(self) -> bytes:
        """The fire position: every wheel key below it has fired or was aborted."""
        return self._fired_upto

    # -- topics, time, sequence numbers ------------------------------------------------

    def _remember_topic(self, name: str, tid: int) -> None:
        self._topic_ids[name] = tid
        self._topic_names[tid] = name
        self._prefixes[tid] = K.tid_bytes(tid)

    def topic_id(self, name: str) -> int:
        """The id of topic ``name``, registered durably on first use.

        :raises InvalidArgument: when the broker has :data:`~.keys.MAX_TOPICS` already.
        """
        tid = self._topic_ids.get(name)
        if tid is not None:
            return tid
        with self._lock:
            tid = self._topic_ids.get(name)
            if tid is None:
                tid = len(self._topic_ids) + 1
                if tid > K.MAX_TOPICS:
                    raise InvalidArgument(f"this broker already has {K.MAX_TOPICS} topics")
                self._store.put(K.CF_META, K.META_TOPIC + name.encode(), K.U16.pack(tid))
                self._remember_topic(name, tid)
            return tid

    def now(self) -> int:
        """Broker time in epoch ms: the clock, never going backwards (so new keys stay
        at or after the fire position)."""
        now = self._clock.now_ms()
        if now < self._last_now:
            return self._last_now
        self._last_now = now
        return now

    def clock_ms(self) -> int:
        """The clock's own reading, which may be behind :meth:`now` after the clock
        stepped back."""
        return self._clock.now_ms()

    def after(self, delay_ms: int) -> int:
        """The due time ``delay_ms`` from now: counted from the clock, so after a
        backward step a delay is not made longer by the step (broker time waits at its
        high-water mark meanwhile), and never before :meth:`now` (a delay shorter
        than the step is due at once)."""
        return max(self.now(), self._clock.now_ms() + delay_ms)

    def take_seqs(self, n: int) -> int:
        """Reserve ``n`` consecutive sequence numbers; returns the first (lock held). A
        block is made durable before it is handed out, so no number is used twice
        across a reopen."""
        seq = self._seq
        if seq + n >= self._seq_hi:
            hi = seq + n + SEQ_BLOCK
            self._store.put(K.CF_META, K.META_SEQ, K.U64.pack(hi))
            self._seq_hi = hi
        self._seq = seq + n
        return seq

    def next_seq(self) -> int:
        """One new sequence number (lock held; see :meth:`take_seqs`)."""
        return self.take_seqs(1)

    # -- counters ----------------------------------------------------------------------

    def _count(self, batch: Any, counts: Mapping[int, int], fired: bool = False) -> None:
        """Add ``counts`` (topic id -> n) to the pending counters, or with ``fired`` move
        them from pending to fired; in memory now and in ``batch`` (lock held)."""
        h_meta = self._h_meta
        prefixes, pending, fired_of = self._prefixes, self._pending, self._fired
        for tid, n in counts.items():
            if fired:
                pending[tid] = pending.get(tid, 0) - n
                fired_of[tid] = fired_of.get(tid, 0) + n
            else:
                pending[tid] = pending.get(tid, 0) + n
            value = K.U64X2.pack(max(pending[tid], 0), fired_of.get(tid, 0))
            batch.put(K.META_COUNTERS + prefixes[tid], value, h_meta)

    def had_messages(self, tid: int) -> bool:
        """Whether a message was ever sent, retried or dead-lettered to topic ``tid`` (its
        counters exist); a topic only subscribed to has an id but no counters."""
        return tid in self._pending

    def pending_count(self, tid: int) -> int:
        """Messages of topic ``tid`` waiting on the wheel."""
        return max(self._pending.get(tid, 0), 0)

    def fired_count(self, tid: int) -> int:
        """Messages ever fired into topic ``tid`` (dead letters included)."""
        return self._fired.get(tid, 0)

    # -- writing -----------------------------------------------------------------------

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
        self._count(batch, counts)
        self._store.write(batch)
        schedule = self._wheel.schedule
        for entry in entries:
            schedule(*entry)

    def write_one(self, batch: Any, wkey: bytes, tid: int, record: bytes) -> None:
        """:meth:`write_pending` of the one entry ``(wkey, tid, record)``: the same puts
        in the same order, without the lists and loops a batch needs (a single send's
        path, issue 16; lock held)."""
        batch.put(wkey, record, self._h_wheel)
        pending = self._pending
        n = pending[tid] = pending.get(tid, 0) + 1
        value = K.U64X2.pack(n if n > 0 else 0, self._fired.get(tid, 0))  # noqa: FURB136
        batch.put(K.META_COUNTERS + self._prefixes[tid], value, self._h_meta)
        self._store.write(batch)
        self._wheel.schedule(wkey, tid, record)

    def write(self, batch: Any) -> None:
        """Apply ``batch``, one that adds nothing to the wheel (see :meth:`write_pending`);
        lock held if it was built with a *lock held* method."""
        self._store.write(batch)

    def append_ready(self, batch: Any, tid: int, at_ms: int, record: bytes) -> bytes:
        """Put ``record`` at the end of topic ``tid``'s ready keys in ``batch``, fired at
        broker time ``at_ms`` (a dead letter: counted as sent and fired); returns its
        wheel key (lock held until ``batch`` is written with :meth:`write`)."""
        wkey = K.wheel_key(at_ms, self.next_seq())
        ready_key = self._prefixes[tid] + wkey
        batch.put(ready_key, record, self._h_ready)
        self._count(batch, {tid: 1})
        self._count(batch, {tid: 1}, fired=True)
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
            self._count(batch, counts)
            store.write(batch)
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
        self._store.write(batch)
        self._wheel.cancel(old)
        self._wheel.schedule(*entry)

    # -- firing ------------------------------------------------------------------------

    def fire_due(self, limit: int) -> dict[int, int]:
        """Move up to ``limit`` due wheel entries to their topics' ready keys in one lazy
        write; returns how many fired per topic id (empty: nothing was due). The caller
        tells the groups, after this returns (no group lock under the broker lock)."""
        store = self._store
        counts: dict[int, int] = {}
        with self._lock:
            entries = self._wheel.pop_due(self.now(), limit)
            if not entries:
                return counts
            batch = store.batch()
            h_wheel, h_ready = self._h_wheel, self._h_ready
            prefix = self._prefixes
            chunk: dict[int, tuple[list[bytes], list[bytes]]] = {}
            # Everything below the last fired key has now fired or was aborted, so a
            # big chunk is one range tombstone; small ones stay point deletes
            # (many range tombstones in a memtable slow reads down).
            ranged = len(entries) >= _RANGE_DELETE_MIN
            if ranged:
                batch.delete_range(self._fired_upto, K.next_key(entries[-1][0]), h_wheel)
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
            for tid, rows in chunk.items():
                counts[tid] = len(rows[0])
            self._count(batch, counts, fired=True)
            self._fired_upto = K.next_key(entries[-1][0])
            batch.put(K.META_FIRED_UPTO, self._fired_upto, self._h_meta)
            store.write(batch, lazy=True)
            self._fresh.keep(chunk, self._tails)
        return counts

    def forget_fresh(self, tid: int) -> None:
        """Hold no fired entries of topic ``tid`` any more (its ready keys were deleted:
        pulls read the store until its next fire)."""
        self._fresh.drop(tid)

    def fresh_rows(self, tid: int, cursor: bytes, limit: int) -> list[tuple[bytes, bytes]] | None:
        """Up to ``limit`` ``(ready key, record)`` pairs of topic ``tid`` from ``cursor`` on,
        from memory, as a scan of the store would return them; ``None`` when the store
        must be read. Any thread, no lock (see :class:`~.fresh.FreshRows`)."""
        return self._fresh.rows(tid, cursor, limit)

    def top_up(self) -> int:
        """Refill the wheel's near window if it shrank by a step; returns how many
        entries it loaded. A pull calls it while nothing is due for a while, so the
        refill's scan (P99 0.4 ms, GIL held) seldom delays a due chunk's fire; firing
        refills only a step later, as a fallback."""
        with self._lock:
            return self._wheel.refill(self.now())

    def next_due_ms(self) -> int | None:
        """When the wheel next needs the wheel thread (see :meth:`TimingWheel.next_due_ms`)."""
        with self._lock:
            return self._wheel.next_due_ms()

    # -- wake-ups of the wheel thread ----------------------------------------------------

    def kick(self) -> None:
        """Wake the wheel thread now (the clock moved, or the broker closes)."""
        with self._wake:
            self._kicked = True
            self._wake.notify()

    def wake_if_before(self, due_ms: int) -> None:
        """Wake the wheel thread if ``due_ms`` comes before the time it plans to wake at
        (something due sooner was scheduled while it sleeps)."""
        if due_ms < self._planned_wake:
            self.kick()

    @property
    def planned_wake_ms(self) -> int:
        """The broker time the sleeping wheel thread plans to wake at; 0 while it works."""
        return self._planned_wake

    @property
    def wall_clock(self) -> bool:
        """Whether the clock is the system's (then pulls may fire due messages
        themselves, see :meth:`take_fire_duty`; a manual clock leaves it to the wheel
        thread, which tests drive by moving the clock)."""
        return self._wall

    def seconds_until(self, at_ms: int) -> float:
        """Seconds from now to broker time ``at_ms`` (negative once past), to the
        sub-millisecond with the system clock."""
        delay = (at_ms - self.now()) / 1000
        if self._wall:  # never longer than the line above (a clock stepped back)
            delay = min(delay, at_ms / 1000 - time.time())
        return delay

    def take_fire_duty(self, due_ms: int) -> None:
        """A pull waits until ``due_ms`` to fire what is due then itself (one thread
        hand-off less per fired chunk, issue 16); the wheel thread then plans to
        wake :data:`FIRE_DUTY_GRACE_MS` later and fires only what no pull did."""
        # Unlocked: a racing smaller value only costs the wheel thread an early wake.
        self._duty_ms = max(self._duty_ms, due_ms)

    def wheel_wake_ms(self, due_ms: int) -> int:
        """When the wheel thread should wake for what is due at ``due_ms``: then, or
        :data:`FIRE_DUTY_GRACE_MS` later when a pull took the duty to fire it."""
        return due_ms + FIRE_DUTY_GRACE_MS if due_ms <= self._duty_ms else due_ms

    def wait_for_work(self, wake_ms: int, max_wait_s: float) -> None:
        """Sleep until broker time ``wake_ms`` (at most ``max_wait_s``) or a kick; for the
        wheel thread only."""
        self._planned_wake = wake_ms
        with self._wake:
            if not self._kicked:
                delay = self.seconds_until(wake_ms)
                if delay > 0:
                    self._wake.wait(min(delay, max_wait_s))
            self._kicked = False
        self._planned_wake = 0

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening to the clock and close the store (the wheel thread has stopped)."""
        self._clock.unsubscribe(self.kick)
        with self._lock:
            self._h_wheel = self._h_ready = self._h_meta = None
            self._store.close()


__all__ = ["FIRE_DUTY_GRACE_MS", "SEQ_BLOCK", "BrokerCore"]
