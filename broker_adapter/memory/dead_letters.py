"""Dead letters and pending counts of a memory broker: ``dead_letters``,
``requeue_dead``, ``purge_dead`` and ``count_pending``.

A group's dead letters are the copies on its ``%DLQ%<group>`` log that its
``dead_copies`` still names (a requeue or purge drops the name, a second death
names the newer copy): a page reads the log on from an index (the cursor),
looking at no more than :data:`SCAN_BUDGET` copies per call. Requeue and purge of
"the oldest" take the first names of ``dead_copies`` (kept in order of death).

Counts come from the store's :class:`~broker_adapter.memory.due_index.DueIndex`
of pending first sends and the one of waiting retries, which count their copies
per ~65 s span of due time: exact, at the cost of the spans a call covers.
"""

from __future__ import annotations

import itertools
import struct

from broker_adapter.cursors import PositionCursor
from broker_adapter.memory.groups import MemoryGroup
from broker_adapter.memory.records import Copy
from broker_adapter.memory.store import MemoryStore
from broker_adapter.results import DeadLetterPage, MessageState, MessageView, PendingCounts

#: Most dead-letter log entries one page looks at.
SCAN_BUDGET = 5_000

_INDEX = struct.Struct(">Q")
# memory dead-letter cursor, version 1: a log index
_CURSOR = PositionCursor("md1", "dead_letters", (_INDEX.size,))


def encode_cursor(index: int) -> str:
    """The opaque, url-safe cursor of a page whose next one starts at log ``index``."""
    return _CURSOR.encode(_INDEX.pack(index))


def decode_cursor(cursor: str) -> int:
    """The log index a cursor of :func:`encode_cursor` names.

    :raises InvalidArgument: for anything else.
    """
    (index,) = _INDEX.unpack(_CURSOR.decode(cursor))
    return int(index)


def dead_view(group: MemoryGroup, copy: Copy, with_body: bool) -> MessageView:
    """What ``dead_letters`` shows of ``group``'s dead letter ``copy``."""
    msg = copy.message
    note = group.state_of(msg.msg_id)
    return MessageView(
        msg_id=msg.msg_id,
        topic=msg.topic,
        state=MessageState.DEAD,
        deliver_at_ms=copy.fired_ms,
        born_ms=msg.born_ms,
        attempts=note.attempts,
        key=msg.key,
        tags=msg.tags,
        body_size=len(msg.body),
        groups={group.name: MessageState.DEAD},
        error=note.error,
        body=msg.body if with_body else None,
    )


def dead_letters(
    store: MemoryStore, group: str, cursor: str | None, limit: int, with_body: bool
) -> DeadLetterPage:
    """One page; see :meth:`BrokerAdapter.dead_letters
    <broker_adapter.base.BrokerAdapter.dead_letters>`.

    :raises InvalidArgument: for a malformed cursor.
    """
    index = decode_cursor(cursor) if cursor is not None else 0
    with store.lock:
        store.tick()
        g = store.groups.get(group)
        log = None if g is None else store.logs.get(g.dead_topic)
        if g is None or log is None:
            return DeadLetterPage([], None)
        index = max(index, log.base)
        stop = min(log.end, index + SCAN_BUDGET)
        views: list[MessageView] = []
        while index < stop and len(views) < limit:
            copy = log.at(index)
            index += 1
            if g.dead_copies.get(copy.message.msg_id) is copy:
                views.append(dead_view(g, copy, with_body))
        more = index < log.end
        return DeadLetterPage(views, encode_cursor(index) if more else None)


def _chosen(g: MemoryGroup, msg_ids: tuple[str, ...] | None, limit: int) -> list[str]:
    """The ids of ``g``'s dead letters to act on: those named, or the ``limit`` oldest."""
    if msg_ids is None:
        out: list[str] = []
        for msg_id in g.dead_copies:
            if len(out) >= limit:
                break
            out.append(msg_id)
        return out
    return [i for i in msg_ids if i in g.dead_copies]


def requeue_dead(
    store: MemoryStore, group: str, msg_ids: tuple[str, ...] | None, limit: int
) -> int:
    """See :meth:`BrokerAdapter.requeue_dead <broker_adapter.base.BrokerAdapter.requeue_dead>`."""
    with store.lock:
        now = store.tick()
        g = store.groups.get(group)
        if g is None:
            return 0
        chosen = _chosen(g, msg_ids, limit)
        for msg_id in chosen:
            copy = g.dead_copies[msg_id]
            note = g.undead(msg_id, MessageState.PENDING)
            note.attempts, note.retry_due = 0, now
            store.retry_now(g, copy.message)
        if chosen:
            store.tick()  # due now: fires now
            store.changed.notify_all()
        return len(chosen)


def purge_dead(store: MemoryStore, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
    """See :meth:`BrokerAdapter.purge_dead <broker_adapter.base.BrokerAdapter.purge_dead>`."""
    with store.lock:
        store.tick()
        g = store.groups.get(group)
        if g is None:
            return 0
        chosen = _chosen(g, msg_ids, limit)
        for msg_id in chosen:
            g.undead(msg_id, MessageState.DONE)
        return len(chosen)


def count_pending(store: MemoryStore, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
    """See :meth:`BrokerAdapter.count_pending <broker_adapter.base.BrokerAdapter.count_pending>`."""
    with store.lock:
        store.tick()
        counts = [
            store.due_index.count_between(lo, hi, topic)
            + store.retry_index.count_between(lo, hi, topic)
            for lo, hi in itertools.pairwise(edges)
        ]
    return PendingCounts(counts)


__all__ = [
    "SCAN_BUDGET",
    "count_pending",
    "dead_letters",
    "decode_cursor",
    "encode_cursor",
    "purge_dead",
    "requeue_dead",
]
