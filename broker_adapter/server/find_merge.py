"""``find_pending`` over several endpoints, without I/O: one walk in due-time order
through every endpoint's pages, shared by the blocking and the asyncio client.

Each server pages its own messages in due order, with a cursor of its own. A
client of several servers asks each (still unfinished) server for one page per
call and hands out, merged by due time, only what no server can still undercut:
the messages due no later than the last one of any page that has more after it
(:func:`plan`). A server whose page goes out whole moves on to that page's
cursor. From a server whose page is cut (by the limit, or because another server
may still undercut the rest), the client asks again, from the same cursor, for
just as many messages as it hands out: the server's cursor then lies right after
them (:func:`finish`). So every server's cursor always marks exactly what was
handed out, pages stay in due order across servers, each call does bounded work
(at most two pages per server), and every call makes progress: it hands
something out or moves at least one server on.

The merged cursor is url-safe text (``x1`` + base64 of JSON): per endpoint the
server's cursor (``null``: from its start) and whether it is finished.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, replace

from broker_adapter.errors import InvalidArgument
from broker_adapter.results import MessageView, PendingPage

_TAG = "x1"  # merged cursor, version 1


@dataclass(frozen=True, slots=True)
class Walk:
    """Where the walk through one endpoint's pages is."""

    #: The server's cursor of what is not handed out yet (``None``: its start).
    cursor: str | None = None
    #: Whether that endpoint has nothing more.
    done: bool = False


def _malformed(cursor: str) -> InvalidArgument:
    return InvalidArgument(
        f"malformed cursor {cursor!r}: pass back the cursor of the previous page of the "
        "same client (same endpoints), with the same filters"
    )


def decode_cursor(cursor: str | None, endpoints: int) -> list[Walk]:
    """The walks a merged cursor names (fresh ones for ``None``).

    :raises InvalidArgument: for a cursor not made by :func:`encode_cursor` for as
        many endpoints.
    """
    if cursor is None:
        return [Walk() for _ in range(endpoints)]
    try:
        if not cursor.startswith(_TAG):
            raise ValueError(cursor)
        raw = json.loads(base64.urlsafe_b64decode(cursor[len(_TAG) :] + "=="))
        walks = []
        for c, done in raw:
            if not (c is None or isinstance(c, str)) or not isinstance(done, bool):
                raise ValueError(cursor)
            walks.append(Walk(c, done))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as e:
        raise _malformed(cursor) from e
    if len(walks) != endpoints:
        raise _malformed(cursor)
    return walks


def encode_cursor(walks: list[Walk]) -> str | None:
    """The merged cursor of ``walks`` (``None`` once every endpoint is done)."""
    if all(w.done for w in walks):
        return None
    data = json.dumps([[w.cursor, w.done] for w in walks], separators=(",", ":")).encode()
    return _TAG + base64.urlsafe_b64encode(data).decode().rstrip("=")


def plan(pages: dict[int, PendingPage | None], limit: int) -> dict[int, int]:
    """How many messages to hand out from each endpoint's page: the first ``limit`` by
    due time of those no page with more after it can undercut.

    :param pages: the page each endpoint that was not done answered, ``None`` for one
        that does not know the topic.
    """
    threshold: float = float("inf")
    for page in pages.values():
        if page is not None and page.cursor is not None:  # more after it: a bound
            last = page.messages[-1].deliver_at_ms if page.messages else float("-inf")
            threshold = min(threshold, last)
    order = sorted(
        (m.deliver_at_ms, i, pos)
        for i, page in pages.items()
        if page is not None
        for pos, m in enumerate(page.messages)
        if m.deliver_at_ms <= threshold
    )[:limit]
    takes = {i: 0 for i, page in pages.items() if page is not None}
    for _due, i, _pos in order:
        takes[i] += 1
    return takes


def _next_due(page: PendingPage, handed: int) -> float:
    """The earliest an endpoint's next message can be due once ``handed`` messages of
    its ``page`` went out (``-inf``: unknown, an empty page with more after it)."""
    if handed < len(page.messages):
        return page.messages[handed].deliver_at_ms
    if page.cursor is None:
        return float("inf")
    return page.messages[-1].deliver_at_ms if page.messages else float("-inf")


def refetches(
    walks: list[Walk], pages: dict[int, PendingPage | None], takes: dict[int, int]
) -> dict[int, tuple[int, str | None]]:
    """Per endpoint whose page :func:`plan` cut (``0 < take < len``): the ``limit`` (the
    take) and ``cursor`` (its walk's) to ask it again with, for just what goes out; the
    answers are :func:`finish`'s ``fetched``."""
    out = {}
    for i, take in takes.items():
        cut = pages[i]
        if cut is not None and 0 < take < len(cut.messages):
            out[i] = (take, walks[i].cursor)
    return out


def finish(
    walks: list[Walk],
    pages: dict[int, PendingPage | None],
    takes: dict[int, int],
    fetched: dict[int, PendingPage],
    prefixes: list[str],
) -> tuple[list[MessageView], list[Walk]]:
    """The merged page's messages (ids prefixed per endpoint, in due order) and the
    walks after it.

    :param pages: the pages :func:`plan` was given.
    :param takes: what it answered.
    :param fetched: for each page it cut (``0 < take < len``), the endpoint's answer
        to the same cursor with ``limit`` set to the take: all of it goes out, and
        its cursor follows it. Should an answer hold fewer than asked (the server's
        messages changed meanwhile), what the other endpoints would hand out after
        the first message left behind is held back for a later call.
    :param prefixes: per endpoint, what to put before its server ids (``NODE:``).
    """
    out = list(walks)
    handed: dict[int, PendingPage] = {}
    bound: float = float("inf")  # the earliest a message not handed out can be due
    for i, page in pages.items():
        if page is None:
            out[i] = Walk(done=True)
            continue
        take = takes.get(i, 0)
        if i in fetched:
            part = handed[i] = fetched[i]
            if part.cursor is not None:
                bound = min(bound, _next_due(page, len(part.messages)))
        elif take == len(page.messages):
            handed[i] = page
            bound = min(bound, _next_due(page, take))
        else:  # take == 0: its page waits
            bound = min(bound, _next_due(page, 0))
    held = True
    while held:  # hold back what a short answer left out of order (a fixed point)
        held = False
        for i, part in list(handed.items()):
            if part.messages and part.messages[-1].deliver_at_ms > bound:
                del handed[i]
                bound = min(bound, part.messages[0].deliver_at_ms)
                held = True
    views: list[tuple[int, int, MessageView]] = []
    for i, part in handed.items():
        out[i] = Walk(part.cursor, part.cursor is None)
        views.extend(
            (m.deliver_at_ms, i, replace(m, msg_id=prefixes[i] + m.msg_id)) for m in part.messages
        )
    views.sort(key=lambda t: (t[0], t[1]))
    return [v for _d, _i, v in views], out


__all__ = ["Walk", "decode_cursor", "encode_cursor", "finish", "plan", "refetches"]
