"""Searching pending messages page by page over HTTP: :func:`search_page`.

:func:`scheduler.pending_runs.iter_runs` merges several topics by due time for
one Python loop; an HTTP client needs a page and a cursor to come back with.
This is the same merge (each topic's ``find_pending`` pages, the earliest due
head taken first; the page arguments are :class:`~scheduler.pending_runs.RunQuery`'s)
with a cursor that records, per topic, the broker cursor of the page being read
and how many of its messages were handed out. Each request does bounded work: a
few broker pages per topic; a page may hold fewer than ``limit`` messages while
its cursor is not ``None``, as ``find_pending``'s pages may. Messages aborted or
moved between two requests shift the page being read, so a message may then be
missed or shown twice, as ``find_pending``'s pages allow.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import InvalidArgument, UnknownTopic
from broker_adapter.results import MessageView
from scheduler.pending_runs import RunQuery

#: Most messages per page, and per ``find_pending`` call (a search asks the broker for
#: pages of its first request's limit: a cursor's skip count refers to that size).
PAGE = 200
#: Most broker pages read per topic per request.
MAX_PAGES = 6


@dataclass
class _Stream:
    """One topic: the page being read (from ``start``), what of it is left."""

    topic: str | None
    start: str | None  # the broker cursor the current page was read with
    skip: int  # messages of the current page already handed out
    size: int  # messages per broker page (the same on every request of a search)
    views: list[MessageView] = field(default_factory=list)
    next_cursor: str | None = None  # the broker cursor after the current page
    read: bool = False  # whether the current page was read
    done: bool = False  # no more pages after the current one
    pages: int = 0

    def fill(self, broker: BrokerAdapter, query: RunQuery) -> None:
        """Read pages until one has something left, or the topic ends, or the bound."""
        while not self.read or (not self.views and not self.done):
            if self.read:  # the current page is used up: go on to the next
                self.start, self.skip, self.read = self.next_cursor, 0, False
            if self.pages >= MAX_PAGES:
                return
            self.pages += 1
            args = query.page_args(self.topic, self.start)
            args["limit"] = self.size
            page = broker.find_pending(**args)
            self.views = page.messages[self.skip :]
            self.next_cursor, self.done, self.read = page.cursor, page.cursor is None, True

    @property
    def finished(self) -> bool:
        return self.read and self.done and not self.views

    def position(self) -> list[str | int | None]:
        """Where the next request goes on: ``[broker cursor, messages to skip]``."""
        if self.read and not self.views:  # the page is used up: the next one, from its start
            return [self.next_cursor, 0]
        return [self.start, self.skip]


def _encode(streams: list[_Stream], size: int) -> str | None:
    live = {s.topic or "": s.position() for s in streams if not s.finished}
    if not live:
        return None
    doc = {"n": size, "t": live}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


_MALFORMED = "malformed cursor: pass back the cursor of the previous page, with the same filters"


def _decode(cursor: str, topics: tuple[str | None, ...]) -> list[_Stream]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        size, raw = int(doc["n"]), doc["t"]
        streams = [
            _Stream(t, raw[t or ""][0], int(raw[t or ""][1]), size)
            for t in topics
            if (t or "") in raw
        ]
    except (ValueError, TypeError, KeyError, IndexError, binascii.Error):
        raise InvalidArgument(_MALFORMED) from None
    if not 1 <= size <= PAGE or any(
        s.skip < 0 or not (s.start is None or isinstance(s.start, str)) for s in streams
    ):
        raise InvalidArgument(_MALFORMED)
    return streams


def _fill(broker: BrokerAdapter, query: RunQuery, stream: _Stream) -> None:
    try:
        stream.fill(broker, query)
    except UnknownTopic:
        if query.strict:
            raise
        stream.read, stream.done, stream.views = True, True, []


def search_page(
    broker: BrokerAdapter, query: RunQuery, limit: int, cursor: str | None
) -> tuple[list[MessageView], str | None]:
    """Up to ``limit`` (at most :data:`PAGE`) pending messages ``query`` matches, in
    due-time order over its topics (with bodies), and the cursor of the next page
    (``None``: no more).

    :raises InvalidArgument: for a malformed cursor or bad filters.
    :raises UnknownTopic: for an unknown topic when ``query.strict``.
    """
    if cursor is None:  # broker pages of the first request's limit, from then on
        streams = [_Stream(t, None, 0, min(limit, PAGE)) for t in query.topics]
    else:
        streams = _decode(cursor, query.topics)
    for s in streams:
        _fill(broker, query, s)
    out: list[MessageView] = []
    while len(out) < min(limit, PAGE):
        for s in streams:
            if not s.views and not s.finished:
                _fill(broker, query, s)  # its page is used up: the next one
        # A topic with more pages but none read (the work bound) could hold an earlier
        # message: the merge stops at it (its messages come on the next request).
        if any(not s.views and not s.finished for s in streams):
            break
        live = [s for s in streams if s.views]
        if not live:
            break
        head = min(live, key=lambda s: s.views[0].deliver_at_ms)
        out.append(head.views.pop(0))
        head.skip += 1
    return out, _encode(streams, streams[0].size if streams else PAGE)


def broker_topics(broker: BrokerAdapter) -> list[str]:
    """Every topic the broker has, retry and dead-letter topics (``%...%``) aside."""
    return sorted(t for t in broker.stats().topics if not t.startswith("%"))


def find_body(broker: BrokerAdapter, view: MessageView) -> bytes | None:
    """The body of the pending message ``view`` (``query`` answers without it): among
    the messages of its topic due in the same millisecond, a page or two."""
    cursor: str | None = None
    for _ in range(3):
        page = broker.find_pending(
            view.topic,
            start_ms=view.deliver_at_ms,
            end_ms=view.deliver_at_ms + 1,
            limit=PAGE,
            cursor=cursor,
            with_body=True,
        )
        for m in page.messages:
            if m.msg_id == view.msg_id:
                return m.body
        cursor = page.cursor
        if cursor is None:
            break
    return None


def find_key(broker: BrokerAdapter, key: str, topics: list[str]) -> list[MessageView]:
    """The pending messages (with bodies) whose key is exactly ``key``, on ``topics``:
    at most one per topic (a key is unique among a topic's pending messages)."""
    found: list[MessageView] = []
    for topic in topics:
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            try:
                page = broker.find_pending(
                    topic, key_prefix=key, limit=PAGE, cursor=cursor, with_body=True
                )
            except UnknownTopic:
                break
            hit = [m for m in page.messages if m.key == key]
            if hit:
                found.extend(hit)
                break
            cursor = page.cursor
            if cursor is None:
                break
    return sorted(found, key=lambda m: m.deliver_at_ms)


__all__ = ["MAX_PAGES", "PAGE", "broker_topics", "find_body", "find_key", "search_page"]
