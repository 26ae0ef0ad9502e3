"""What an app asks its broker directly, sync and awaitable: ``pending``,
``cancel``, ``cancel_all`` and ``get``, each with an ``_async`` twin.

:class:`AppCalls` is the half of :class:`~scheduler.scheduler.Scheduler` that
talks to the broker about runs rather than jobs (``pending`` comes from its base,
:class:`~scheduler.app_pending.PendingCalls`); the Scheduler provides the two
brokers it needs (``client_broker`` for the sync forms, with the loop rule of
:mod:`scheduler.loop_rule`; ``async_broker`` for the twins, see
:mod:`scheduler.async_client`), its topics and its job handles. A twin checks
its arguments exactly as the sync form does, before anything is opened or sent.

Runs of one order, across jobs
------------------------------

Keys such as ``order:42:remind`` and ``order:42:close`` group an order's timers,
whatever their jobs::

    app.pending(key_prefix="order:42:")       # its pending runs, lazily, by due time
    app.cancel_all(key_prefix="order:42:")    # CancelAllResult(aborted=2, ...)

Without ``topic=`` both cover every topic of the app's jobs (``app.topics()``).
"""

from __future__ import annotations

import abc

from broker_adapter.checks import check_abort_args
from broker_adapter.errors import UnknownTopic
from broker_adapter.message import check_topic
from broker_adapter.results import AbortStatus, MessageView, PrefixAbortResult
from scheduler.app_pending import PendingCalls, TimeBound, check_app_prefix
from scheduler.receipts import CancelAllResult
from scheduler.settings import Settings


class AppCalls(PendingCalls):
    """``pending``, ``cancel``, ``cancel_all``, ``get`` and their ``_async`` twins;
    see the module."""

    @property
    @abc.abstractmethod
    def settings(self) -> Settings:
        """The app's settings (``settings.topic`` is the default topic of ``cancel``)."""

    # -- cancel ---------------------------------------------------------------------

    def cancel(
        self, *, msg_id: str | None = None, key: str | None = None, topic: str | None = None
    ) -> AbortStatus:
        """Cancel a scheduled run by ``msg_id``, or by ``key`` on ``topic`` (by default
        ``settings.topic``); for a job's own topic, ``job.cancel(key=...)`` knows it.

        :returns: ``ABORTED``, ``ALREADY_DELIVERED`` or ``NOT_FOUND``, as
            :meth:`JobHandle.cancel <scheduler.handles.JobHandle.cancel>` explains.
        :raises InvalidArgument: unless exactly one of ``msg_id`` and ``key`` is
            given (``topic`` only with ``key``).
        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        topic = self._abort_topic(msg_id, key, topic)
        broker = self.client_broker("app.cancel")
        return broker.abort(msg_id, key=key, topic=topic).status

    async def cancel_async(
        self, *, msg_id: str | None = None, key: str | None = None, topic: str | None = None
    ) -> AbortStatus:
        """The awaitable :meth:`cancel` (same abort, same three answers)."""
        topic = self._abort_topic(msg_id, key, topic)
        broker = await self.async_broker()
        return (await broker.abort(msg_id, key=key, topic=topic)).status

    def _abort_topic(self, msg_id: str | None, key: str | None, topic: str | None) -> str | None:
        if key is not None and topic is None:
            topic = self.settings.topic
        check_abort_args(msg_id, key, topic)
        return topic

    def cancel_all(self, *, key_prefix: str, topic: str | None = None) -> CancelAllResult:
        """Cancel every pending run whose key starts with ``key_prefix``, in one call:
        every timer of an order, whatever its job (``key_prefix="order:42:"``).

        Covers ``topic``, or by default every topic of the app's jobs
        (:meth:`topics`; one the broker never had a message on has nothing to
        cancel). Each topic is done in bounded, atomic chunks (see
        :meth:`BrokerAdapter.abort_prefix <broker_adapter.base.BrokerAdapter.abort_prefix>`);
        the call as a whole is not atomic: a run scheduled under the prefix while it
        runs may or may not be cancelled.

        :returns: a :class:`~scheduler.receipts.CancelAllResult`: how many runs were
            aborted (they will never run) and which keys' runs had already fired
            (their jobs are queued, running or done: the order-timeout race of
            :mod:`scheduler.handles`).
        :raises InvalidArgument: for an empty or non-str prefix, or one that would
            match cron occurrences (``cron:``).
        :raises InvalidTopic: for a bad ``topic`` name.
        :raises UnknownTopic: for a named ``topic`` the broker never had a message on.
        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        topics = self._prefix_topics(key_prefix, topic)
        broker = self.client_broker("app.cancel_all")
        results: list[PrefixAbortResult] = []
        for name in topics:
            try:
                results.append(broker.abort_prefix(name, key_prefix))
            except UnknownTopic:
                if topic is not None:
                    raise
        return CancelAllResult.of(results, topics)

    async def cancel_all_async(
        self, *, key_prefix: str, topic: str | None = None
    ) -> CancelAllResult:
        """The awaitable :meth:`cancel_all` (same checks, same aborts, same answer)."""
        topics = self._prefix_topics(key_prefix, topic)
        broker = await self.async_broker()
        results: list[PrefixAbortResult] = []
        for name in topics:
            try:
                results.append(await broker.abort_prefix(name, key_prefix))
            except UnknownTopic:
                if topic is not None:
                    raise
        return CancelAllResult.of(results, topics)

    def _prefix_topics(self, key_prefix: object, topic: str | None) -> tuple[str, ...]:
        """The topics ``cancel_all`` covers, after checking its arguments."""
        check_app_prefix(key_prefix)
        if topic is not None:
            return (check_topic(topic),)
        return tuple(sorted(self.topics()))

    def get(self, msg_id: str) -> MessageView | None:
        """The broker's current view of run ``msg_id`` (of any job), or ``None``.

        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        return self.client_broker("app.get").query(msg_id)

    async def get_async(self, msg_id: str) -> MessageView | None:
        """The awaitable :meth:`get`."""
        return await (await self.async_broker()).query(msg_id)


__all__ = ["AppCalls", "TimeBound"]
