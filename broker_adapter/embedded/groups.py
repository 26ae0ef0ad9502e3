"""Consumer groups of the embedded broker: cursors and in-flight messages.

A group reads each of its topics' ``ready`` keys in order from a cursor (the
next key to read), like a RocketMQ consume queue offset. What it has pulled and
not yet acked is *in flight*, in memory (bounded by the consumers' flow control).
The durable cursor of a topic is its *committed* position: the oldest key still
in flight, or the read cursor when none is. After a crash the group re-reads
from there, so nothing is lost and at most some acked messages come again.

Acks write nothing per message: the committed position is persisted lazily
(every ``commit_interval_ms`` at most) and in the same batch as any nack or
dead letter. Retries go through the wheel into ``%RETRY%<group>``. The members
of a group are :class:`~broker_adapter.embedded.consumer.EmbeddedConsumer` objects.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from collections import deque
from typing import TYPE_CHECKING

from broker_adapter.embedded.keys import U64, tid_bytes
from broker_adapter.embedded.records import record_attempts
from broker_adapter.results import MessageState

if TYPE_CHECKING:
    from broker_adapter.embedded.consumer import EmbeddedConsumer


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

    def topic_keys(self, tid: int) -> deque[bytes]:
        """The pulled keys of topic ``tid`` in pull order, to append newly pulled ones to
        (their :attr:`inflight` entries set alongside, then :meth:`watch` their pull)."""
        keys = self.by_topic.get(tid)
        if keys is None:
            keys = self.by_topic[tid] = deque()
        return keys

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
        dl = self.deadlines
        if len(dl) > 2 * len(self.inflight) + 64:
            # Most entries are pulls settled since (a pull's deadline is its invisible
            # time away): drop them now rather than at their deadline. Kept, they were
            # ~2 objects per pull for 60 s that every full GC walked: at 3,300 jobs/s a
            # 34 ms gen-2 pause, the longest job-start stall seen (issue 16).
            dl[:] = [entry for entry in dl if entry[2].receipts is not None]
            heapq.heapify(dl)
        heapq.heappush(dl, (pull.deadline, self._pulls, pull))

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

    def restore(self, flight: Flight) -> None:
        """Put back in flight a message whose settling failed to write (a full disk),
        with its deadline: it expires and comes back as usual, and the committed
        position stays before it (so no cursor write can skip it)."""
        pull = Pull(flight.deadline, flight.consumer)
        self.inflight[flight.receipt] = (flight.record, pull)
        flight.consumer.held += 1
        flight.consumer.held_bytes += flight.size
        keys = self.by_topic.setdefault(flight.tid, deque())
        at = bisect.bisect_left(keys, flight.receipt)
        if at == len(keys) or keys[at] != flight.receipt:
            keys.insert(at, flight.receipt)
        self.watch(pull, [flight.receipt])

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


__all__ = ["ConsumerGroup", "Flight", "Pull"]
