"""What an app asks its broker directly, sync and awaitable: ``pending``,
``cancel`` and ``get``, each with an ``_async`` twin.

:class:`AppCalls` is the half of :class:`~scheduler.scheduler.Scheduler` that
talks to the broker about runs rather than jobs; the Scheduler provides the two
brokers it needs (:meth:`AppCalls.client_broker` for the sync forms, with the
loop rule of :mod:`scheduler.loop_rule`; :meth:`AppCalls.async_broker` for the
twins, see :mod:`scheduler.async_client`). A twin checks its arguments exactly
as the sync form does, before anything is opened or sent.
"""

from __future__ import annotations

import abc
from datetime import datetime

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter
from broker_adapter.checks import check_abort_args, check_pending_limit, is_int
from broker_adapter.results import AbortStatus, MessageView
from scheduler.settings import Settings
from scheduler.timing import datetime_to_ms

#: What ``start=``/``end=`` take: an aware datetime or epoch ms.
TimeBound = datetime | int | None


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


class AppCalls(abc.ABC):
    """``pending``, ``cancel``, ``get`` and their ``_async`` twins; see the module."""

    @property
    @abc.abstractmethod
    def settings(self) -> Settings:
        """The app's settings (``settings.topic`` is the default topic of ``cancel``)."""

    @abc.abstractmethod
    def client_broker(self, call: str) -> BrokerAdapter:
        """The broker for sync client call ``call``, after the loop rule.

        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """

    @abc.abstractmethod
    async def async_broker(self) -> AsyncBrokerAdapter:
        """The running event loop's async broker of this app."""

    def pending(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """Up to ``limit`` runs not yet due, in due-time order.

        :param topic: only this topic; ``None`` for every topic of the broker.
        :param start: only runs due at or after this (aware datetime or epoch ms).
        :param end: only runs due before this (aware datetime or epoch ms).
        :raises InvalidSchedule: for a naive datetime.
        :raises InvalidArgument: for ``limit`` < 1.
        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        start_ms, end_ms, limit = _pending_args(start, end, limit)
        return self.client_broker("app.pending").pending(topic, start_ms, end_ms, limit)

    async def pending_async(
        self,
        topic: str | None = None,
        start: TimeBound = None,
        end: TimeBound = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """The awaitable :meth:`pending` (same arguments, checks and answer)."""
        start_ms, end_ms, limit = _pending_args(start, end, limit)
        return await (await self.async_broker()).pending(topic, start_ms, end_ms, limit)

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

    def get(self, msg_id: str) -> MessageView | None:
        """The broker's current view of run ``msg_id`` (of any job), or ``None``.

        :raises SyncCallInEventLoop: inside a running event loop on a network broker.
        """
        return self.client_broker("app.get").query(msg_id)

    async def get_async(self, msg_id: str) -> MessageView | None:
        """The awaitable :meth:`get`."""
        return await (await self.async_broker()).query(msg_id)


__all__ = ["AppCalls", "TimeBound"]
