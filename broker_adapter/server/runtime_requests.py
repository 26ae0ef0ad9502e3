"""The runtime and dead-letter calls of the ``chronoq://`` clients as data: requests out,
replies merged and decoded in.

Reschedule, prefix abort, find, dead letters and pending counts send the same
requests to the same endpoints and read the replies the same way whichever client
makes the call. Each call here is a generator of :class:`Request` (which endpoint,
which op, which arguments): the client sends each request and passes the reply
back with ``send``, or an :class:`~broker_adapter.errors.UnknownTopic` with
``throw`` (a topic unknown to some endpoints is unknown only if no endpoint knows
it; every other error leaves the call as it was raised); the generator's return
value is the call's result. Shared by
:class:`~broker_adapter.server.client_runtime.RemoteRuntimeCalls`,
:class:`~broker_adapter.server.client_dead_letters.RemoteDeadLetterCalls` (blocking)
and :class:`~broker_adapter.server.async_client_runtime.AsyncRemoteRuntimeCalls`
(asyncio); each client only moves the bytes. No I/O here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from broker_adapter.checks import NewDue
from broker_adapter.errors import MessageTooLarge, UnknownTopic
from broker_adapter.results import (
    DeadLetterPage,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)
from broker_adapter.server import find_merge
from broker_adapter.server import values as V
from broker_adapter.server.routing import RESCHEDULE_RANK, merge_prefix_aborts

#: Bound on the answer to an ``abort_prefix``: it works through every matching key
#: (about 100,000 a second here), far longer than other requests may take.
ABORT_PREFIX_TIMEOUT_S = 600.0


class Node(Protocol):
    """What the merges read of an endpoint: its node id (known once it connected)."""

    node: str


E = TypeVar("E")
N = TypeVar("N", bound=Node)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Request(Generic[E]):
    """One runtime request to send.

    :ivar ep: the endpoint to send it to.
    :ivar op: the op name (a server that predates it is sent nothing).
    :ivar args: its arguments, as they go out.
    :ivar timeout_s: how long its answer may take (``None``: the client's default).
    :ivar body_len: a body's size to check against the link's ``max_body`` before
        sending (:func:`check_body`), or ``None``.
    """

    ep: E
    op: str
    args: dict[str, Any]
    timeout_s: float | None = None
    body_len: int | None = None


#: A call as data: yields requests, is sent their replies, returns the result.
Steps = Generator[Request[E], Any, R]


def check_body(request: Request[Any], max_body: int) -> None:
    """Refuse a request whose body the endpoint's link would not take.

    :param max_body: the link's largest body in bytes.
    :raises MessageTooLarge: when the body is larger; nothing is sent.
    """
    if request.body_len is not None and request.body_len > max_body:
        raise MessageTooLarge(request.body_len, max_body)


class Run(Generic[E, R]):
    """Steps a call: :attr:`request` is the next request to send (``None`` once the
    call is done, its result in :attr:`result`)."""

    def __init__(self, steps: Steps[E, R]) -> None:
        """:param steps: the call, not started yet."""
        self._steps = steps
        self.request: Request[E] | None = None
        self.result: R
        self.reply(None)

    def reply(self, answer: Any) -> None:
        """Pass the reply to :attr:`request` and step to the next one.

        :raises Exception: what the call raises (an error it did not absorb).
        """
        try:
            self.request = self._steps.send(answer)
        except StopIteration as stop:
            self.request, self.result = None, stop.value

    def fail(self, error: UnknownTopic) -> None:
        """Pass the error :attr:`request` raised and step on (the call may absorb it).

        :raises UnknownTopic: ``error``, when the call does not absorb it.
        """
        try:
            self.request = self._steps.throw(error)
        except StopIteration as stop:
            self.request, self.result = None, stop.value

    def call(self, send: Callable[[Request[E]], Any]) -> None:
        """Send :attr:`request` with ``send`` (blocking) and step on with its outcome."""
        assert self.request is not None
        try:
            answer = send(self.request)
        except UnknownTopic as e:  # the one error a call may absorb
            self.fail(e)
        else:
            self.reply(answer)


def reschedule_args(due: NewDue, body: bytes | None) -> dict[str, Any]:
    """The timing and body arguments of a ``reschedule`` request."""
    args: dict[str, Any] = {"delay": due.delay_ms, "at": due.deliver_at_ms}
    if body is not None:
        args["body"] = body
    return args


def find_args(
    topic: str | None,
    key_prefix: str | None,
    tag: str | None,
    start_ms: int | None,
    end_ms: int | None,
    limit: int,
    with_body: bool,
) -> dict[str, Any]:
    """The arguments of a ``find_pending`` request but its cursor."""
    return {
        "topic": topic,
        "prefix": key_prefix,
        "tag": tag,
        "start": start_ms,
        "end": end_ms,
        "limit": limit,
        "body": with_body,
    }


def dead_args(group: str, limit: int, with_body: bool) -> dict[str, Any]:
    """The arguments of a ``dead_letters`` request but its cursor."""
    return {"group": group, "limit": limit, "body": with_body}


def ids_by_endpoint(routes: list[list[tuple[E, str]]]) -> list[tuple[E, list[str]]]:
    """The server ids to send to each endpoint, given each id's routes (in order)."""
    out: dict[int, tuple[E, list[str]]] = {}
    for route in routes:
        for ep, raw in route:
            out.setdefault(id(ep), (ep, []))[1].append(raw)
    return list(out.values())


def merge_counts(answers: list[PendingCounts]) -> PendingCounts:
    """Several endpoints' counts as one: added up bucket by bucket."""
    counts = [sum(c) for c in zip(*(a.counts for a in answers), strict=True)]
    return PendingCounts(counts, all(a.exact for a in answers))


def as_pending(page: DeadLetterPage) -> PendingPage:
    """A dead-letter page in the shape :mod:`find_merge` walks (views due at death)."""
    return PendingPage(page.messages, page.cursor)


def reschedule(
    targets: Sequence[tuple[E, str]],
    msg_id: str | None,
    key: str | None,
    topic: str | None,
    due: NewDue,
    body: bytes | None,
    tag: Callable[[E, str], str],
) -> Steps[E, RescheduleResult]:
    """A reschedule, tried on each target ``(endpoint, server id)`` until one takes it
    (the best status wins; an id found by key comes back tagged with ``tag``)."""
    timing = reschedule_args(due, body)
    body_len = None if body is None else len(body)
    best = RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)
    for ep, raw in targets:
        where = {"id": raw} if msg_id is not None else {"key": key, "topic": topic}
        answer = yield Request(ep, "reschedule", {**where, **timing}, body_len=body_len)
        result = V.decode_reschedule(answer)
        if msg_id is not None:
            result = dataclasses.replace(result, msg_id=msg_id)
        elif result.msg_id is not None:
            result = dataclasses.replace(result, msg_id=tag(ep, result.msg_id))
        if RESCHEDULE_RANK[result.status] < RESCHEDULE_RANK[best.status]:
            best = result
        if best.status is RescheduleStatus.RESCHEDULED:
            break
    return best


