"""The ``pending`` half of an app's broker calls: list runs not yet due, by topic,
job, key prefix and due-time window, sync and awaitable.

:class:`PendingCalls` is a base of :class:`~scheduler.app_calls.AppCalls` (hence of
:class:`~scheduler.scheduler.Scheduler`, which provides the brokers, topics and
handles declared here). ``app.pending(topic, start, end, limit)`` keeps its list
of :class:`~broker_adapter.results.MessageView`; with ``job=`` or ``key_prefix=``
it walks every page lazily (:mod:`scheduler.pending_runs`)::

    for run in app.pending(job=close_order, key_prefix="order:"):
        print(run.deliver_at, run.key, run.args)
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter
from broker_adapter.checks import check_key_prefix, check_pending_limit, is_int
from broker_adapter.errors import InvalidArgument
from broker_adapter.message import check_topic
from broker_adapter.results import MessageView
from scheduler.pending_runs import PendingRun, RunQuery, aiter_runs, iter_runs
from scheduler.spec import CRON_KEY_PREFIX
from scheduler.timing import datetime_to_ms

if TYPE_CHECKING:
    from scheduler.handles import JobHandle

#: What ``start=``/``end=`` take: an aware datetime or epoch ms.
TimeBound = datetime | int | None
#: How many runs the list form of ``pending`` returns by default.
DEFAULT_PENDING_LIMIT = 100


def _time_ms(name: str, value: TimeBound) -> int | None:
    if value is None or isinstance(value, datetime):
        return None if value is None else datetime_to_ms(value)
    if not is_int(value):
        raise TypeError(f"{name}= takes an aware datetime or epoch ms, got {value!r}")
    return value


def _pending_args(
    start: TimeBound, end: TimeBound, limit: int
) -> tuple[int | None, int | None, int]:
    check_pending_limit(limit)
    return _time_ms("start", start), _time_ms("end", end), limit


def check_app_prefix(key_prefix: object) -> str:
    """A key prefix for the app's runs: non-empty, and not one of cron's occurrence keys."""
    prefix = check_key_prefix(key_prefix)
    if prefix.startswith(CRON_KEY_PREFIX) or CRON_KEY_PREFIX.startswith(prefix):
        raise InvalidArgument(
            f"key_prefix={prefix!r} would match cron occurrences (keys {CRON_KEY_PREFIX!r}...), "
            "which the cron planner arms; give your own keys' prefix, e.g. 'order:42:'"
        )
    return prefix


class PendingCalls(abc.ABC):
    """``pending``, ``iter_pending`` and their ``_async`` twins; see the module."""

    @abc.abstractmethod
    def client_broker(self, call: str) -> BrokerAdapter:
        """The broker for sync client call ``call``, after the loop rule.

        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """

    @abc.abstractmethod
    async def async_broker(self) -> AsyncBrokerAdapter:
        """The running event loop's async broker of this app."""

    @abc.abstractmethod
    def topics(self) -> set[str]:
        """The topics this app's jobs are sent to (``cancel_all`` and ``pending``
        cover them all when no topic is named)."""

    @abc.abstractmethod
    def handle(self, name: str) -> JobHandle[Any, Any]:
        """The handle of the job registered under ``name``.

        :raises JobNotFound: for an unknown name.
        """

    @overload
    def pending(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
    ) -> list[MessageView]: ...

    @overload
    def pending(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
        *,
        job: JobHandle[Any, Any] | str,
        key_prefix: str | None = None,
    ) -> Iterator[PendingRun]: ...

    @overload
    def pending(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
        *,
        job: None = None,
        key_prefix: str,
    ) -> Iterator[PendingRun]: ...

    def pending(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
        *,
        job: JobHandle[Any, Any] | str | None = None,
        key_prefix: str | None = None,
    ) -> list[MessageView] | Iterator[PendingRun]:
        """Runs not yet due, in due-time order, in one of two forms.

        * ``app.pending(topic, start, end, limit)`` (no ``job``/``key_prefix``): a
          list of up to ``limit`` (default 100)
          :class:`~broker_adapter.results.MessageView`, of ``topic`` or of every
          topic of the broker (as before the runtime calls existed);
        * with ``job=`` and/or ``key_prefix=``: a lazy iterator over **every**
          matching run (up to ``limit`` if given) as
          :class:`~scheduler.pending_runs.PendingRun` (job name, args, kwargs, key,
          due time, msg id), reading the broker's pages as it goes; see
          :meth:`iter_pending`, which this is.

        :param topic: only this topic.
        :param start: only runs due at or after this (aware datetime or epoch ms).
        :param end: only runs due before this (aware datetime or epoch ms).
        :param job: only this job's runs (a handle or a registered name).
        :param key_prefix: only runs whose key starts with this.
        :raises InvalidSchedule: for a naive datetime.
        :raises InvalidArgument: for ``limit`` < 1; see :meth:`iter_pending`.
        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        if job is None and key_prefix is None:
            limit = DEFAULT_PENDING_LIMIT if limit is None else limit
            start_ms, end_ms, limit = _pending_args(start, end, limit)
            return self.client_broker("app.pending").pending(topic, start_ms, end_ms, limit)
        return self.iter_pending(
            job=job, key_prefix=key_prefix, topic=topic, start=start, end=end, limit=limit
        )

    def iter_pending(
        self,
        *,
        job: JobHandle[Any, Any] | str | None = None,
        key_prefix: str | None = None,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
    ) -> Iterator[PendingRun]:
        """Every pending run that matches, lazily, in due-time order (every page of
        ``find_pending``; see :mod:`scheduler.pending_runs`)::

            for run in app.iter_pending(job=close_order, key_prefix="order:"):
                print(run.deliver_at, run.key, run.args)

        Which topics: ``topic`` if given; else the job's; else every topic of the
        app's jobs (:meth:`topics`), merged by due time. Runs are found by job
        through their tags (the job's name), which every run carries since runs
        were tagged; a run scheduled by an older chronoq is listed without ``job=``.
        The arguments are checked and the first page is read now; the rest as
        the iteration goes.

        :param job: only this job's runs (its handle, or its registered name).
        :param key_prefix: only runs whose key starts with this (not ``cron:``).
        :param topic: only this topic (with ``job``: it must be the job's).
        :param start: only runs due at or after this (aware datetime or epoch ms).
        :param end: only runs due before this.
        :param limit: most runs to yield; ``None`` for all.
        :raises InvalidArgument: for an empty or ``cron:`` prefix, ``limit`` < 1, or a
            ``topic`` that is not ``job``'s.
        :raises InvalidSchedule: for a naive datetime.
        :raises JobNotFound: for a job name not registered here.
        :raises UnknownTopic: for a named ``topic`` the broker never had a message on
            (the app's own topics simply hold no runs then).
        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        query = self._run_query(job, key_prefix, topic, start, end, limit)
        return iter_runs(self.client_broker("app.pending"), query)

    @overload
    async def pending_async(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
    ) -> list[MessageView]: ...

    @overload
    async def pending_async(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
        *,
        job: JobHandle[Any, Any] | str,
        key_prefix: str | None = None,
    ) -> list[PendingRun]: ...

    @overload
    async def pending_async(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
        *,
        job: None = None,
        key_prefix: str,
    ) -> list[PendingRun]: ...

    async def pending_async(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
        *,
        job: JobHandle[Any, Any] | str | None = None,
        key_prefix: str | None = None,
    ) -> list[MessageView] | list[PendingRun]:
        """The awaitable :meth:`pending`: the same list without ``job``/``key_prefix``;
        with them, a **list** of every matching run (up to ``limit``), read page by
        page. To go through many runs without holding them all, use
        ``async for run in app.iter_pending_async(...)``."""
        if job is None and key_prefix is None:
            limit = DEFAULT_PENDING_LIMIT if limit is None else limit
            start_ms, end_ms, limit = _pending_args(start, end, limit)
            return await (await self.async_broker()).pending(topic, start_ms, end_ms, limit)
        runs = self.iter_pending_async(
            job=job, key_prefix=key_prefix, topic=topic, start=start, end=end, limit=limit
        )
        return [run async for run in runs]

    def iter_pending_async(
        self,
        *,
        job: JobHandle[Any, Any] | str | None = None,
        key_prefix: str | None = None,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int | None = None,
    ) -> AsyncIterator[PendingRun]:
        """:meth:`iter_pending` for ``async for``: the arguments are checked now (the
        same errors), the broker is read from the first ``__anext__`` on."""
        query = self._run_query(job, key_prefix, topic, start, end, limit)
        return self._aiter_runs(query)

    async def _aiter_runs(self, query: RunQuery) -> AsyncIterator[PendingRun]:
        broker = await self.async_broker()
        async for run in aiter_runs(broker, query):
            yield run

    def _run_query(
        self,
        job: JobHandle[Any, Any] | str | None,
        key_prefix: str | None,
        topic: str | None,
        start: TimeBound,
        end: TimeBound,
        limit: int | None,
    ) -> RunQuery:
        """The checked :class:`RunQuery` of ``iter_pending``'s arguments."""
        if limit is not None:
            check_pending_limit(limit)
        if key_prefix is not None:
            check_app_prefix(key_prefix)
        start_ms, end_ms = _time_ms("start", start), _time_ms("end", end)
        if topic is not None:
            check_topic(topic)
        tag = None
        topics: tuple[str, ...]
        if job is not None:
            handle = self.handle(job) if isinstance(job, str) else job
            if topic is not None and topic != handle.topic:
                raise InvalidArgument(
                    f"topic={topic!r} is not job {handle.name!r}'s topic ({handle.topic!r}); "
                    "leave topic= out to search the job's runs"
                )
            topics, strict, tag = (handle.topic,), False, handle.name
        elif topic is not None:
            topics, strict = (topic,), True
        else:
            topics, strict = tuple(sorted(self.topics())), False
        return RunQuery(topics, strict, key_prefix, tag, start_ms, end_ms, limit)


__all__ = ["DEFAULT_PENDING_LIMIT", "PendingCalls", "TimeBound", "check_app_prefix"]
