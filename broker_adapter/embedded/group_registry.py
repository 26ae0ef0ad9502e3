"""GroupRegistry: the consumer groups of one embedded broker and their deliveries.

It owns the groups (loaded from ``meta`` at open), which groups read which
topic, the live consumers, and the long-poll wake-up of ``pull``. Acks, nacks,
dead letters and redeliveries after an invisible-time expiry are here; the
per-group state itself is :class:`~broker_adapter.embedded.groups.ConsumerGroup`.
Lock order: registry lock, then a group's lock, then the broker's lock.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

from broker_adapter.adapter import ConsumerLimits
from broker_adapter.base import dead_letter_topic, retry_backoff_ms, retry_topic
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.groups import ConsumerGroup, EmbeddedConsumer, Flight
from broker_adapter.embedded.records import record_id, with_topic_and_attempts
from broker_adapter.results import GroupStats, ReceivedMessage

if TYPE_CHECKING:
    from broker_adapter.embedded.broker import EmbeddedBroker

# Acks are persisted at most this often (a crash may redeliver what was acked since).
COMMIT_INTERVAL_S = 0.05


class GroupRegistry:
    """Consumer groups of an :class:`EmbeddedBroker`, loaded from its ``meta`` family."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self._broker = broker
        self.groups: dict[str, ConsumerGroup] = {}
        self.subscribers: dict[int, list[ConsumerGroup]] = {}
        self.consumers: set[EmbeddedConsumer] = set()
        self._lock = threading.Lock()
        # Consumers waiting in pull() sleep on _ready; _epoch counts wake-ups.
        self._ready = threading.Condition(threading.Lock())
        self._epoch = 0
        with self._lock:
            for key, value in broker._store.scan(K.CF_META, K.META_GROUP, b"H", 1 << 30):
                self._load_group(key[1:].decode(), value)

    def _load_group(self, name: str, value: bytes) -> ConsumerGroup:
        """Build a group from its stored subscription (``_groups_lock`` held)."""
        b = self._broker
        gid = int(K.U16.unpack_from(value)[0])
        group = ConsumerGroup(gid, name, {}, 0)
        with b._lock:
            group.retry_tid = b._topic_id(retry_topic(name))
        with group.lock:
            for topic in [*json.loads(value[2:]), retry_topic(name)]:
                self._attach_topic(group, topic)
        self.groups[name] = group
        return group

    def _attach_topic(self, group: ConsumerGroup, topic: str) -> None:
        """Start ``group`` reading ``topic`` at its stored cursor, or at the oldest
        retained message (group lock held)."""
        b = self._broker
        with b._lock:
            tid = b._topic_id(topic)
        if tid in group.cursors:
            return
        stored = b._store.cf[K.CF_META].get(K.META_CURSOR + group.gid_bytes + K.tid_bytes(tid))
        if stored is None:
            cursor = K.topic_range(tid)[0]
        else:
            cursor = stored[:-8]
            group.acked_total = max(group.acked_total, int(K.U64.unpack(stored[-8:])[0]))
        group.cursors[tid] = cursor
        group.ready[tid] = b._store.count(K.CF_READY, cursor, K.topic_range(tid)[1])
        self.subscribers.setdefault(tid, []).append(group)

    def consumer(
        self, group: str, names: tuple[str, ...], limits: ConsumerLimits
    ) -> EmbeddedConsumer:
        """A new member of ``group`` on the topics ``names`` (checked by the adapter base);
        see :meth:`BrokerAdapter.consumer`."""
        b = self._broker
        with self._lock:
            g = self.groups.get(group)
            known = set() if g is None else {b._topic_names[t] for t in g.cursors}
            if g is None or not set(names) <= known:
                gid = g.gid if g is not None else len(self.groups) + 1
                subscribed = sorted((known - {retry_topic(group)}) | set(names))
                value = K.U16.pack(gid) + json.dumps(subscribed).encode()
                b._store.cf[K.CF_META].put(K.META_GROUP + group.encode(), value, b._store.write_opt)
                if g is None:
                    g = self._load_group(group, value)
                else:
                    with g.lock:
                        for name in names:
                            self._attach_topic(g, name)
            g.invisible_ms, g.max_attempts = limits.invisible_ms, limits.max_attempts
            tids = [b._topic_ids[n] for n in names] + [g.retry_tid]
        consumer = EmbeddedConsumer(
            b, g, tids, names, limits.max_inflight, limits.max_inflight_bytes
        )
        self.consumers.add(consumer)
        return consumer

    def pull(
        self, consumer: EmbeddedConsumer, max_messages: int, wait_ms: int
    ) -> list[ReceivedMessage]:
        b = self._broker
        deadline = time.monotonic() + wait_ms / 1000
        group = consumer.group_state
        while True:
            epoch = self._epoch
            with group.lock:
                got = consumer.take(max_messages, b._now())
            if got:
                self._maybe_kick_deadline(group)
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0 or consumer.closed:
                return got
            with self._ready:
                if self._epoch == epoch:
                    self._ready.wait(remaining)
            b.check_open()

    def _maybe_kick_deadline(self, group: ConsumerGroup) -> None:
        b = self._broker
        nd = group.next_deadline()
        if nd is not None and nd < b._planned_wake:
            b._kick()

    def notify(self) -> None:
        with self._ready:
            self._epoch += 1
            self._ready.notify_all()

    def ack(self, group: ConsumerGroup, receipt: bytes) -> bool:
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

    def commit(self, group: ConsumerGroup, batch: Any = None) -> None:
        """Persist the dirty cursors of ``group`` (group lock held), or add them to ``batch``."""
        b = self._broker
        own = batch is None
        batch = b._store.batch() if own else batch
        h_meta = b._store.handle[K.CF_META]
        for tid in group.dirty:
            batch.put(
                K.META_CURSOR + group.gid_bytes + K.tid_bytes(tid), group.cursor_value(tid), h_meta
            )
        group.dirty.clear()
        group.last_commit = time.monotonic()
        if own:
            b._store.write(batch, lazy=True)

    def nack(
        self,
        group: ConsumerGroup,
        receipt: bytes,
        delay_ms: int | None,
        reason: str | None,
        dead: bool,
        attempt: bool = True,
    ) -> bool:
        with group.lock:
            flight = group.drop_flight(receipt)
            if flight is None:
                return False
            if not attempt:  # a release: this delivery does not count
                flight.attempts -= 1
            self.redeliver(group, flight, delay_ms, reason, dead, may_die=attempt)
        self.notify()
        return True

    def extend(self, group: ConsumerGroup, receipt: bytes, invisible_ms: int) -> bool:
        with group.lock:
            extended = group.extend(receipt, self._broker._now() + invisible_ms)
        if extended:
            self._maybe_kick_deadline(group)
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
        b = self._broker
        dead = dead or (may_die and flight.attempts >= group.max_attempts)
        store = b._store
        raw = record_id(flight.record)
        note_reason = (reason or "").encode()[:4096]
        with b._lock:
            now = b._now()
            batch = store.batch()
            if dead:
                tid = b._topic_id(dead_letter_topic(group.name))
                wkey = K.wheel_key(now, b._next_seq())
                ready_key = b._tid_prefix[tid] + wkey
                record = with_topic_and_attempts(flight.record, tid, flight.attempts, now)
                batch.put(ready_key, record, store.handle[K.CF_READY])
                note = b"D" + K.U16.pack(flight.attempts) + wkey + note_reason
                b._count_pending(batch, {tid: 1})
                b._count_pending(batch, {tid: 1}, fired=True)
                b._tails[tid] = ready_key
            else:
                tid = group.retry_tid
                if delay_ms is None:
                    delay_ms = retry_backoff_ms(flight.attempts)
                due = now + delay_ms
                wkey = K.wheel_key(due, b._next_seq())
                record = with_topic_and_attempts(flight.record, tid, flight.attempts, due)
                batch.put(wkey, record, store.handle[K.CF_WHEEL])
                note = b"R" + K.U16.pack(flight.attempts) + wkey + note_reason
                b._count_pending(batch, {tid: 1})
            batch.put(group.gid_bytes + raw, note, store.handle[K.CF_CONSUME])
            self.commit(group, batch)
            store.write(batch)
            if not dead:
                b._wheel.schedule(wkey, tid, record)
        if dead:
            self.add_ready({tid: 1})
        elif due < b._planned_wake:
            b._kick()

    def release_held(self, consumer: EmbeddedConsumer) -> None:
        """Give back a closing consumer's in-flight messages for redelivery at once."""
        b = self._broker
        self.consumers.discard(consumer)
        group = consumer.group_state
        if b._closed:
            return
        with group.lock:
            for flight in group.held_by(consumer):
                group.drop_flight(flight.receipt)
                self.redeliver(group, flight, 0, "consumer closed", dead=False)

    def add_ready(self, counts: dict[int, int]) -> None:
        for tid, n in counts.items():
            for group in self.subscribers.get(tid, ()):
                with group.lock:
                    group.ready[tid] = group.ready.get(tid, 0) + n
        self.notify()

    def housekeep(self, now: int) -> int | None:
        """Redeliver expired in-flight messages, persist cursors; the next deadline."""
        soonest = None
        for group in list(self.groups.values()):
            with group.lock:
                for flight in group.expired(now):
                    group.drop_flight(flight.receipt)
                    self.redeliver(group, flight, 0, "invisible time expired", dead=False)
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
        for name, g in list(self.groups.items()):
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
        for consumer in list(self.consumers):
            consumer.closed = True
        self.notify()
        for group in self.groups.values():
            with group.lock:
                group.dirty.update(group.cursors)
                self.commit(group)
