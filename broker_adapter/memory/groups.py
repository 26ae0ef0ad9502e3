"""MemoryGroup: one consumer group of a memory broker (cursors, flights, notes).

A group reads each of its topics' logs from a cursor (the index of the next
copy to read). What it pulled and has not settled is *in flight*; its note on a
message (:class:`~broker_adapter.memory.records.GroupNote`) is what ``query``
shows for the group. Every method runs with the store's lock held; the store
moves copies (retries to the wheel, dead letters to ``%DLQ%<group>``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from broker_adapter.base import dead_letter_topic, retry_topic
from broker_adapter.memory.records import Copy, Flight, GroupNote, TopicLog
from broker_adapter.results import MessageState, ReceivedMessage


class MemoryGroup:
    """State of one consumer group (guarded by the store's lock).

    :param name: the group's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.retry_topic = retry_topic(name)
        self.dead_topic = dead_letter_topic(name)
        #: topic -> absolute index of the next copy to read in that topic's log.
        self.cursors: dict[str, int] = {}
        self.inflight: dict[bytes, Flight] = {}
        self.notes: dict[str, GroupNote] = {}
        #: msg id -> its copy on the dead-letter topic, while it is a dead letter, in
        #: order of death (a dict keeps insertion order): requeue/purge of the oldest.
        self.dead_copies: dict[str, Copy] = {}
        self.acked_total = 0
        self.invisible_ms = 60_000
        self.max_attempts = 16

    def attach(self, topic: str, log: TopicLog) -> None:
        """Read ``topic`` from its oldest retained copy (kept if already attached)."""
        self.cursors.setdefault(topic, log.base)

    def take(
        self,
        topic: str,
        log: TopicLog,
        room: int,
        byte_room: int,
        holder: object,
        deadline: int,
        new_receipt: Callable[[], bytes],
        may_cross: bool,
    ) -> Iterator[tuple[Flight, ReceivedMessage]]:
        """Put up to ``room`` copies of ``topic`` in flight, stopping before one that
        would cross ``byte_room`` unless it is the first and ``may_cross``; yields each delivery. Each
        delivery gets a receipt never used before (``new_receipt``), so a stale one
        never settles a later delivery of the same message."""
        cursor = max(self.cursors[topic], log.base)
        taken = 0
        while cursor < log.end and taken < room:
            copy = log.at(cursor)
            if (taken or not may_cross) and copy.message.size > byte_room:
                break
            attempts = copy.attempts + 1
            receipt = new_receipt()
            flight = Flight(copy, holder, deadline, receipt, (topic, cursor), attempts)
            self.inflight[receipt] = flight
            self._note(copy, MessageState.INFLIGHT, attempts)
            cursor += 1
            taken += 1
            byte_room -= copy.message.size
            self.cursors[topic] = cursor
            yield flight, copy.received(attempts, receipt)

    def _note(self, copy: Copy, state: MessageState, attempts: int) -> None:
        note = self.notes.get(copy.message.msg_id)
        if note is None:
            self.notes[copy.message.msg_id] = GroupNote(state, attempts)
        else:
            note.state, note.attempts, note.retry_due = state, attempts, None

    def settle(self, receipt: bytes) -> Flight | None:
        """Take the delivery ``receipt`` out of flight; ``None`` if it is not in flight."""
        return self.inflight.pop(receipt, None)

    def acked(self, flight: Flight) -> None:
        """Record an ack of ``flight`` (already settled)."""
        self.acked_total += 1
        note = self.notes[flight.copy.message.msg_id]
        note.state = MessageState.DONE

    def retrying(self, msg_id: str, attempts: int, due: int, error: str | None) -> None:
        """Record that ``msg_id`` waits on the wheel for a retry due at ``due``."""
        note = self.notes[msg_id]
        note.state, note.attempts, note.retry_due = MessageState.PENDING, attempts, due
        note.error = error or note.error

    def retry_fired(self, msg_id: str) -> None:
        """A retry copy of ``msg_id`` fired into this group's retry topic."""
        note = self.notes.get(msg_id)
        if note is not None and note.state is MessageState.PENDING:
            note.state, note.retry_due = MessageState.READY, None

    def dead(self, copy: Copy, attempts: int, error: str | None) -> None:
        """Record that a message went to this group's dead-letter topic as ``copy``."""
        msg_id = copy.message.msg_id
        note = self.notes[msg_id]
        note.state, note.attempts, note.retry_due = MessageState.DEAD, attempts, None
        note.error = error or note.error
        self.dead_copies.pop(msg_id, None)  # a second death goes to the end
        self.dead_copies[msg_id] = copy

    def undead(self, msg_id: str, state: MessageState) -> GroupNote:
        """Make the dead letter ``msg_id`` one no more (requeued: ``PENDING``, purged:
        ``DONE``); its note."""
        del self.dead_copies[msg_id]
        note = self.notes[msg_id]
        note.state = state
        return note

    def expired(self, now_ms: int) -> list[Flight]:
        """Settle and return the deliveries whose invisible time has passed."""
        gone = [f for f in self.inflight.values() if f.deadline <= now_ms]
        for flight in gone:
            del self.inflight[flight.receipt]
        return gone

    def held_by_count(self, holder: object) -> tuple[int, int]:
        """How many deliveries ``holder`` holds, and their bytes."""
        mine = [f.copy.message.size for f in self.inflight.values() if f.holder is holder]
        return len(mine), sum(mine)

    def extend(self, receipt: bytes, deadline: int) -> bool:
        """Move the deadline of the delivery ``receipt``; ``False`` if not in flight."""
        flight = self.inflight.get(receipt)
        if flight is None:
            return False
        flight.deadline = deadline
        return True

    def held_by(self, holder: object) -> list[Flight]:
        """Settle and return the deliveries ``holder`` holds (it is closing)."""
        gone = [f for f in self.inflight.values() if f.holder is holder]
        for flight in gone:
            del self.inflight[flight.receipt]
        return gone

    def next_deadline(self) -> int | None:
        """The earliest invisible-time deadline in flight."""
        return min((f.deadline for f in self.inflight.values()), default=None)

    def committed(self, topic: str) -> int:
        """The oldest index of ``topic`` this group may still need: its oldest copy in
        flight, or its cursor (retention keeps everything from there)."""
        held = [f.position[1] for f in self.inflight.values() if f.position[0] == topic]
        return min([self.cursors[topic], *held])

    def state_of(self, msg_id: str) -> GroupNote:
        """This group's note on a fired message of a topic it reads (``READY`` if unread)."""
        return self.notes.get(msg_id) or GroupNote(MessageState.READY, 0)

    def still_needs(self, msg_id: str) -> bool:
        """Whether a retry of ``msg_id`` is still under way here (waiting, ready or in flight)."""
        note = self.notes.get(msg_id)
        return note is not None and note.state not in (MessageState.DONE, MessageState.DEAD)

    def forget(self, msg_id: str) -> None:
        """Drop the note on a message retention dropped (and its dead letter)."""
        self.notes.pop(msg_id, None)
        self.dead_copies.pop(msg_id, None)

    def ready(self, logs: dict[str, TopicLog]) -> dict[str, int]:
        """Per topic, copies fired and not yet read by this group."""
        return {t: max(logs[t].end - max(c, logs[t].base), 0) for t, c in self.cursors.items()}


__all__ = ["MemoryGroup"]
