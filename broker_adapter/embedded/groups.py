"""Consumer groups of the embedded broker: cursors, in-flight messages, the consumer.

A group reads each of its topics' ``ready`` keys in order from a cursor (the
next key to read), like a RocketMQ consume queue offset. What it has pulled and
not yet acked is *in flight*, in memory (bounded by the consumers' flow control).
The durable cursor of a topic is its *committed* position: the oldest key still
in flight, or the read cursor when none is. After a crash the group re-reads
from there, so nothing is lost and at most some acked messages come again.

Acks write nothing per message: the committed position is persisted lazily
(every ``commit_interval_ms`` at most) and in the same batch as any nack or
dead letter. Retries go through the wheel into ``%RETRY%<group>``.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_adapter.base import Consumer
from broker_adapter.checks import (
    check_invisible_ms,
    check_nack_delay,
    check_pull_args,
    check_release_delay,
)
from broker_adapter.embedded.keys import CF_READY, U64, tid_bytes, topic_range
from broker_adapter.embedded.records import delivery_fields, record_attempts
from broker_adapter.errors import BrokerClosed
from broker_adapter.results import NO_PROPERTIES, MessageState, ReceivedMessage

if TYPE_CHECKING:
    from broker_adapter.embedded.broker import EmbeddedBroker


class Pull:
    """What the messages of one ``pull`` share: their deadline, their consumer, and
    the receipts still in flight (dropped once all are settled, so an acked pull
    holds no memory while its deadline waits in the heap)."""

    __slots__ = ("consumer", "deadline", "left", "receipts")

    def __init__(self, deadline: int, consumer: EmbeddedConsumer) -> None:
        self.deadline = deadline
        self.consumer = consumer
        self.receipts: list[bytes] | None = None
        self.left = 0

    def settle(self) -> None:
        """One of this pull's messages left flight."""
        self.left -= 1
        if self.left <= 0:
            self.receipts = None


class Flight:
    """A view of one in-flight message, built on the slow paths (nack, expiry, release).

    The hot path stores only ``receipt -> (record, pull)``: the topic id is the
    receipt's prefix, the attempt count is in the record, its size is its length.
    """

    __slots__ = ("attempts", "consumer", "deadline", "receipt", "record", "size", "tid")

    def __init__(self, receipt: bytes, record: bytes, pull: Pull) -> None:
        self.receipt = receipt
        self.tid = (receipt[0] << 8) | receipt[1]
        self.record = record
        self.attempts = record_attempts(record) + 1
        self.deadline = pull.deadline
        self.size = len(record)
        self.consumer = pull.consumer


