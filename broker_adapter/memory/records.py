"""What the memory broker keeps: one :class:`StoredMessage` per send, and its copies.

A *copy* is one trip of a message through the timing wheel and a topic's log:
the first send is a copy on the message's own topic; a retry is a copy on
``%RETRY%<group>``; a dead letter is a copy on ``%DLQ%<group>``. The message
itself (id, topic, key, body, its first due time) is shared by all its copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker_adapter.results import NO_PROPERTIES, MessageState, ReceivedMessage


@dataclass(slots=True, eq=False)
class StoredMessage:
    """One accepted send.

    :ivar asked_ms: the due time as asked (before a past time was moved to now):
        what the keyed-duplicate rule compares.
    :ivar fired_ms: when its first copy fired; ``None`` while pending or aborted.
    :ivar copy: its first copy while that waits on the wheel (pending), else ``None``.
    """

    msg_id: str
    topic: str
    body: bytes
    key: str | None
    tags: str | None
    properties: Mapping[str, str]
    due_ms: int
    asked_ms: int
    born_ms: int
    size: int
    aborted: bool = False
    fired_ms: int | None = None
    copy: Copy | None = None


@dataclass(slots=True, eq=False)
class Copy:
    """One trip of ``message`` through the wheel into the log of ``topic``.

    :ivar attempts: deliveries to the group before this copy (0 for a first send).
    :ivar cancelled: aborted while on the wheel (left there, skipped when due).
    """

    message: StoredMessage
    topic: str
    due_ms: int
    attempts: int
    seq: int
    cancelled: bool = False
    fired_ms: int = 0

    @property
    def is_first(self) -> bool:
        """Whether this is the message's first send (not a retry or dead letter)."""
        return self.topic == self.message.topic

    def received(self, attempts: int, receipt: bytes) -> ReceivedMessage:
        """This copy as handed to a consumer, delivery number ``attempts``."""
        m = self.message
        return ReceivedMessage(
            m.msg_id,
            m.topic,
            m.body,
            self.due_ms,
            m.born_ms,
            attempts,
            receipt,
            m.key,
            m.tags,
            m.properties or NO_PROPERTIES,
        )


@dataclass(slots=True, eq=False)
class Flight:
    """One delivery in flight in a group: the copy, who holds it and until when.

    :ivar position: the copy's place in its topic log (``(topic, index)``).
    :ivar attempts: deliveries so far, this one included.
    """

    copy: Copy
    holder: object
    deadline: int
    receipt: bytes
    position: tuple[str, int]
    attempts: int


@dataclass(slots=True)
class GroupNote:
    """A group's state of one message, once the group first pulled it."""

    state: MessageState
    attempts: int
    error: str | None = None
    retry_due: int | None = None


@dataclass(slots=True)
class TopicLog:
    """The fired copies of one topic in fire order; ``base`` is the index of
    ``entries[0]`` (retention trims the head)."""

    entries: list[Copy] = field(default_factory=list)
    base: int = 0
    fired_total: int = 0
    pending: int = 0
    #: Whether a message was ever sent (or retried, or dead-lettered) to the topic;
    #: a topic only subscribed to has a log too.
    used: bool = False

    @property
    def end(self) -> int:
        """The index the next fired copy gets."""
        return self.base + len(self.entries)

    def at(self, index: int) -> Copy:
        """The copy at absolute ``index`` (``base <= index < end``)."""
        return self.entries[index - self.base]


__all__ = ["Copy", "Flight", "GroupNote", "StoredMessage", "TopicLog"]
