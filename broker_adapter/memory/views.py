"""What a memory broker shows: message views, pending messages in due order, stats.

Read-only functions over a :class:`~broker_adapter.memory.store.MemoryStore`,
called with its lock held.
"""

from __future__ import annotations

from broker_adapter.memory.records import Copy, StoredMessage
from broker_adapter.memory.store import MemoryStore
from broker_adapter.results import (
    BrokerStats,
    GroupStats,
    MessageState,
    MessageView,
    TopicStats,
    overall_state,
)


def _view(msg: StoredMessage, state: MessageState, **extra: object) -> MessageView:
    fields: dict[str, object] = {
        "msg_id": msg.msg_id,
        "topic": msg.topic,
        "state": state,
        "deliver_at_ms": msg.due_ms,
        "born_ms": msg.born_ms,
        "key": msg.key,
        "tags": msg.tags,
        "body_size": len(msg.body),
    }
    fields.update(extra)
    return MessageView(**fields)  # type: ignore[arg-type]


def message_view(store: MemoryStore, msg_id: str) -> MessageView | None:
    """The view of ``msg_id`` in any state, ``None`` when unknown (or trimmed)."""
    msg = store.messages.get(msg_id)
    if msg is None:
        return None
    if msg.aborted:
        return _view(msg, MessageState.ABORTED)
    if msg.fired_ms is None:
        return _view(msg, MessageState.PENDING)
    groups: dict[str, MessageState] = {}
    attempts, error, retry_due = 0, None, None
    for group in store.groups.values():
        if msg.topic not in group.cursors:
            continue
        note = group.state_of(msg_id)
        groups[group.name] = note.state
        attempts = max(attempts, note.attempts)
        error = note.error or error
        if note.retry_due is not None:
            retry_due = note.retry_due
    state = overall_state(groups)
    extra: dict[str, object] = {"groups": groups, "attempts": attempts, "error": error}
    if state is MessageState.PENDING and retry_due is not None:
        extra["deliver_at_ms"] = retry_due
    return _view(msg, state, **extra)


def _pending_view(copy: Copy) -> MessageView:
    return _view(
        copy.message, MessageState.PENDING, deliver_at_ms=copy.due_ms, attempts=copy.attempts
    )


def found_view(copy: Copy, with_body: bool) -> MessageView:
    """The view ``find_pending`` gives of a pending first copy (with its body if asked)."""
    if not with_body:
        return _pending_view(copy)
    body = copy.message.body
    return _view(copy.message, MessageState.PENDING, deliver_at_ms=copy.due_ms, body=body)


def pending_views(
    store: MemoryStore, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
) -> list[MessageView]:
    """Up to ``limit`` copies on the wheel in due order; a retry counts for its
    message's topic too."""
    out: list[MessageView] = []
    for copy in store.wheel_in_order():
        if end_ms is not None and copy.due_ms >= end_ms:
            break
        if start_ms is not None and copy.due_ms < start_ms:
            continue
        if topic is not None and topic not in (copy.topic, copy.message.topic):
            continue
        out.append(_pending_view(copy))
        if len(out) >= limit:
            break
    return out


def broker_stats(store: MemoryStore) -> BrokerStats:
    """Counters per topic and per group (see ``BrokerAdapter.stats``)."""
    ready: dict[str, int] = {}
    inflight: dict[str, int] = {}
    groups: dict[str, GroupStats] = {}
    for name, group in store.groups.items():
        unread = group.ready(store.logs)
        for topic, n in unread.items():
            ready[topic] = ready.get(topic, 0) + n
        for flight in group.inflight.values():
            topic = flight.position[0]
            inflight[topic] = inflight.get(topic, 0) + 1
        groups[name] = GroupStats(
            ready=sum(unread.values()),
            inflight=len(group.inflight),
            dead=len(group.dead_copies),  # now: requeue, purge and retention take them off
            acked_total=group.acked_total,
        )
    topics = {
        name: TopicStats(log.pending, log.fired_total, ready.get(name, 0), inflight.get(name, 0))
        for name, log in store.logs.items()
    }
    return BrokerStats(topics=topics, groups=groups)


__all__ = ["broker_stats", "found_view", "message_view", "pending_views"]
