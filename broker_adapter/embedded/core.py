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

Held fires (:mod:`~broker_adapter.embedded.fire_writes`): a pull's fire changes
the memory at once and may leave its write for ~10 ms. The store stays an earlier
state of the broker, never a mix, and this is the one place that keeps it so:
every way to the store, :attr:`BrokerCore.store` for everything outside the core and
the core's own writes, goes through :meth:`BrokerCore._written`, which writes the
held fires first. Read the store under :attr:`BrokerCore.lock` when you act on what
you read (an abort), so no fire comes in between.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from broker_adapter.clock import Clock, SystemClock
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.counters import TopicCounters
from broker_adapter.embedded.fire_writes import DEFAULT_HOLD_MS, FireWrites
from broker_adapter.embedded.fresh import FreshRows
from broker_adapter.embedded.store import RocksStore
from broker_adapter.embedded.timing_wheel import TimingWheel
from broker_adapter.embedded.wheel_wakes import FIRE_DUTY_GRACE_MS, WheelWakes
from broker_adapter.embedded.wheel_writes import WheelWrites
from broker_adapter.errors import ChronoqError, InvalidArgument

log = logging.getLogger("chronoq.broker_adapter.EmbeddedBroker")
log.addHandler(logging.NullHandler())

#: Sequence numbers reserved (persisted as a high-water mark) per write of ``meta``.
SEQ_BLOCK = 1 << 20


class BrokerCore(WheelWrites, WheelWakes):
    """The shared state of one embedded broker's data directory.

    The attributes below are read-only views for hot loops (an attribute read, not a
    call); what changes them is the core's methods.

    :ivar lock: the broker lock (level 3 of the lock order): hold it to make several
        core calls one atomic step; never take a group lock while holding it.
    :ivar topic_ids: topic name -> id.
    :ivar topic_names: topic id -> name.
    :ivar prefixes: topic id -> its 2-byte key prefix.
    :ivar tails: topic id -> its greatest ``ready`` key (a pull skips a topic whose
        cursor is past its tail without reading the store).
    :param path: data directory; one process owns it at a time.
    :param clock: the time source; the core subscribes :meth:`kick` to it.
    :param durability: see :data:`~broker_adapter.embedded.rocks_options.DURABILITY_MODES`.
    :param window_ms: the near window of the timing wheel held in memory.
    :param fire_hold_ms: how long a pull's fire may wait for its write (see
        :mod:`~broker_adapter.embedded.fire_writes`; 0: never).
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
        fire_hold_ms: int = DEFAULT_HOLD_MS,
    ) -> None:
        store = self._store = RocksStore(path, durability)
        self._clock = clock
        self._lock = threading.RLock()
        self._window_ms = window_ms
        self._topic_ids: dict[str, int] = {}
        self._topic_names: dict[int, str] = {}
        self._prefixes: dict[int, bytes] = {}
        self._tails: dict[int, bytes] = {}
        self._fresh = FreshRows()  # the newest fired entries per topic, for pulls
        self._counters = TopicCounters(self._prefixes)
        self._fires = FireWrites(
            store, self._counters, self._fresh, self._tails, self._prefixes, fire_hold_ms
        )
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
        self._init_wakes(isinstance(clock, SystemClock))
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
        self._counters.load(store)  # counters of writes that failed go too
        self._fires.drop()  # held fires are still on the wheel on disk: they fire again
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
            self._fires.drop()  # so does a batch; its fires are still on the wheel on disk
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
    def store(self) -> RocksStore:
        """The RocksDB store, with every held fire written first (:meth:`_written`). Its
        families are free for all to read, and to write where no core state is
        involved (cursors, group notes, subscriptions)."""
        return self._written() if self._fires.held else self._store

    def _written(self) -> RocksStore:
        """The store, after writing the held fires: every way to the store, the core's
        own writes included, goes through here (the one place of the invariant in the
        module docstring: the store never lacks a fire whose messages a pull may have,
        below a change made after it)."""
        if self._fires.held:
            with self._lock:
                self._fires.write()
        return self._store

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

    def had_messages(self, tid: int) -> bool:
        """Whether a message was ever sent, retried or dead-lettered to topic ``tid`` (its
        counters exist); a topic only subscribed to has an id but no counters."""
        return self._counters.known(tid)

    def pending_count(self, tid: int) -> int:
        """Messages of topic ``tid`` waiting on the wheel."""
        return self._counters.pending(tid)

    def fired_count(self, tid: int) -> int:
        """Messages ever fired into topic ``tid`` (dead letters included)."""
        return self._counters.fired(tid)

    # -- firing ------------------------------------------------------------------------

    def fire_due(self, limit: int, hold: bool = False) -> dict[int, int]:
        """Move up to ``limit`` due wheel entries to their topics' ready keys; returns
        how many fired per topic id (empty: nothing was due). The caller tells the
        groups, after this returns (no group lock under the broker lock). With
        ``hold`` (a pull's fire) the write may wait (see
        :mod:`~broker_adapter.embedded.fire_writes`); without, it writes what is held too."""
        with self._lock:
            entries = self._wheel.pop_due(self.now(), limit)
            if not entries:
                return {}
            upto = self._fired_upto
            self._fired_upto = K.next_key(entries[-1][0])
            handles = (self._h_wheel, self._h_ready, self._h_meta)
            counts, started = self._fires.fire(entries, upto, handles, hold)
        if started:  # the wheel thread writes it if no pull does (wake_if_before: unlocked)
            self.wake_if_before(self.now() + self._fires.hold_ms + FIRE_DUTY_GRACE_MS)
        return counts

    def write_held_old(self) -> None:
        """Write the held fires if they were held their time (a pull about to wait,
        or the wheel thread's turn); every other write of them goes through
        :meth:`_written`."""
        if self._fires.held:
            with self._lock:
                self._fires.write_old()

    @property
    def held_fires(self) -> int:
        """Fired entries whose write is held (0: the store has every fire)."""
        return self._fires.held

    def held_write_ms(self) -> int | None:
        """The broker time by which the wheel thread should write the held fires
        (:attr:`FIRE_DUTY_GRACE_MS` after they were held their time); ``None`` when
        nothing is held."""
        left = self._fires.write_by()
        if left is None:
            return None
        return self.now() + max(int(left * 1000), 0) + FIRE_DUTY_GRACE_MS

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

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening to the clock, write the held fires and close the store (the
        wheel thread has stopped)."""
        self._clock.unsubscribe(self.kick)
        with self._lock:
            try:
                self._fires.write()
            except ChronoqError as e:  # their entries are still on the wheel: they fire again
                log.warning("closing %s without writing held fires: %s", self._store.path, e)
                self._fires.drop()
            self._h_wheel = self._h_ready = self._h_meta = None
            self._store.close()


__all__ = ["FIRE_DUTY_GRACE_MS", "SEQ_BLOCK", "BrokerCore"]