class ConsumerGroup:
    """State of one consumer group; all fields are guarded by ``lock``.

    :param gid: the group's id in the key space.
    :param name: its name.
    :param cursors: per topic id, the next ready key to read.
    :param acked_total: acks counted so far (persisted with the cursors).
    """

    def __init__(self, gid: int, name: str, cursors: dict[int, bytes], acked_total: int) -> None:
        self.gid = gid
        self.gid_bytes = tid_bytes(gid)
        self.name = name
        self.lock = threading.Lock()
        self.cursors = cursors
        self.ready: dict[int, int] = {}
        self.inflight: dict[bytes, tuple[bytes, Pull]] = {}
        # Per topic, pulled keys in pull (= key) order; acked ones are skipped lazily.
        self.by_topic: dict[int, deque[bytes]] = {}
        # One entry per pull: (deadline, pull number, the pull).
        self.deadlines: list[tuple[int, int, Pull]] = []
        self._pulls = 0
        self.acked_total = acked_total
        self.dirty: set[int] = set()
        self.last_commit = 0.0  # time.monotonic() of the last cursor write
        self.retry_tid = -1
        self.invisible_ms = 60_000
        self.max_attempts = 16

    def committed(self, tid: int) -> bytes:
        """The durable position of topic ``tid``: oldest in-flight key, or the cursor."""
        keys = self.by_topic.get(tid)
        inflight = self.inflight
        while keys and keys[0] not in inflight:
            keys.popleft()
        return keys[0] if keys else self.cursors[tid]

    def add_pulled(self, receipts: list[bytes], records: list[bytes], pull: Pull) -> None:
        """Record messages pulled together (they share one invisible-time deadline)."""
        if not receipts:
            return
        inflight = self.inflight
        by_topic = self.by_topic
        for receipt, record in zip(receipts, records, strict=True):
            inflight[receipt] = (record, pull)
            tid = (receipt[0] << 8) | receipt[1]
            keys = by_topic.get(tid)
            if keys is None:
                keys = by_topic[tid] = deque()
            keys.append(receipt)
        self.watch(pull, receipts)

    def watch(self, pull: Pull, receipts: list[bytes]) -> None:
        """Make ``pull`` the holder of ``receipts`` and expire them at its deadline."""
        pull.receipts, pull.left = receipts, len(receipts)
        self._pulls += 1
        heapq.heappush(self.deadlines, (pull.deadline, self._pulls, pull))

    def extend(self, receipt: bytes, deadline: int) -> bool:
        """Move the in-flight message ``receipt`` to a deadline of its own."""
        entry = self.inflight.get(receipt)
        if entry is None:
            return False
        record, old = entry
        pull = Pull(deadline, old.consumer)
        old.settle()  # its entry in the old pull's list is now skipped by expired()
        self.inflight[receipt] = (record, pull)
        self.watch(pull, [receipt])
        return True

    def flight(self, receipt: bytes) -> Flight | None:
        """A view of the in-flight message ``receipt``, if it is in flight."""
        entry = self.inflight.get(receipt)
        return None if entry is None else Flight(receipt, entry[0], entry[1])

    def drop_flight(self, receipt: bytes) -> Flight | None:
        """Forget an in-flight message (acked, nacked or expired); ``None`` if unknown."""
        entry = self.inflight.pop(receipt, None)
        if entry is None:
            return None
        entry[1].settle()
        flight = Flight(receipt, entry[0], entry[1])
        flight.consumer.held -= 1
        flight.consumer.held_bytes -= flight.size
        self.dirty.add(flight.tid)
        return flight

    def expired(self, now_ms: int) -> list[Flight]:
        """In-flight messages whose invisible time has passed (left in flight)."""
        out: list[Flight] = []
        dl = self.deadlines
        while dl and dl[0][0] <= now_ms:
            pull = heapq.heappop(dl)[2]
            for receipt in pull.receipts or ():
                entry = self.inflight.get(receipt)
                if entry is not None and entry[1] is pull:
                    out.append(Flight(receipt, entry[0], pull))
        return out

    def held_by(self, consumer: EmbeddedConsumer) -> list[Flight]:
        """Views of the messages ``consumer`` holds."""
        return [
            Flight(r, rec, pull)
            for r, (rec, pull) in self.inflight.items()
            if pull.consumer is consumer
        ]

    def next_deadline(self) -> int | None:
        """The earliest invisible-time deadline (possibly of messages acked since)."""
        return self.deadlines[0][0] if self.deadlines else None

    def state_of(self, tid: int, ready_key: bytes) -> MessageState:
        """This group's state of the fired message at ``ready_key`` of topic ``tid``."""
        if ready_key in self.inflight:
            return MessageState.INFLIGHT
        cursor = self.cursors.get(tid)
        if cursor is not None and ready_key < cursor:
            return MessageState.DONE
        return MessageState.READY

    def cursor_value(self, tid: int) -> bytes:
        """The stored form of topic ``tid``'s cursor: committed key + acked total."""
        return self.committed(tid) + U64.pack(self.acked_total)


