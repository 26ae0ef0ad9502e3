"""The dead-letter calls and pending counts of the adapter bases, sync and async.

:class:`DeadLetterCalls` is the half of :class:`~broker_adapter.adapter.AdapterBase`
that owns ``dead_letters``, ``requeue_dead``, ``purge_dead`` and ``count_pending``
(:class:`AsyncDeadLetterCalls` that of
:class:`~broker_adapter.async_base.AsyncAdapterBase`): the arguments are checked
(:mod:`~broker_adapter.checks`) and the broker found open before any primitive
runs, so every adapter raises the same typed error for bad input and changes
nothing. An adapter writes the four primitives::

    _dead_letters(group, cursor, limit, with_body)   a checked group name, limit >= 1;
                                                     the adapter decodes its cursor
    _requeue_dead(group, ids, limit)                 ids: a tuple of str without repeats
    _purge_dead(group, ids, limit)                   (at most limit), or None: the oldest
    _count_pending(edges, topic)                     2 to MAX_COUNT_EDGES increasing
                                                     ints >= 0 (a tuple); a checked
                                                     topic name or None
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker_adapter.checks import check_count_edges, check_dead_ids, check_dead_page_args
from broker_adapter.message import check_topic
from broker_adapter.results import MAX_COUNT_EDGES, DeadLetterPage, PendingCounts


class DeadLetterCalls(abc.ABC):
    """The dead-letter calls of :class:`~broker_adapter.adapter.AdapterBase` (a base of it)."""

    if TYPE_CHECKING:

        def check_open(self) -> None: ...

    def dead_letters(
        self,
        group: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        with_body: bool = False,
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters <broker_adapter.base.BrokerAdapter.dead_letters>`."""
        check_topic(group)
        check_dead_page_args(limit, cursor)
        self.check_open()
        return self._dead_letters(group, cursor, limit, bool(with_body))

    def requeue_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """See :meth:`BrokerAdapter.requeue_dead <broker_adapter.base.BrokerAdapter.requeue_dead>`."""
        check_topic(group)
        ids = check_dead_ids(msg_ids, limit)
        self.check_open()
        return self._requeue_dead(group, ids, limit)

    def purge_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """See :meth:`BrokerAdapter.purge_dead <broker_adapter.base.BrokerAdapter.purge_dead>`."""
        check_topic(group)
        ids = check_dead_ids(msg_ids, limit)
        self.check_open()
        return self._purge_dead(group, ids, limit)

    def count_pending(self, edges_ms: Sequence[int], *, topic: str | None = None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending <broker_adapter.base.BrokerAdapter.count_pending>`."""
        edges = check_count_edges(edges_ms, MAX_COUNT_EDGES)
        if topic is not None:
            check_topic(topic)
        self.check_open()
        return self._count_pending(edges, topic)

    @abc.abstractmethod
    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """One page of ``group``'s dead letters, oldest death first, with bounded work."""

    @abc.abstractmethod
    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """Requeue the named (or up to ``limit`` oldest) dead letters of ``group``."""

    @abc.abstractmethod
    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """Purge the named (or up to ``limit`` oldest) dead letters of ``group``."""

    @abc.abstractmethod
    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """Pending messages per ``[edges[i], edges[i + 1])``, with bounded work."""


class AsyncDeadLetterCalls(abc.ABC):
    """The dead-letter calls of :class:`~broker_adapter.async_base.AsyncAdapterBase`,
    awaitable (the same checks as :class:`DeadLetterCalls`)."""

    if TYPE_CHECKING:

        def check_open(self) -> None: ...

    async def dead_letters(
        self,
        group: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        with_body: bool = False,
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters <broker_adapter.base.BrokerAdapter.dead_letters>`."""
        check_topic(group)
        check_dead_page_args(limit, cursor)
        self.check_open()
        return await self._dead_letters(group, cursor, limit, bool(with_body))

    async def requeue_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """See :meth:`BrokerAdapter.requeue_dead <broker_adapter.base.BrokerAdapter.requeue_dead>`."""
        check_topic(group)
        ids = check_dead_ids(msg_ids, limit)
        self.check_open()
        return await self._requeue_dead(group, ids, limit)

    async def purge_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """See :meth:`BrokerAdapter.purge_dead <broker_adapter.base.BrokerAdapter.purge_dead>`."""
        check_topic(group)
        ids = check_dead_ids(msg_ids, limit)
        self.check_open()
        return await self._purge_dead(group, ids, limit)

    async def count_pending(
        self, edges_ms: Sequence[int], *, topic: str | None = None
    ) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending <broker_adapter.base.BrokerAdapter.count_pending>`."""
        edges = check_count_edges(edges_ms, MAX_COUNT_EDGES)
        if topic is not None:
            check_topic(topic)
        self.check_open()
        return await self._count_pending(edges, topic)

    @abc.abstractmethod
    async def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`DeadLetterCalls._dead_letters`."""

    @abc.abstractmethod
    async def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`DeadLetterCalls._requeue_dead`."""

    @abc.abstractmethod
    async def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`DeadLetterCalls._purge_dead`."""

    @abc.abstractmethod
    async def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`DeadLetterCalls._count_pending`."""


__all__ = ["AsyncDeadLetterCalls", "DeadLetterCalls"]
