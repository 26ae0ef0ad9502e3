"""GroupRegistry: the consumer groups of one embedded broker and their deliveries.

It owns the groups (loaded from ``meta`` at open), which groups read which
topic, the live consumers, and the :class:`~.consumer.ReadySignal` that wakes a
waiting ``pull``. Acks, nacks, dead letters and redeliveries after an
invisible-time expiry are here; the per-group state itself is
:class:`~broker_adapter.embedded.groups.ConsumerGroup`. Its lock comes first in
the lock order (see :mod:`~broker_adapter.embedded.core`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker_adapter.adapter import ConsumerLimits
from broker_adapter.base import dead_letter_topic, retry_backoff_ms, retry_topic
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.consumer import EmbeddedConsumer, ReadySignal
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.fire_log import fire_log
from broker_adapter.embedded.groups import ConsumerGroup, Flight
from broker_adapter.embedded.records import record_id, with_topic_and_attempts
from broker_adapter.errors import ChronoqError
from broker_adapter.results import GroupStats

# Acks are persisted at most this often (a crash may redeliver what was acked since).
COMMIT_INTERVAL_S = 0.05


class GroupRegistry:
    """The consumer groups of one embedded broker, loaded from its ``meta`` family.

    :param core: the broker's core.
    :param check_open: raises :class:`~broker_adapter.errors.BrokerClosed` once the
        broker is closed (a waiting pull calls it when woken).
    """

    def __init__(
        self, core: BrokerCore, check_open: Callable[[], None], *, fire_chunk: int = 1000
    ) -> None:
        self._core = core
        #: Most messages fired in one write batch (:meth:`fire_due`).
        self.fire_chunk = fire_chunk
        self._fire_log = fire_log()  # None unless a benchmark turned it on
        self._check_open = check_open
        self._groups: dict[str, ConsumerGroup] = {}
        self._subscribers: dict[int, list[ConsumerGroup]] = {}
        self._consumers: set[EmbeddedConsumer] = set()
        self._lock = threading.Lock()
        self.ready_signal = ReadySignal()
        #: Set by :meth:`close`; consumers check it before an ack.
        self.closed = False
        with self._lock:
            for key, value in core.store.scan(K.CF_META, K.META_GROUP, b"H", 1 << 30):
                self._load_group(key[1:].decode(), value)

    def check_open(self) -> None:
        """Raise unless the broker is open.

        :raises BrokerClosed: when the broker is closed.
        """
        self._check_open()

    def group(self, name: str) -> ConsumerGroup | None:
        """The group called ``name``, if it exists."""
        return self._groups.get(name)

    def group_names(self) -> list[str]:
        """The names of all groups."""
        return list(self._groups)

    def subscribers_of(self, tid: int) -> Sequence[ConsumerGroup]:
        """The groups reading topic ``tid`` (a copy: safe to iterate while groups join)."""
        return tuple(self._subscribers.get(tid, ()))

    def _load_group(self, name: str, value: bytes) -> ConsumerGroup:
        """Build a group from its stored subscription (registry lock held)."""
        gid = int(K.U16.unpack_from(value)[0])
        group = ConsumerGroup(gid, name, {}, 0)
        group.retry_tid = self._core.topic_id(retry_topic(name))
        with group.lock:
            for topic in [*json.loads(value[2:]), retry_topic(name)]:
                self._attach_topic(group, topic)
        self._groups[name] = group
        return group

    def _attach_topic(self, group: ConsumerGroup, topic: str) -> None:
        """Start ``group`` reading ``topic`` at its stored cursor, or at the oldest
        retained message (group lock held)."""
        store = self._core.store
        tid = self._core.topic_id(topic)
        if tid in group.cursors:
            return
        stored = store.cf[K.CF_META].get(K.META_CURSOR + group.gid_bytes + K.tid_bytes(tid))
        if stored is None:
            cursor = K.topic_range(tid)[0]
        else:
            cursor = stored[:-8]
            group.acked_total = max(group.acked_total, int(K.U64.unpack(stored[-8:])[0]))
        group.cursors[tid] = cursor
        group.ready[tid] = store.count(K.CF_READY, cursor, K.topic_range(tid)[1])
        self._subscribers.setdefault(tid, []).append(group)

    def consumer(
        self, group: str, names: tuple[str, ...], limits: ConsumerLimits
    ) -> EmbeddedConsumer:
        """A new member of ``group`` on the topics ``names`` (checked by the adapter base);
        see :meth:`BrokerAdapter.consumer`."""
        core = self._core
        store = core.store
        with self._lock:
            g = self._groups.get(group)
            known = set() if g is None else {core.topic_names[t] for t in g.cursors}
            if g is None or not set(names) <= known:
                gid = g.gid if g is not None else len(self._groups) + 1
                subscribed = sorted((known - {retry_topic(group)}) | set(names))
                value = K.U16.pack(gid) + json.dumps(subscribed).encode()
                store.put(K.CF_META, K.META_GROUP + group.encode(), value)
                if g is None:
                    g = self._load_group(group, value)
                else:
                    with g.lock:
                        for name in names:
                            self._attach_topic(g, name)
            g.invisible_ms, g.max_attempts = limits.invisible_ms, limits.max_attempts
            tids = [core.topic_ids[n] for n in names] + [g.retry_tid]
        consumer = EmbeddedConsumer(
            core, self, g, tids, names, limits.max_inflight, limits.max_inflight_bytes
        )
        self._consumers.add(consumer)
        return consumer

    def _wake_for_deadline(self, group: ConsumerGroup) -> None:
        """Have the wheel thread up by ``group``'s next invisible-time deadline."""
        soonest = group.next_deadline()
        if soonest is not None:
            self._core.wake_if_before(soonest)

    def notify(self) -> None:
        """Wake the pulls waiting for messages."""
        self.ready_signal.notify()

    def ack(self, group: ConsumerGroup, receipt: bytes) -> bool:
        """Settle the in-flight message ``receipt`` of ``group``; ``False`` if unknown."""
        with group.lock:
            entry = group.inflight.pop(receipt, None)
            if entry is None:
                return False
            pull = entry[1]
            pull.settle()
            consumer = pull.consumer
            consumer.held -= 1
            consumer.held_bytes -= len(entry[0])
            group.dirty.add((receipt[0] << 8) | receipt[1])
            group.acked_total += 1
            if time.monotonic() - group.last_commit >= COMMIT_INTERVAL_S:
                self.commit(group)
        if consumer.held + 1 >= consumer.max_inflight:
            self.notify()  # a pull may be waiting for room
        return True

    def ack_many(self, group: ConsumerGroup, receipts: Sequence[bytes]) -> list[bool]:
        """:meth:`ack` each of ``receipts`` of ``group`` under one take of its lock (a
        pulled batch acked at once: ~1 us less per message than one call each)."""
        out: list[bool] = []
        add = out.append
        wake = False
        with group.lock:
            inflight, dirty = group.inflight, group.dirty
            acked = 0
            for receipt in receipts:
                entry = inflight.pop(receipt, None)
                if entry is None:
                    add(False)
                    continue
                pull = entry[1]
                pull.settle()
                consumer = pull.consumer
                consumer.held -= 1
                consumer.held_bytes -= len(entry[0])
                if consumer.held + 1 >= consumer.max_inflight:
                    wake = True  # a pull of that consumer may be waiting for room
                dirty.add((receipt[0] << 8) | receipt[1])
                acked += 1
                add(True)
            group.acked_total += acked
            if acked and time.monotonic() - group.last_commit >= COMMIT_INTERVAL_S:
                self.commit(group)
        if wake:
            self.notify()
        return out

    def commit(self, group: ConsumerGroup, batch: Any = None) -> None:
        """Persist the dirty cursors of ``group`` (group lock held), or add them to ``batch``."""
        store = self._core.store
        own = batch is None
        batch = store.batch() if own else batch
        h_meta = store.handle[K.CF_META]
        for tid in group.dirty:
            batch.put(
                K.META_CURSOR + group.gid_bytes + K.tid_bytes(tid), group.cursor_value(tid), h_meta
            )
        group.dirty.clear()
        group.last_commit = time.monotonic()
        if own:
            store.write(batch, lazy=True)

    def nack(
        self,
        group: ConsumerGroup,
        receipt: bytes,
        delay_ms: int | None,
        reason: str | None,
        dead: bool,
        attempt: bool = True,
    ) -> bool:
        """Send the in-flight message ``receipt`` of ``group`` to retry (``delay_ms``, or
        the backoff of its attempts) or with ``dead`` to the dead-letter topic; with
        ``attempt`` false (a release) this delivery does not count. ``False`` if unknown."""
        with group.lock:
            flight = group.drop_flight(receipt)
            if flight is None:
                return False
            if not attempt:  # a release: this delivery does not count
                flight.attempts -= 1
            self._redeliver_or_keep(group, flight, delay_ms, reason, dead, may_die=attempt)
        self.notify()
        return True

    def extend(self, group: ConsumerGroup, receipt: bytes, invisible_ms: int) -> bool:
        """Keep the in-flight message ``receipt`` invisible ``invisible_ms`` from now."""
        with group.lock:
            extended = group.extend(receipt, self._core.now() + invisible_ms)
        if extended:
            self._wake_for_deadline(group)
        return extended

    def redeliver(
        self,
        group: ConsumerGroup,
        flight: Flight,
        delay_ms: int | None,
        reason: str | None,
        dead: bool,
        may_die: bool = True,
    ) -> None:
        """Send an in-flight message to the group's retry topic or its DLQ (group lock held);
        with ``may_die`` false it goes to the retry topic whatever its attempts."""
        core = self._core
        dead = dead or (may_die and flight.attempts >= group.max_attempts)
        store = core.store
        raw = record_id(flight.record)
        note_reason = (reason or "").encode()[:4096]
        with core.lock:
            now = core.now()
            batch = store.batch()
            if dead:
                tid = core.topic_id(dead_letter_topic(group.name))
                record = with_topic_and_attempts(flight.record, tid, flight.attempts, now)
                wkey = core.append_ready(batch, tid, now, record)
                note = b"D" + K.U16.pack(flight.attempts) + wkey + note_reason
            else:
                tid = group.retry_tid
                if delay_ms is None:
                    delay_ms = retry_backoff_ms(flight.attempts)
                due = core.after(delay_ms)  # from the clock: see BrokerCore.after
                record = with_topic_and_attempts(flight.record, tid, flight.attempts, due)
                wkey = K.wheel_key(due, core.next_seq())
                retry = (wkey, tid, record)
                note = b"R" + K.U16.pack(flight.attempts) + wkey + note_reason
            batch.put(group.gid_bytes + raw, note, store.handle[K.CF_CONSUME])
            self.commit(group, batch)
            if dead:
                core.write(batch)
            else:
                core.write_pending(batch, (retry,))
        if dead:
            self.add_ready({tid: 1})
        else:
            core.wake_if_before(due)

    def _redeliver_or_keep(
        self,
        group: ConsumerGroup,
        flight: Flight,
        delay_ms: int | None,
        reason: str | None,
        dead: bool,
        may_die: bool = True,
    ) -> None:
        """:meth:`redeliver` a dropped flight; if that fails to write (a full disk), put
        it back in flight (group lock held) so it is neither lost nor skipped, and raise.

        :raises ChronoqError: the write failed (``StorageFull`` on a full disk).
        """
        try:
            self.redeliver(group, flight, delay_ms, reason, dead, may_die)
        except ChronoqError:
            group.restore(flight)
            raise

    def release_held(self, consumer: EmbeddedConsumer, group: ConsumerGroup) -> None:
        """Give back a closing consumer's in-flight messages (of its ``group``) for
        redelivery at once."""
        self._consumers.discard(consumer)
        if self.closed:
            return
        with group.lock:
            for flight in group.held_by(consumer):
                group.drop_flight(flight.receipt)
                self.redeliver(group, flight, 0, "consumer closed", dead=False)

    def fire_due(self, hold: bool = False) -> int:
        """Fire one chunk of due messages (:meth:`BrokerCore.fire_due`) and tell the
        groups; how many fired. The wheel thread calls it, and so does a pull that
        waited for a due time (:meth:`BrokerCore.take_fire_duty`) with ``hold``: its
        write may wait (:mod:`~broker_adapter.embedded.fire_writes`); no lock held."""
        core = self._core
        counts = core.fire_due(self.fire_chunk, hold)
        if not counts:
            return 0
        if self._fire_log is not None:
            self._fire_log.fired(core.fired_upto)
        self.add_ready(counts)
        return sum(counts.values())

    def add_ready(self, counts: dict[int, int]) -> None:
        """Count newly fired messages (topic id -> n) as ready for every subscribed group
        and wake waiting pulls."""
        for tid, n in counts.items():
            for group in self._subscribers.get(tid, ()):
                with group.lock:
                    group.ready[tid] = group.ready.get(tid, 0) + n
        self.notify()

    def housekeep(self, now: int) -> int | None:
        """Redeliver expired in-flight messages, persist cursors; the next deadline."""
        soonest = None
        for group in list(self._groups.values()):
            with group.lock:
                for flight in group.expired(now):
                    group.drop_flight(flight.receipt)
                    self._redeliver_or_keep(group, flight, 0, "invisible time expired", False)
                if group.dirty and time.monotonic() - group.last_commit >= COMMIT_INTERVAL_S:
                    self.commit(group)
                nd = group.next_deadline()
            if nd is not None and (soonest is None or nd < soonest):
                soonest = nd
        return soonest

    def stats(
        self, dead_of: dict[str, int]
    ) -> tuple[dict[str, GroupStats], dict[int, int], dict[int, int]]:
        """Per group counters (``dead_of`` maps a group to its dead-letter count), and
        per topic id the ready and in-flight counts summed over groups."""
        out = {}
        ready: dict[int, int] = {}
        inflight: dict[int, int] = {}
        for name, g in list(self._groups.items()):
            with g.lock:
                out[name] = GroupStats(
                    ready=max(sum(g.ready.values()), 0),
                    inflight=len(g.inflight),
                    dead=dead_of.get(name, 0),
                    acked_total=g.acked_total,
                )
                for tid, n in g.ready.items():
                    ready[tid] = ready.get(tid, 0) + max(n, 0)
                for receipt in g.inflight:
                    tid = (receipt[0] << 8) | receipt[1]
                    inflight[tid] = inflight.get(tid, 0) + 1
        return out, ready, inflight

    def close(self) -> None:
        """Mark consumers closed, wake pullers, and persist every group's cursors."""
        self.closed = True
        for consumer in list(self._consumers):
            consumer.closed = True
        self.notify()
        for group in self._groups.values():
            with group.lock:
                group.dirty.update(group.cursors)
                self.commit(group)