class EmbeddedConsumer(Consumer):
    """A member of a consumer group of an :class:`EmbeddedBroker`."""

    _ids = itertools.count(1)

    def __init__(
        self,
        broker: EmbeddedBroker,
        group: ConsumerGroup,
        topics: Iterable[int],
        topic_names: tuple[str, ...],
        max_inflight: int,
        max_inflight_bytes: int,
    ) -> None:
        self._broker = broker
        self._group = group
        self._tids = list(topics)
        self.group = group.name
        self.topics = topic_names
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes
        self.held = 0
        self.held_bytes = 0
        self.closed = False
        self._turn = 0
        self.id = next(self._ids)

    def _check(self) -> None:
        if self.closed:
            raise BrokerClosed(f"consumer of group {self.group!r} is closed")
        self._broker.check_open()

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`."""
        check_pull_args(max_messages, wait_ms)
        self._check()
        return self._broker._groups.pull(self, max_messages, wait_ms)

    def take(self, max_messages: int, now_ms: int) -> list[ReceivedMessage]:
        """Read up to ``max_messages`` ready messages and put them in flight (group lock held)."""
        group = self._group
        room = min(max_messages, self.max_inflight - self.held)
        out: list[ReceivedMessage] = []
        if room <= 0 or self.held_bytes >= self.max_inflight_bytes:
            return out
        broker = self._broker
        tails = broker._tails
        names = broker._topic_names
        pull = Pull(now_ms + group.invisible_ms, self)
        receipts: list[bytes] = []
        records: list[bytes] = []
        tids = self._tids
        n = len(tids)
        self._turn = (self._turn + 1) % n
        for i in range(n):
            tid = tids[(self._turn + i) % n]
            cursor = group.cursors[tid]
            tail = tails.get(tid)
            if tail is None or cursor > tail:
                continue
            rows = broker._store.scan(CF_READY, cursor, topic_range(tid)[1], room - len(out))
            held_bytes, max_bytes = self.held_bytes, self.max_inflight_bytes
            taken = 0
            for receipt, data in rows:  # hot loop: locals only, one object per message
                size = len(data)
                if out and held_bytes + size > max_bytes:
                    break
                attempts, due, born, raw, key, tags, props, body = delivery_fields(data)
                receipts.append(receipt)
                records.append(data)
                held_bytes += size
                out.append(
                    ReceivedMessage(
                        raw.hex(),
                        names[(raw[14] << 8) | raw[15]],
                        body,
                        due,
                        born,
                        attempts + 1,
                        receipt,
                        key,
                        tags,
                        props or NO_PROPERTIES,
                    )
                )
                taken += 1
            if taken:
                group.cursors[tid] = receipts[-1] + b"\x00"
                group.ready[tid] = group.ready.get(tid, 0) - taken
                self.held += taken
                self.held_bytes = held_bytes
            if len(out) >= room or self.held_bytes >= self.max_inflight_bytes:
                break
        group.add_pulled(receipts, records, pull)
        return out

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        if self.closed or self._broker._closed:
            self._check()
        return self._broker._groups.ack(self._group, message.receipt)

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        check_nack_delay(delay_ms)
        self._check()
        return self._broker._groups.nack(self._group, message.receipt, delay_ms, reason, dead=False)

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        self._check()
        return self._broker._groups.nack(self._group, message.receipt, None, reason, dead=True)

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        self._check()
        return self._broker._groups.extend(self._group, message.receipt, invisible_ms)

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`."""
        check_release_delay(delay_ms)
        self._check()
        return self._broker._groups.nack(
            self._group, message.receipt, delay_ms, None, dead=False, attempt=False
        )

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        self._broker._groups.release_held(self)

    @property
    def group_state(self) -> ConsumerGroup:
        """The shared state of this consumer's group."""
        return self._group

    @property
    def topic_ids(self) -> list[int]:
        """Topic ids this consumer pulls from (its group's retry topic included)."""
        return self._tids

    def __repr__(self) -> str:
        return f"<EmbeddedConsumer {self.id} group={self.group!r} topics={self.topics!r}>"


__all__ = ["ConsumerGroup", "EmbeddedConsumer", "Flight"]
