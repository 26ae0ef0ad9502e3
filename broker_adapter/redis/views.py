"""Read-side helpers of the Redis broker: message views and stats from raw hashes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from broker_adapter.results import (
    BrokerStats,
    GroupStats,
    MessageState,
    MessageView,
    TopicStats,
    overall_state,
)

_GROUP_STATE = {
    b"R": MessageState.READY,
    b"I": MessageState.INFLIGHT,
    b"P": MessageState.PENDING,
    b"D": MessageState.DEAD,
    b"X": MessageState.DONE,
}
_MESSAGE_STATE = {b"P": MessageState.PENDING, b"X": MessageState.ABORTED}


def _text(value: bytes | None) -> str | None:
    return value.decode(errors="replace") if value else None


def build_view(
    msg_id: str, fields: Mapping[bytes, bytes], retry_due: Mapping[str, int], body_size: int
) -> MessageView | None:
    """The view of a message from its hash (``HGETALL``); ``retry_due`` maps a group
    whose retry is pending to its due time."""
    topic = fields.get(b"t")
    if topic is None:
        return None
    deliver_at = int(fields.get(b"d", b"0"))
    groups: dict[str, MessageState] = {}
    attempts = 0
    error = None
    for name, value in fields.items():
        if name[:1] == b"G":
            state = _GROUP_STATE.get(value[:1])
            if state is None:
                continue
            groups[name[1:].decode()] = state
            attempts = max(attempts, int(value[1:].split(b":", 1)[0] or b"0"))
        elif name[:1] == b"E" and value:
            error = value.decode(errors="replace")
    raw_state = fields.get(b"s", b"P")
    if raw_state in _MESSAGE_STATE:
        state = _MESSAGE_STATE[raw_state]
    else:
        state = overall_state(groups)
        if state is MessageState.PENDING and retry_due:
            deliver_at = min(retry_due.values())
    return MessageView(
        msg_id=msg_id,
        topic=topic.decode(),
        state=state,
        deliver_at_ms=deliver_at,
        born_ms=int(fields.get(b"o", b"0")),
        attempts=attempts,
        key=_text(fields.get(b"k")),
        tags=_text(fields.get(b"g")),
        body_size=body_size,
        groups=groups,
        error=error,
    )


def record_view(msg_id: str, record: bytes) -> MessageView:
    """A ``PENDING`` view from a pending record (``p:<bucket>`` field ``<n>``: 15 digits of due, a flag, then
    msgpack ``[topic, due, born, key, tags, props, body, asked]``, ``""`` for none)."""
    topic, due, born, key, tags, _props, body, _asked = msgpack.unpackb(record[16:], raw=True)
    return MessageView(
        msg_id=msg_id,
        topic=topic.decode(),
        state=MessageState.PENDING,
        deliver_at_ms=int(due),
        born_ms=int(born),
        attempts=0,
        key=_text(key),
        tags=_text(tags),
        body_size=len(body),
    )


def _row_view(
    msg_id: str,
    row: Sequence[Any],
    state: MessageState,
    body: bytes | None,
    groups: Mapping[str, MessageState] | None = None,
    error: str | None = None,
) -> MessageView:
    """A view from a Lua row whose first eight fields are ``(n, time, topic, born, key,
    tags, body size, deliveries)`` (``pending.lua``, ``find.lua``, ``dead.lua``)."""
    return MessageView(
        msg_id=msg_id,
        topic=row[2].decode(),
        state=state,
        deliver_at_ms=int(row[1]),
        born_ms=int(row[3] or 0),
        attempts=int(row[7]),
        key=_text(row[4] or None),
        tags=_text(row[5] or None),
        body_size=int(row[6]),
        groups={} if groups is None else groups,
        error=error,
        body=body,
    )


def pending_view(msg_id: str, row: Sequence[Any], body: bytes | None = None) -> MessageView:
    """A ``PENDING`` view from a ``pending.lua`` or ``find.lua`` row
    ``(n, due, topic, born, key, tags, body size, deliveries)``, with ``body`` if given."""
    return _row_view(msg_id, row, MessageState.PENDING, body)


def dead_view(msg_id: str, group: str, row: Sequence[Any], with_body: bool) -> MessageView:
    """A ``DEAD`` view from a ``dead.lua`` row ``(n, death, topic, born, key, tags, body
    size, deliveries, body, error)`` (the body only ``with_body``)."""
    body = bytes(row[8]) if with_body else None
    error = _text(row[9] or None)
    return _row_view(msg_id, row, MessageState.DEAD, body, {group: MessageState.DEAD}, error)


def build_stats(hashes: Sequence[Mapping[bytes, bytes]]) -> BrokerStats:
    """Sum the per-shard ``stat`` hashes into :class:`BrokerStats`."""
    pending: dict[str, int] = {}
    fired: dict[str, int] = {}
    ready: dict[tuple[str, str], int] = {}
    inflight: dict[tuple[str, str], int] = {}
    acked: dict[str, int] = {}
    dead: dict[str, int] = {}
    for h in hashes:
        for raw_name, raw_value in h.items():
            parts = raw_name.decode().split("|")
            value = int(raw_value)
            kind = parts[0]
            if kind == "p":
                pending[parts[1]] = pending.get(parts[1], 0) + value
            elif kind == "f":
                fired[parts[1]] = fired.get(parts[1], 0) + value
            elif kind in ("r", "i") and len(parts) == 3:
                table = ready if kind == "r" else inflight
                table[(parts[1], parts[2])] = table.get((parts[1], parts[2]), 0) + value
            elif kind == "a":
                acked[parts[1]] = acked.get(parts[1], 0) + value
            elif kind == "d":
                dead[parts[1]] = dead.get(parts[1], 0) + value
    topic_names = set(pending) | set(fired) | {t for _, t in ready} | {t for _, t in inflight}
    group_names = set(acked) | set(dead) | {g for g, _ in ready} | {g for g, _ in inflight}

    def total(
        table: Mapping[tuple[str, str], int], group: str | None = None, topic: str | None = None
    ) -> int:
        return max(
            sum(
                v
                for (g, t), v in table.items()
                if (group is None or g == group) and (topic is None or t == topic)
            ),
            0,
        )

    topics = {
        t: TopicStats(
            pending=max(pending.get(t, 0), 0),
            fired_total=fired.get(t, 0),
            ready=total(ready, topic=t),
            inflight=total(inflight, topic=t),
        )
        for t in topic_names
    }
    groups = {
        g: GroupStats(
            ready=total(ready, group=g),
            inflight=total(inflight, group=g),
            dead=dead.get(g, 0),
            acked_total=acked.get(g, 0),
        )
        for g in group_names
    }
    return BrokerStats(topics=topics, groups=groups)