def abort_prefix(
    endpoints: Sequence[E], topic: str, key_prefix: str
) -> Steps[E, PrefixAbortResult]:
    """A prefix abort on every endpoint, answers summed (unknown only if to all)."""
    answers = []
    unknown: UnknownTopic | None = None
    args = {"topic": topic, "prefix": key_prefix}
    for ep in endpoints:
        try:
            answer = yield Request(ep, "abort_prefix", args, ABORT_PREFIX_TIMEOUT_S)
        except UnknownTopic as e:
            unknown = e
            continue
        answers.append(V.decode_prefix_abort(answer))
    if not answers and unknown is not None:
        raise unknown
    return merge_prefix_aborts(answers)


def _walk(
    endpoints: Sequence[N],
    op: str,
    args: dict[str, Any],
    cursor: str | None,
    limit: int,
    decode: Callable[[Any], PendingPage],
    absorb_unknown: bool,
) -> Steps[N, PendingPage]:
    """Every endpoint's pages of ``op`` in one due order (:mod:`find_merge`)."""
    walks = find_merge.decode_cursor(cursor, len(endpoints))
    pages: dict[int, PendingPage | None] = {}
    unknown: UnknownTopic | None = None
    for i, walk in enumerate(walks):
        if walk.done:
            continue
        try:
            answer = yield Request(endpoints[i], op, {**args, "cursor": walk.cursor})
        except UnknownTopic as e:
            if not absorb_unknown:
                raise
            unknown, pages[i] = e, None
            continue
        pages[i] = decode(answer)
    if unknown is not None and cursor is None and all(p is None for p in pages.values()):
        raise unknown
    takes = find_merge.plan(pages, limit)
    fetched = {}
    for i, (take, at) in find_merge.refetches(walks, pages, takes).items():
        again = {**args, "limit": take, "cursor": at}  # just what goes out
        fetched[i] = decode((yield Request(endpoints[i], op, again)))
    # Node ids are read only now: the requests above are what taught them.
    prefixes = [f"{ep.node}:" for ep in endpoints]
    views, walks = find_merge.finish(walks, pages, takes, fetched, prefixes)
    return PendingPage(views, find_merge.encode_cursor(walks))


