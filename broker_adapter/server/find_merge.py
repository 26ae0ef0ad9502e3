"""``find_pending`` over several endpoints, without I/O: one walk in due-time order
through every endpoint's pages, shared by the blocking and the asyncio client.

Each server pages its own messages in due order, with a cursor of its own. A
client of several servers asks each (still unfinished) server for one page per
call and hands out, merged by due time, only what no server can still undercut:
the messages due no later than the last one of any page that has more after it.
A server whose page was handed out whole moves on to its next page; one whose
page was cut keeps reading that page from where it was cut (the last message
handed out, by id; if that one has left the page meanwhile, by its due time).
So pages stay in due order across servers, each call does bounded work (one page
per server), and every call makes progress: it hands something out or moves at
least one server on.

The merged cursor is url-safe text (``x1`` + base64 of JSON): per endpoint the
server's cursor of the page being read, whether it is finished, and the last
message handed out from that page.
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

    #: The server's cursor of the page being read (``None``: its first page).
    cursor: str | None = None
    #: Whether that endpoint has nothing more.
    done: bool = False
    #: ``(due, server id)`` of the last message handed out from the page being read.
    after: tuple[int, str] | None = None


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
        for c, done, due, mid in raw:
            if not (c is None or isinstance(c, str)) or not isinstance(done, bool):
                raise ValueError(cursor)
            after = None if due is None else (int(due), str(mid))
            walks.append(Walk(c, done, after))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as e:
        raise _malformed(cursor) from e
    if len(walks) != endpoints:
        raise _malformed(cursor)
    return walks


def encode_cursor(walks: list[Walk]) -> str | None:
    """The merged cursor of ``walks`` (``None`` once every endpoint is done)."""
    if all(w.done for w in walks):
        return None
    raw = [[w.cursor, w.done, *(w.after if w.after is not None else (None, None))] for w in walks]
    data = json.dumps(raw, separators=(",", ":")).encode()
    return _TAG + base64.urlsafe_b64encode(data).decode().rstrip("=")


def _fresh(messages: list[MessageView], after: tuple[int, str] | None) -> list[MessageView]:
    """The messages of a page not handed out yet: those after ``after``'s id, or (when
    it left the page) those due after its time."""
    if after is None:
        return messages
    due, mid = after
    for i, m in enumerate(messages):
        if m.msg_id == mid:
            return messages[i + 1 :]
    return [m for m in messages if m.deliver_at_ms > due]


def merge_pages(
    walks: list[Walk],
    pages: dict[int, PendingPage | None],
    limit: int,
    prefixes: list[str],
) -> tuple[list[MessageView], list[Walk]]:
    """One merged page and the walks after it.

    :param walks: where each endpoint's walk was (:func:`decode_cursor`).
    :param pages: the page each endpoint that was not done answered (server ids),
        ``None`` for an endpoint that does not know the topic (it is done).
    :param limit: most messages to hand out.
    :param prefixes: per endpoint, what to put before its server ids (``NODE:``).
    """
    fresh: dict[int, list[MessageView]] = {}
    threshold: float = float("inf")
    for i, page in pages.items():
        if page is None:
            continue
        fresh[i] = _fresh(page.messages, walks[i].after)
        if page.cursor is not None:  # more after this page: nothing later may go out yet
            last = page.messages[-1].deliver_at_ms if page.messages else float("-inf")
            threshold = min(threshold, last)
    candidates = sorted(
        (m.deliver_at_ms, i, pos, m)
        for i, ms in fresh.items()
        for pos, m in enumerate(ms)
        if m.deliver_at_ms <= threshold
    )[:limit]
    taken: dict[int, MessageView] = {}
    counts: dict[int, int] = {}
    for _due, i, _pos, m in candidates:
        taken[i] = m
        counts[i] = counts.get(i, 0) + 1
    out = list(walks)
    for i, page in pages.items():
        if page is None:
            out[i] = Walk(done=True)
        elif counts.get(i, 0) == len(fresh[i]):  # its page went out whole: next page
            out[i] = Walk(page.cursor, page.cursor is None)
        elif i in taken:
            out[i] = replace(walks[i], after=(taken[i].deliver_at_ms, taken[i].msg_id))
    views = [replace(m, msg_id=prefixes[i] + m.msg_id) for _d, i, _p, m in candidates]
    return views, out


__all__ = ["Walk", "decode_cursor", "encode_cursor", "merge_pages"]
