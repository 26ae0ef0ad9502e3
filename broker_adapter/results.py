"""What brokers answer: send and abort results, message views, received messages, stats."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

#: Shared, immutable "no properties".
NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class SendStatus(enum.Enum):
    """Outcome of a send."""

    #: Accepted and durable: it will be delivered or aborted, never lost.
    OK = "OK"
    #: Not stored: the topic already has a pending message with this key; the result
    #: carries that message's id and time (sends with a key are idempotent).
    DUPLICATE = "DUPLICATE"


class AbortStatus(enum.Enum):
    """Outcome of an abort message."""

    #: The message was pending; it will never be delivered.
    ABORTED = "ABORTED"
    #: Too late: the message had already fired (it is ready, in flight or done).
    ALREADY_DELIVERED = "ALREADY_DELIVERED"
    #: No message with that id (or no message with that key on that topic).
    NOT_FOUND = "NOT_FOUND"


class RescheduleStatus(enum.Enum):
    """Outcome of a reschedule."""

    #: The message was pending; it is now due at the new time (and has the new body).
    RESCHEDULED = "RESCHEDULED"
    #: Too late: the message had already fired (it is ready, in flight or done); unchanged.
    ALREADY_DELIVERED = "ALREADY_DELIVERED"
    #: No pending message with that id (or key on that topic): never sent, or aborted.
    NOT_FOUND = "NOT_FOUND"


class MessageState(enum.Enum):
    """Where a message is in its life."""

    PENDING = "PENDING"  # on the timing wheel, not yet due (also: waiting for a retry)
    READY = "READY"  # fired, waiting for a consumer group to pull it
    INFLIGHT = "INFLIGHT"  # pulled, not yet acked, within its invisible time
    DONE = "DONE"  # acked
    ABORTED = "ABORTED"  # cancelled by an abort message before it fired
    DEAD = "DEAD"  # moved to the dead-letter topic ``%DLQ%<group>``


class SendResult(NamedTuple):
    """Answer to a send: ``status``, the message id and when it is due (epoch ms).

    A named tuple: immutable, and cheap to build on the hot send path.
    """

    status: SendStatus
    msg_id: str
    deliver_at_ms: int


@dataclass(frozen=True, slots=True)
class AbortResult:
    """Answer to an abort message; ``msg_id`` is ``None`` only for ``NOT_FOUND`` by key."""

    status: AbortStatus
    msg_id: str | None


@dataclass(frozen=True, slots=True)
class RescheduleResult:
    """Answer to a reschedule: ``status``, the message id (``None`` only for
    ``NOT_FOUND`` by key) and when it is due now (epoch ms; ``None`` for
    ``NOT_FOUND``): the new time for ``RESCHEDULED``, the time it fired at for
    ``ALREADY_DELIVERED``."""

    status: RescheduleStatus
    msg_id: str | None
    deliver_at_ms: int | None


#: Most keys a :class:`PrefixAbortResult` lists (its count is always exact).
MAX_REPORTED_KEYS = 1_000


@dataclass(frozen=True, slots=True)
class PrefixAbortResult:
    """Answer to ``abort_prefix``: how many pending messages were aborted, and the
    keys under the prefix whose last message had already fired (the first
    :data:`MAX_REPORTED_KEYS` of them in key order; ``already_delivered_count``
    counts them all)."""

    aborted: int
    already_delivered: tuple[str, ...] = ()
    already_delivered_count: int = 0


#: How ``MessageView.state`` sums up the groups: the least finished state wins.
_LEAST_FINISHED_FIRST = (
    MessageState.INFLIGHT,
    MessageState.PENDING,
    MessageState.READY,
    MessageState.DEAD,
    MessageState.DONE,
)


def overall_state(groups: Mapping[str, MessageState]) -> MessageState:
    """The state a fired message shows, given each group's state (``READY`` with none)."""
    states = set(groups.values())
    return next((s for s in _LEAST_FINISHED_FIRST if s in states), MessageState.READY)


@dataclass(frozen=True, slots=True)
class MessageView:
    """A read-only snapshot of one message as the broker knows it.

    ``state`` summarises ``groups`` (each consumer group's own state for this
    message): the least finished of ``INFLIGHT, PENDING, READY, DEAD, DONE``.
    """

    msg_id: str
    topic: str
    state: MessageState
    deliver_at_ms: int
    born_ms: int
    attempts: int = 0
    key: str | None = None
    tags: str | None = None
    body_size: int = 0
    groups: Mapping[str, MessageState] = field(default_factory=dict)
    error: str | None = None
    #: The body, only in the answers of ``find_pending(..., with_body=True)``.
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class PendingPage:
    """One page of ``find_pending``: messages in due-time order, and the cursor of
    the next page (``None``: this was the last). A page may hold fewer messages than
    asked, even none, while ``cursor`` is not ``None``: each call does bounded
    work, so keep going until the cursor is ``None``."""

    messages: list[MessageView]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    """One page of ``dead_letters``: a group's dead letters, oldest death first, and
    the cursor of the next page (``None``: this was the last). Like a
    :class:`PendingPage`, a page may hold fewer messages than asked, even none,
    while ``cursor`` is not ``None``: keep going until it is ``None``."""

    messages: list[MessageView]
    cursor: str | None


#: Most bucket edges one ``count_pending`` call takes (so at most 999 buckets).
MAX_COUNT_EDGES = 1_000


@dataclass(frozen=True, slots=True)
class PendingCounts:
    """Answer to ``count_pending``: ``counts[i]`` pending messages are due in
    ``[edges_ms[i], edges_ms[i + 1])``. ``exact`` is ``False`` when the broker gave
    an estimate to keep the call cheap (each adapter documents how it estimates)."""

    counts: list[int]
    exact: bool = True

    @property
    def total(self) -> int:
        """Pending messages in all the buckets together."""
        return sum(self.counts)


class ReceivedMessage(NamedTuple):
    """A message handed to a consumer; pass it back to ``ack`` or ``nack``.

    ``attempts`` counts deliveries to this group, 1 on the first. ``receipt``
    is the broker's opaque handle for this delivery. A named tuple: immutable,
    and cheap to build on the hot pull path.
    """

    msg_id: str
    topic: str
    body: bytes
    deliver_at_ms: int
    born_ms: int
    attempts: int
    receipt: bytes
    key: str | None = None
    tags: str | None = None
    properties: Mapping[str, str] = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class TopicStats:
    """Counters of one topic: messages on the wheel, fired so far, and (summed over
    the groups that read it) fired but not yet pulled, and pulled but not yet acked."""

    pending: int = 0
    fired_total: int = 0
    ready: int = 0
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Counters of one consumer group, over all its topics."""

    ready: int = 0
    inflight: int = 0
    dead: int = 0
    acked_total: int = 0


@dataclass(frozen=True, slots=True)
class BrokerStats:
    """What ``stats()`` reports: per topic, per group and totals."""

    topics: Mapping[str, TopicStats]
    groups: Mapping[str, GroupStats]

    @property
    def pending(self) -> int:
        """Messages on the timing wheel, all topics (retries included)."""
        return sum(t.pending for t in self.topics.values())

    @property
    def fired_total(self) -> int:
        """Messages fired since the data directory was created."""
        return sum(t.fired_total for t in self.topics.values())

    @property
    def dead(self) -> int:
        """Dead letters of all groups: messages dead-lettered and not requeued or
        purged since."""
        return sum(g.dead for g in self.groups.values())
