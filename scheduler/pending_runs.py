"""Listing pending runs: every page of ``find_pending``, lazily, in due-time order.

:func:`iter_runs` (and :func:`aiter_runs` on an async broker) walks the pages of
:meth:`BrokerAdapter.find_pending <broker_adapter.base.BrokerAdapter.find_pending>`
on one or more topics, merging the topics by due time, and yields each message as
a :class:`PendingRun` with its job call decoded. What is asked is a
:class:`RunQuery`: the topics, a key prefix, a tag (a job's name: the scheduler
tags each run with it), a due-time window and a limit.

A topic the broker never had a message on holds no runs, unless the caller named
it explicitly (``strict``): then :class:`~broker_adapter.errors.UnknownTopic`
says so. Pages are read as the iteration goes (each does bounded work), so runs
scheduled or moved meanwhile may or may not show up; none shows up twice unless
it was moved later between two pages.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import DecodeError, UnknownTopic
from broker_adapter.results import MessageView, PendingPage
from scheduler.jobcall import JobCall

#: Most messages asked for per ``find_pending`` page.
PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class PendingRun:
    """One pending run, as listed by ``app.pending(job=..., key_prefix=...)``.

    :param msg_id: its message id.
    :param job: the job's name (from the decoded call; the message's tags for a
        body that is not a job call; ``None`` if neither says).
    :param key: its business key, if any.
    :param deliver_at_ms: when it is due, epoch ms.
    :param topic: its topic.
    :param call: the decoded :class:`~scheduler.jobcall.JobCall`; ``None`` when
        the body is not one (a message sent without the scheduler).
    :param view: the broker's :class:`~broker_adapter.results.MessageView` (with the body).
    """

    msg_id: str
    job: str | None
    key: str | None
    deliver_at_ms: int
    topic: str
    call: JobCall | None
    view: MessageView = field(repr=False)

    @property
    def deliver_at(self) -> datetime:
        """When it is due, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.deliver_at_ms / 1000, UTC)

    @property
    def args(self) -> tuple[Any, ...]:
        """The job's positional arguments (``()`` when the body is not a job call)."""
        return () if self.call is None else self.call.args

    @property
    def kwargs(self) -> Mapping[str, Any]:
        """The job's keyword arguments (empty when the body is not a job call)."""
        return {} if self.call is None else self.call.kwargs

    @classmethod
    def of(cls, view: MessageView) -> PendingRun:
        """The run ``view`` (found ``with_body=True``) shows."""
        call = None
        if view.body is not None:
            try:
                call = JobCall.decode(view.body)
            except DecodeError:
                call = None
        job = call.name if call is not None else view.tags
        return cls(view.msg_id, job, view.key, view.deliver_at_ms, view.topic, call, view)


@dataclass(frozen=True, slots=True)
class RunQuery:
    """What to list (see the module docstring).

    :param topics: the topics to search (at least one); ``None`` stands for every
        topic of the broker (without ``key_prefix``, which needs a topic).
    :param strict: whether an unknown topic raises (an explicitly named one) or
        holds no runs (the app's own topics).
    :param limit: most runs to yield in all; ``None`` for every one.
    """

    topics: tuple[str | None, ...]
    strict: bool = False
    key_prefix: str | None = None
    tag: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    limit: int | None = None

    def page_args(self, topic: str | None, cursor: str | None) -> dict[str, Any]:
        """``find_pending`` arguments for the page of ``topic`` at ``cursor``."""
        size = PAGE_SIZE if self.limit is None else min(self.limit, PAGE_SIZE)
        return {
            "topic": topic,
            "key_prefix": self.key_prefix,
            "tag": self.tag,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "limit": size,
            "cursor": cursor,
            "with_body": True,
        }


class _Stream:
    """The pages of one topic: the views read and not yet yielded, and the cursor."""

    __slots__ = ("cursor", "done", "topic", "views")

    def __init__(self, topic: str | None) -> None:
        self.topic = topic
        self.views: collections.deque[MessageView] = collections.deque()
        self.cursor: str | None = None
        self.done = False

    def needs_page(self) -> bool:
        return not self.views and not self.done

    def add(self, page: PendingPage) -> None:
        self.views.extend(page.messages)
        self.cursor = page.cursor
        self.done = page.cursor is None

    def unknown(self, strict: bool, error: UnknownTopic) -> None:
        """The topic is unknown to the broker: no runs, or the error when named."""
        if strict:
            raise error
        self.done = True


def _next_view(streams: list[_Stream]) -> MessageView | None:
    """The earliest due view at the head of ``streams`` (each filled or done), taken."""
    live = [s for s in streams if s.views]
    if not live:
        return None
    return min(live, key=lambda s: s.views[0].deliver_at_ms).views.popleft()


def _fill(broker: BrokerAdapter, query: RunQuery, streams: list[_Stream]) -> None:
    for s in streams:
        while s.needs_page():
            try:
                s.add(broker.find_pending(**query.page_args(s.topic, s.cursor)))
            except UnknownTopic as e:
                s.unknown(query.strict, e)


def iter_runs(broker: BrokerAdapter, query: RunQuery) -> Iterator[PendingRun]:
    """The runs ``query`` asks for, in due-time order, reading pages as it goes.

    The first page of each topic is read now, so a closed broker or an unknown
    named topic raises here rather than on the first ``next()``.

    :raises UnknownTopic: for an unknown topic when ``query.strict``.
    :raises BrokerClosed: when the broker is closed.
    """
    streams = [_Stream(t) for t in query.topics]
    _fill(broker, query, streams)
    return _runs(broker, query, streams)


def _runs(broker: BrokerAdapter, query: RunQuery, streams: list[_Stream]) -> Iterator[PendingRun]:
    left = query.limit
    while left is None or left > 0:
        view = _next_view(streams)
        if view is None:
            return
        yield PendingRun.of(view)
        if left is not None:
            left -= 1
        if left is None or left > 0:
            _fill(broker, query, streams)


async def aiter_runs(broker: AsyncBrokerAdapter, query: RunQuery) -> AsyncIterator[PendingRun]:
    """:func:`iter_runs` on an async broker: an async generator, so nothing is read
    (and nothing raises) before the first ``__anext__``."""
    streams = [_Stream(t) for t in query.topics]
    left = query.limit
    while left is None or left > 0:
        for s in streams:
            while s.needs_page():
                try:
                    s.add(await broker.find_pending(**query.page_args(s.topic, s.cursor)))
                except UnknownTopic as e:
                    s.unknown(query.strict, e)
        view = _next_view(streams)
        if view is None:
            return
        yield PendingRun.of(view)
        left = None if left is None else left - 1


__all__ = ["PAGE_SIZE", "PendingRun", "RunQuery", "aiter_runs", "iter_runs"]