def find_pending(
    endpoints: Sequence[N],
    multi: bool,
    args: dict[str, Any],
    limit: int,
    cursor: str | None,
) -> Steps[N, PendingPage]:
    """A ``find_pending`` page (``args`` from :func:`find_args`): one endpoint's, or
    one due order over every endpoint (a topic unknown only if to all)."""
    if not multi:
        answer = yield Request(endpoints[0], "find_pending", {**args, "cursor": cursor})
        return V.decode_page(answer)
    walk = _walk(endpoints, "find_pending", args, cursor, limit, V.decode_page, True)
    return (yield from walk)


def _dead_page(answer: Any) -> PendingPage:
    return as_pending(V.decode_dead_page(answer))


def dead_letters(
    endpoints: Sequence[N], multi: bool, group: str, cursor: str | None, limit: int, with_body: bool
) -> Steps[N, DeadLetterPage]:
    """A ``dead_letters`` page: one endpoint's, or one order of death over every one."""
    args = dead_args(group, limit, with_body)
    if not multi:
        answer = yield Request(endpoints[0], "dead_letters", {**args, "cursor": cursor})
        return V.decode_dead_page(answer)
    page = yield from _walk(endpoints, "dead_letters", args, cursor, limit, _dead_page, False)
    return DeadLetterPage(page.messages, page.cursor)


def settle_dead(
    endpoints: Sequence[E],
    op: str,
    group: str,
    plan: list[tuple[E, list[str]]] | None,
    limit: int,
) -> Steps[E, int]:
    """A ``requeue_dead``/``purge_dead`` (``op``): the ids of ``plan``
    (:func:`ids_by_endpoint`) to their endpoints, or without ids (``plan`` is
    ``None``) the endpoints in turn for what ``limit`` leaves; answers summed."""
    done = 0
    if plan is not None:
        for ep, raw in plan:
            done += int((yield Request(ep, op, {"group": group, "ids": raw, "limit": limit})))
        return done
    for ep in endpoints:
        if done >= limit:
            break
        args = {"group": group, "ids": None, "limit": limit - done}
        done += int((yield Request(ep, op, args)))
    return done


def count_pending(
    endpoints: Sequence[E], edges: tuple[int, ...], topic: str | None
) -> Steps[E, PendingCounts]:
    """Every endpoint's pending counts, added up."""
    args = {"edges": list(edges), "topic": topic}
    answers = []
    for ep in endpoints:
        answers.append(V.decode_counts((yield Request(ep, "count_pending", args))))
    return merge_counts(answers)


__all__ = [
    "ABORT_PREFIX_TIMEOUT_S",
    "Node",
    "Request",
    "Run",
    "Steps",
    "abort_prefix",
    "as_pending",
    "check_body",
    "count_pending",
    "dead_args",
    "dead_letters",
    "find_args",
    "find_pending",
    "ids_by_endpoint",
    "merge_counts",
    "reschedule",
    "reschedule_args",
    "settle_dead",
]
