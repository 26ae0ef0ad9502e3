"""PendingFinder: ``find_pending`` on the embedded broker, a page at a time.

"Pending" means never fired and not aborted: what ``reschedule`` and ``abort`` can
still act on. A retry waiting in ``%RETRY%<group>`` has fired, so it is not listed
(a page of a ``%RETRY%``/``%DLQ%`` topic is always empty).

A page is read on from a *position*, a wheel key: the cursor of the page before
(see :func:`encode_cursor`), at least the fire position and ``start_ms``. Two
ways to get there, both in due order and both giving positions in the same
order, so a cursor of one serves the other:

* **the wheel**: a bounded scan of the ``wheel`` family from the position, at
  most :data:`SCAN_BUDGET` entries per call, filtering each record by topic, key
  prefix and tag. A page cut short by the budget carries the position after the
  last entry scanned, so a caller keeps going until the cursor is ``None``.
* **the keys**, when a ``key_prefix`` is narrow: the keys under the prefix are one
  range of the ``keys`` family; when it holds at most :data:`NARROW_KEYS`, each
  key's message is located and kept if still pending, and the matches are sorted
  by wheel key and paged from the position. ``find_pending(topic,
  key_prefix="order:42:")`` with a million others pending reads a few keys.
"""

from __future__ import annotations

from broker_adapter.cursors import PositionCursor
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.query import MessageQuery
from broker_adapter.embedded.records import key_and_tags, record_id, record_tid
from broker_adapter.errors import UnknownTopic
from broker_adapter.results import PendingPage

#: Most wheel entries one call scans.
SCAN_BUDGET = 5_000
#: Most keys under a prefix for which a call locates each key's message instead.
NARROW_KEYS = 2_000

_END = b"\xff" * 17

#: (wheel key, record)
_Row = tuple[bytes, bytes]

# embedded cursor, version 1: a wheel key (16) or one past it (17)
_CURSOR = PositionCursor("e1", "find_pending", (16, 17))
#: The opaque, url-safe cursor of the page whose next one starts at a position.
encode_cursor = _CURSOR.encode
#: The position a cursor of :func:`encode_cursor` names (``InvalidArgument`` for anything else).
decode_cursor = _CURSOR.decode


class PendingFinder:
    """Answers ``find_pending`` for an embedded broker.

    :param core: the broker's core.
    :param queries: builds the views.
    """

    def __init__(self, core: BrokerCore, queries: MessageQuery) -> None:
        self._core = core
        self._queries = queries

    def find(
        self,
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
        :raises UnknownTopic: for a topic the broker never had a message on.
        """
        core = self._core
        position = decode_cursor(cursor) if cursor is not None else b""
        tid = None
        if topic is not None:
            tid = core.topic_ids.get(topic)
            if tid is None or not core.had_messages(tid):
                raise UnknownTopic(topic)
        lower = max(position, K.wheel_key(start_ms or 0, 0), core.fired_upto)
        upper = K.wheel_key(end_ms, 0) if end_ms is not None else _END
        if lower >= upper:
            return PendingPage([], None)
        tag_b = tag.encode() if tag is not None else None
        if key_prefix is not None:
            assert tid is not None  # the adapter base checked
            prefix = core.prefixes[tid] + key_prefix.encode()
            keyed = core.store.scan(K.CF_KEYS, prefix, K.prefix_end(prefix), NARROW_KEYS + 1)
            if len(keyed) <= NARROW_KEYS:
                rows = self._located(keyed, lower, upper, tag_b)
                more = len(rows) > limit
                page = rows[:limit]
                after = K.next_key(page[-1][0]) if more else None
                return self._page(page, after, with_body)
        return self._scan(tid, key_prefix, tag_b, lower, upper, limit, with_body)

    def _located(
        self, keyed: list[tuple[bytes, bytes]], lower: bytes, upper: bytes, tag: bytes | None
    ) -> list[_Row]:
        """The pending messages of the key entries ``keyed`` at wheel keys in
        ``[lower, upper)`` with ``tag``, sorted by wheel key."""
        core = self._core
        wheel = core.store.cf[K.CF_WHEEL]
        rows = []
        for _index, entry in keyed:
            current = core.locate(entry[:16])
            if not lower <= current < upper:
                continue
            record = wheel.get(current)
            if record is None or (tag is not None and key_and_tags(record)[1] != tag):
                continue
            rows.append((current, record))
        rows.sort()
        return rows

    def _scan(
        self,
        tid: int | None,
        key_prefix: str | None,
        tag: bytes | None,
        lower: bytes,
        upper: bytes,
        limit: int,
        with_body: bool,
    ) -> PendingPage:
        """A page from a bounded scan of the wheel from ``lower``."""
        scanned = self._core.store.scan(K.CF_WHEEL, lower, upper, SCAN_BUDGET)
        prefix = key_prefix.encode() if key_prefix is not None else None
        rows: list[_Row] = []
        for wkey, record in scanned:
            rtid = record_tid(record)
            if rtid != K.id_tid(record_id(record)) or (tid is not None and rtid != tid):
                continue  # a retry (it has fired), or another topic
            if prefix is not None or tag is not None:
                key, tags = key_and_tags(record)
                if (prefix is not None and not key.startswith(prefix)) or (
                    tag is not None and tags != tag
                ):
                    continue
            rows.append((wkey, record))
            if len(rows) >= limit:
                return self._page(rows, K.next_key(wkey), with_body)
        after = K.next_key(scanned[-1][0]) if len(scanned) >= SCAN_BUDGET else None
        return self._page(rows, after, with_body)

    def _page(self, rows: list[_Row], after: bytes | None, with_body: bool) -> PendingPage:
        views = [self._queries.found_view(record, with_body) for _wkey, record in rows]
        return PendingPage(views, None if after is None else encode_cursor(after))


__all__ = ["NARROW_KEYS", "SCAN_BUDGET", "PendingFinder", "decode_cursor", "encode_cursor"]
