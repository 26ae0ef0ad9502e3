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
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_adapter.base import Consumer
from broker_adapter.embedded.keys import (
    CF_READY,
    U64,
    id_tid,
    next_key,
    tid_bytes,
    topic_range,
)
from broker_adapter.embedded.records import Record
from broker_adapter.errors import BrokerClosed, InvalidArgument
from broker_adapter.results import MessageState, ReceivedMessage

if TYPE_CHECKING:
    from broker_adapter.embedded.broker import EmbeddedBroker


class Flight:
    """One pulled, not yet acked message."""

    __slots__ = ("attempts", "consumer", "deadline", "receipt", "record", "size", "tid")

    def __init__(
        self,
        receipt: bytes,
        tid: int,
        record: bytes,
        attempts: int,
        deadline: int,
        size: int,
        consumer: EmbeddedConsumer,
    ) -> None:
        self.receipt = receipt
        self.tid = tid
        self.record = record
        self.attempts = attempts
        self.deadline = deadline
        self.size = size
        self.consumer = consumer


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
        self.inflight: dict[bytes, Flight] = {}
        self.by_topic: dict[int, OrderedDict[bytes, None]] = {}
        self.deadlines: list[tuple[int, bytes]] = []
        self.acked_total = acked_total
        self.dirty: set[int] = set()
        self.last_commit_ms = 0
        self.retry_tid = -1
        self.invisible_ms = 60_000
        self.max_attempts = 16

    def committed(self, tid: int) -> bytes:
        """The durable position of topic ``tid``: oldest in-flight key, or the cursor."""
        flights = self.by_topic.get(tid)
        if flights:
            return next(iter(flights))
        return self.cursors[tid]

    def add_flight(self, flight: Flight) -> None:
        """Record a pulled message."""
        self.inflight[flight.receipt] = flight
        self.by_topic.setdefault(flight.tid, OrderedDict())[flight.receipt] = None
        heapq.heappush(self.deadlines, (flight.deadline, flight.receipt))
        flight.consumer.held += 1
        flight.consumer.held_bytes += flight.size

    def drop_flight(self, receipt: bytes) -> Flight | None:
        """Forget an in-flight message (acked, nacked or expired); ``None`` if unknown."""
        flight = self.inflight.pop(receipt, None)
        if flight is None:
            return None
        del self.by_topic[flight.tid][receipt]
        flight.consumer.held -= 1
        flight.consumer.held_bytes -= flight.size
        self.dirty.add(flight.tid)
        return flight

    def expired(self, now_ms: int) -> list[Flight]:
        """In-flight messages whose invisible time has passed (left in flight)."""
        out: list[Flight] = []
        dl = self.deadlines
        while dl and dl[0][0] <= now_ms:
            deadline, receipt = heapq.heappop(dl)
            flight = self.inflight.get(receipt)
            if flight is not None and flight.deadline == deadline:
                out.append(flight)
        return out

    def next_deadline(self) -> int | None:
        """The earliest invisible-time deadline, if any."""
        dl = self.deadlines
        while dl and dl[0][1] not in self.inflight:
            heapq.heappop(dl)
        return dl[0][0] if dl else None

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
        self._broker._check_open()

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise InvalidArgument(f"max_messages must be an int >= 1, got {max_messages!r}")
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
            raise InvalidArgument(f"wait_ms must be an int >= 0, got {wait_ms!r}")
        self._check()
        return self._broker._pull(self, max_messages, wait_ms)

    def take(self, max_messages: int, now_ms: int) -> list[ReceivedMessage]:
        """Read up to ``max_messages`` ready messages and put them in flight (group lock held)."""
        group = self._group
        room = min(max_messages, self.max_inflight - self.held)
        out: list[ReceivedMessage] = []
        if room <= 0 or self.held_bytes >= self.max_inflight_bytes:
            return out
        broker = self._broker
        tails = broker._tails
        store = broker._store
        deadline = now_ms + group.invisible_ms
        tids = self._tids
        n = len(tids)
        self._turn = (self._turn + 1) % n
        for i in range(n):
            tid = tids[(self._turn + i) % n]
            cursor = group.cursors[tid]
            tail = tails.get(tid)
            if tail is None or cursor > tail:
                continue
            rows = store.scan(CF_READY, cursor, topic_range(tid)[1], room - len(out))
            for receipt, data in rows:
                size = len(data)
                if out and self.held_bytes + size > self.max_inflight_bytes:
                    break
                rec = Record(data)
                attempts = rec.attempts + 1
                group.add_flight(Flight(receipt, tid, data, attempts, deadline, size, self))
                group.cursors[tid] = next_key(receipt)
                group.ready[tid] = group.ready.get(tid, 0) - 1
                out.append(
                    ReceivedMessage(
                        msg_id=rec.raw_id.hex(),
                        topic=broker._topic_names[id_tid(rec.raw_id)],
                        body=rec.body,
                        deliver_at_ms=rec.deliver_at,
                        born_ms=rec.born,
                        attempts=attempts,
                        receipt=receipt,
                        key=rec.key,
                        tags=rec.tags,
                        properties=rec.props,
                    )
                )
            if len(out) >= room or self.held_bytes >= self.max_inflight_bytes:
                break
        return out

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        self._check()
        return self._broker._ack(self._group, message.receipt)

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        if delay_ms is not None and (
            isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0
        ):
            raise InvalidArgument(f"delay_ms must be an int >= 0 or None, got {delay_ms!r}")
        self._check()
        return self._broker._nack(self._group, message.receipt, delay_ms, reason, dead=False)

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        self._check()
        return self._broker._nack(self._group, message.receipt, None, reason, dead=True)

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        self._broker._release(self)

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
