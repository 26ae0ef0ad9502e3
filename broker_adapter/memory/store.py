"""MemoryStore: the state of one memory broker, and its time.

Everything lives in dicts, lists and one heap, guarded by one lock (``lock``;
``changed`` is its condition, notified whenever messages fire or room frees up).
There is no background thread: time is read through the injected
:class:`~broker_adapter.clock.Clock`, and :meth:`MemoryStore.tick` fires what is
due, redelivers what outlived its invisible time and trims what retention lets
go. Every operation ticks first, a ``ManualClock`` advance ticks at once (the
store listens to it), and a waiting ``pull`` wakes up by the next due time, so
with the system clock messages fire on time for whoever looks, and with a
manual clock exactly when a test advances it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Sequence

from broker_adapter.base import retry_backoff_ms
from broker_adapter.clock import Clock
from broker_adapter.coordination import LeaseSemaphores, RateBuckets
from broker_adapter.errors import InvalidDelay
from broker_adapter.memory.due_index import DueIndex
from broker_adapter.memory.groups import MemoryGroup
from broker_adapter.memory.key_index import KeyIndex
from broker_adapter.memory.records import Copy, Flight, StoredMessage, TopicLog
from broker_adapter.message import Message
from broker_adapter.results import (
    NO_PROPERTIES,
    AbortResult,
    AbortStatus,
    SendResult,
    SendStatus,
)

_ids = itertools.count(1)


class MemoryStore:
    """The messages, wheel, topic logs and groups of one memory broker.

    :param clock: where time comes from.
    :param max_delay_ms: the furthest ahead a message may be due.
    :param retention_ms: how long fired messages (and their keys) and aborted ones
        stay readable.
    """

    def __init__(self, clock: Clock, *, max_delay_ms: int, retention_ms: int) -> None:
        self.clock = clock
        self.max_delay_ms = max_delay_ms
        self.retention_ms = retention_ms
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.messages: dict[str, StoredMessage] = {}
        self.logs: dict[str, TopicLog] = {}
        self.groups: dict[str, MemoryGroup] = {}
        self._prefix = f"m{next(_ids)}-"  # ids of two memory brokers never collide
        self._seq = itertools.count(1)
        self._receipts = itertools.count(1)
        self._keys = KeyIndex()
        self._wheel: list[tuple[int, int, Copy]] = []
        self._cancelled = 0  # cancelled copies still in _wheel
        #: The pending first sends in due order (see find_pending).
        self.due_index = DueIndex()
        #: The retries waiting on the wheel, by due time (see count_pending).
        self.retry_index = DueIndex()
        #: The rate limits and semaphores of acquire_rate/acquire_slot (every handle's).
        self.rates = RateBuckets(clock)
        self.slots = LeaseSemaphores(clock)
        self._aborted: list[tuple[int, int, StoredMessage]] = []  # (due, seq): retention
        self._lingering: list[StoredMessage] = []  # trimmed, but a group still retries it
        self._now = 0
        clock.subscribe(self._on_clock)

    # -- time ---------------------------------------------------------------------------

    def _on_clock(self) -> None:
        with self.lock:
            self.tick()

    def tick(self) -> int:
        """Fire what is due, redeliver expired deliveries, trim; the current time
        (never going back, whatever the clock does). Lock held."""
        now = self._now = max(self._now, self.clock.now_ms())
        woke = False
        while True:
            fired = self._fire_due(now)
            expired = 0
            for group in self.groups.values():
                for flight in group.expired(now):
                    self.redeliver(group, flight, 0, "invisible time expired", dead=False)
                    expired += 1
            woke = woke or bool(fired or expired)
            if not expired:
                break
        self._trim(now)
        if woke:
            self.changed.notify_all()
        return now

    def after(self, delay_ms: int) -> int:
        """The due time ``delay_ms`` from now: counted from the clock, so a backward
        step does not make a delay longer, and never before store time (a delay
        shorter than the step is due at once). Lock held."""
        return max(self._now, self.clock.now_ms() + delay_ms)

    def next_due(self) -> int | None:
        """The earliest time something is due: a copy on the wheel or a deadline."""
        times = [self._wheel[0][0]] if self._wheel else []
        times += [d for g in self.groups.values() if (d := g.next_deadline()) is not None]
        return min(times, default=None)

    def _fire_due(self, now: int) -> int:
        wheel = self._wheel
        fired = 0
        while wheel and wheel[0][0] <= now:
            copy = heapq.heappop(wheel)[2]
            if copy.cancelled:  # aborted or moved: its pending count went then
                self._cancelled -= 1
                continue
            log = self.log(copy.topic)
            log.pending -= 1
            copy.fired_ms = now
            if copy.is_first:
                copy.message.fired_ms = now
                copy.message.copy = None
                self.due_index.discard(copy)
            else:
                self.retry_index.discard(copy)
            log.entries.append(copy)
            log.fired_total += 1
            fired += 1
            for group in self.groups.values():
                if group.retry_topic == copy.topic:
                    group.retry_fired(copy.message.msg_id)
        return fired

    # -- topics, groups, receipts ---------------------------------------------------------

    def log(self, topic: str) -> TopicLog:
        """The log of ``topic`` (created empty on first use)."""
        log = self.logs.get(topic)
        if log is None:
            log = self.logs[topic] = TopicLog()
        return log

    def group(self, name: str) -> MemoryGroup:
        """The group ``name`` (created on first use, reading its retry topic)."""
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = MemoryGroup(name)
            group.attach(group.retry_topic, self.log(group.retry_topic))
        return group

    def new_receipt(self) -> bytes:
        """A receipt never handed out before by this store."""
        return b"r%d" % next(self._receipts)

    # -- sending and aborting -----------------------------------------------------------

    def send(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store checked messages, all or nothing (see ``BrokerAdapter.send_batch``). Lock held."""
        now = self.tick()
        # A delay counts from the clock, a due time never before store time (after the
        # clock stepped back, store time waits at its high-water mark: see after()).
        wall = self.clock.now_ms()
        dues = [max(now, m.deliver_at(wall)) for m in messages]
        if max(dues) > now + self.max_delay_ms:
            raise InvalidDelay(
                "delay",
                max(dues) - now,
                f"due after the broker's max delay of {self.max_delay_ms} ms",
            )
        results: list[SendResult] = []
        in_batch: dict[tuple[str, str], SendResult] = {}
        for m, due in zip(messages, dues, strict=True):
            asked = m.deliver_at_ms if m.deliver_at_ms is not None else due
            index = None if m.key is None else (m.topic, m.key)
            if index is not None:
                dup = in_batch.get(index) or self._duplicate_of(index, asked)
                if dup is not None:
                    results.append(SendResult(SendStatus.DUPLICATE, dup.msg_id, dup.deliver_at_ms))
                    continue
            seq = next(self._seq)
            stored = StoredMessage(
                f"{self._prefix}{seq}",
                m.topic,
                m.body,
                m.key,
                m.tags,
                m.properties or NO_PROPERTIES,
                due,
                asked,
                now,
                m.size(),
            )
            self.messages[stored.msg_id] = stored
            self._schedule(Copy(stored, m.topic, due, 0, seq))
            result = SendResult(SendStatus.OK, stored.msg_id, due)
            if index is not None:
                self._keys.put(m.topic, index[1], stored)
                in_batch[index] = result
            results.append(result)
        self.tick()  # what is due now fires now
        return results

    def _duplicate_of(self, index: tuple[str, str], asked: int) -> SendResult | None:
        """The earlier send a keyed send duplicates: its key's message is pending, or
        fired (not aborted) and was asked for the same due ms."""
        old = self._keys.get(*index)
        if old is None or old.aborted:
            return None
        if old.fired_ms is None or old.asked_ms == asked:
            return SendResult(SendStatus.DUPLICATE, old.msg_id, old.due_ms)
        return None

    def _schedule(self, copy: Copy) -> None:
        heapq.heappush(self._wheel, (copy.due_ms, copy.seq, copy))
        log = self.log(copy.topic)
        log.pending += 1
        log.used = True
        if copy.is_first:
            copy.message.copy = copy
            self.due_index.add(copy)
        else:
            self.retry_index.add(copy)

    def _unschedule(self, stored: StoredMessage) -> None:
        """Take ``stored``'s pending first copy off the wheel (left in the heap marked
        cancelled; the heap is rebuilt once cancelled copies are half of it)."""
        copy = stored.copy
        if copy is None:
            return
        copy.cancelled = True
        stored.copy = None
        self.log(copy.topic).pending -= 1
        self.due_index.discard(copy)
        self._cancelled += 1
        if self._cancelled > 1024 and 2 * self._cancelled > len(self._wheel):
            self._wheel = [entry for entry in self._wheel if not entry[2].cancelled]
            heapq.heapify(self._wheel)
            self._cancelled = 0

    def move(self, stored: StoredMessage, due_ms: int, body: bytes | None) -> None:
        """Move the pending ``stored`` to ``due_ms`` (a new copy on the wheel, the old
        one cancelled), with ``body`` if given; fires it if due now. Lock held."""
        self._unschedule(stored)
        stored.due_ms = due_ms
        if body is not None:
            stored.size += len(body) - len(stored.body)
            stored.body = body
        self._schedule(Copy(stored, stored.topic, due_ms, 0, next(self._seq)))
        self.tick()
        self.changed.notify_all()  # a waiting pull's wake-up time may have changed

    def knows(self, topic: str) -> bool:
        """Whether a message was ever sent to ``topic`` (see ``UnknownTopic``)."""
        log = self.logs.get(topic)
        return log is not None and log.used

    def keyed(self, topic: str, key: str) -> StoredMessage | None:
        """The last message sent to ``topic`` with ``key`` that the store still knows."""
        return self._keys.get(topic, key)

    def keys_under(self, topic: str, prefix: str) -> list[str]:
        """The keys of ``topic`` the store knows that start with ``prefix``, in key
        order (see :class:`~broker_adapter.memory.key_index.KeyIndex`). Lock held."""
        return self._keys.under(topic, prefix)

    def abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See ``BrokerAdapter.abort``. Lock held."""
        self.tick()
        if msg_id is not None:
            stored = self.messages.get(msg_id)
            if stored is None:
                return AbortResult(AbortStatus.NOT_FOUND, msg_id)
        else:
            assert key is not None and topic is not None
            found = self._keys.get(topic, key)
            if found is None:
                return AbortResult(AbortStatus.NOT_FOUND, None)
            stored = found
        if stored.aborted:
            return AbortResult(AbortStatus.ABORTED, stored.msg_id)
        if stored.fired_ms is not None:
            return AbortResult(AbortStatus.ALREADY_DELIVERED, stored.msg_id)
        self.abort_pending(stored)
        return AbortResult(AbortStatus.ABORTED, stored.msg_id)

    def abort_pending(self, stored: StoredMessage) -> None:
        """Abort the pending ``stored`` (it never fires). Lock held."""
        stored.aborted = True
        self._unschedule(stored)
        heapq.heappush(self._aborted, (stored.due_ms, next(self._seq), stored))

    # -- settling deliveries ----------------------------------------------------------------

    def redeliver(
        self,
        group: MemoryGroup,
        flight: Flight,
        delay_ms: int | None,
        reason: str | None,
        *,
        dead: bool,
        counts: bool = True,
    ) -> None:
        """Send a settled delivery to ``group``'s retry topic (after ``delay_ms`` or the
        backoff of its attempts) or, with ``dead`` or on its last attempt, to its
        dead-letter topic; without ``counts`` (a release) this delivery is not an
        attempt and never makes it dead. Lock held."""
        now = self._now
        attempts = flight.attempts if counts else flight.attempts - 1
        msg = flight.copy.message
        error = reason[:4096] if reason else None
        if dead or (counts and attempts >= group.max_attempts):
            copy = Copy(msg, group.dead_topic, now, attempts, next(self._seq), fired_ms=now)
            log = self.log(group.dead_topic)
            log.used = True
            log.entries.append(copy)
            log.fired_total += 1
            group.dead(copy, attempts, error)
            self.changed.notify_all()
            return
        due = self.after(retry_backoff_ms(attempts) if delay_ms is None else delay_ms)
        self._schedule(Copy(msg, group.retry_topic, due, attempts, next(self._seq)))
        group.retrying(msg.msg_id, attempts, due, error)

    def retry_now(self, group: MemoryGroup, msg: StoredMessage) -> None:
        """Put a fresh copy of ``msg`` (attempts 0) on ``group``'s retry topic, due now
        (a requeued dead letter); fires at the next tick. Lock held."""
        self._schedule(Copy(msg, group.retry_topic, self._now, 0, next(self._seq)))

    # -- retention ------------------------------------------------------------------------

    def _trim(self, now: int) -> None:
        """Drop fired copies older than retention that every reading group has passed,
        and aborted messages whose due time is that old, with the key entries still
        pointing at them."""
        floor = now - self.retention_ms
        for topic, log in self.logs.items():
            if not log.entries or log.entries[0].fired_ms > floor:
                continue
            readers = [g for g in self.groups.values() if topic in g.cursors]
            limit = min((g.committed(topic) for g in readers), default=log.end)
            while log.entries and log.base < limit and log.entries[0].fired_ms <= floor:
                copy = log.entries.pop(0)
                log.base += 1
                if copy.is_first:
                    self._lingering.append(copy.message)
        if self._lingering:
            still = []
            for msg in self._lingering:
                if any(g.still_needs(msg.msg_id) for g in self.groups.values()):
                    still.append(msg)
                else:
                    self._forget(msg)
            self._lingering = still
        while self._aborted and self._aborted[0][0] <= floor:
            self._forget(heapq.heappop(self._aborted)[2])

    def _forget(self, msg: StoredMessage) -> None:
        self.messages.pop(msg.msg_id, None)
        if msg.key is not None:
            self._keys.drop(msg.topic, msg.key, msg)
        for group in self.groups.values():
            group.forget(msg.msg_id)

    # -- pending, in order ------------------------------------------------------------------

    def wheel_in_order(self) -> list[Copy]:
        """The live copies on the wheel in due order (a snapshot). Lock held."""
        return [c for _d, _s, c in sorted(self._wheel, key=lambda e: e[:2]) if not c.cancelled]

    def close(self) -> None:
        """Stop listening to the clock; wake every waiting pull."""
        self.clock.unsubscribe(self._on_clock)
        with self.lock:
            self.changed.notify_all()


__all__ = ["MemoryStore"]
