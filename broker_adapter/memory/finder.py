"""``find_pending`` on a memory broker: pages of pending messages in due order.

"Pending" means never fired and not aborted: what ``reschedule`` and ``abort`` can
still act on. A retry waiting in ``%RETRY%<group>`` has fired, so it is not listed
(a page of a ``%RETRY%``/``%DLQ%`` topic is always empty).

A page reads on from a position ``(due_ms, seq)``, the cursor (see
:func:`encode_cursor`), in the store's :class:`~broker_adapter.memory.due_index.DueIndex`,
looking at no more than :data:`SCAN_BUDGET` messages per call; a page cut short by
the budget still carries a cursor. With a ``key_prefix`` the candidates are the
keys under the prefix instead (a slice of the store's sorted key index), sorted by
due time: a narrow prefix costs its own keys, not the store's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from broker_adapter.cursors import PositionCursor
from broker_adapter.errors import UnknownTopic
from broker_adapter.memory.due_index import Position
from broker_adapter.memory.records import Copy
from broker_adapter.memory.store import MemoryStore
from broker_adapter.memory.views import found_view
from broker_adapter.results import PendingPage

#: Most pending messages one call looks at.
SCAN_BUDGET = 5_000

_POSITION = struct.Struct(">QQ")
# memory cursor, version 1: a (due ms, seq) position
_CURSOR = PositionCursor("m1", "find_pending", (_POSITION.size,))
_START: Position = (0, -1)


def encode_cursor(position: Position) -> str:
    """The opaque, url-safe cursor of a page that ends at ``position``."""
    return _CURSOR.encode(_POSITION.pack(*position))


def decode_cursor(cursor: str) -> Position:
    """The position a cursor of :func:`encode_cursor` names.

    :raises InvalidArgument: for anything else.
    """
    due, seq = _POSITION.unpack(_CURSOR.decode(cursor))
    return int(due), int(seq)


def find_pending(
    store: MemoryStore,
    topic: str | None,
    key_prefix: str | None,
    tag: str | None,
    start_ms: int | None,
    end_ms: int | None,
    limit: int,
    cursor: str | None,
    with_body: bool,
) -> PendingPage:
    """One page; see :meth:`BrokerAdapter.find_pending
    <broker_adapter.base.BrokerAdapter.find_pending>`.

    :raises InvalidArgument: for a malformed cursor.
    :raises UnknownTopic: for a topic the store never had a message on.
    """
    after = decode_cursor(cursor) if cursor is not None else _START
    if start_ms is not None:
        after = max(after, (start_ms, -1))
    with store.lock:
        store.tick()
        if topic is not None and not store.knows(topic):
            raise UnknownTopic(topic)
        copies: Iterator[Copy]
        if key_prefix is not None:
            assert topic is not None  # the base checked
            keys = dict.fromkeys(store.keys_under(topic, key_prefix))  # each once
            keyed = (store.keyed(topic, k) for k in keys)
            candidates = sorted(
                (c for m in keyed if m is not None and (c := m.copy) is not None),
                key=lambda c: (c.due_ms, c.seq),
            )
            copies = (c for c in candidates if (c.due_ms, c.seq) > after)
            budget = None
        else:
            copies = store.due_index.after(after)
            budget = SCAN_BUDGET
        found: list[Copy] = []
        for looked, copy in enumerate(copies, 1):
            if end_ms is not None and copy.due_ms >= end_ms:
                break
            if (topic is None or copy.topic == topic) and (tag is None or copy.message.tags == tag):
                found.append(copy)
                if len(found) >= limit:
                    return _page(found, (copy.due_ms, copy.seq), with_body)
            if budget is not None and looked >= budget:
                return _page(found, (copy.due_ms, copy.seq), with_body)
        return _page(found, None, with_body)


def _page(found: list[Copy], last: Position | None, with_body: bool) -> PendingPage:
    views = [found_view(c, with_body) for c in found]
    return PendingPage(views, None if last is None else encode_cursor(last))


__all__ = ["SCAN_BUDGET", "decode_cursor", "encode_cursor", "find_pending"]
