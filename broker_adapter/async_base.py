"""AsyncBrokerAdapter: the client half of the broker contract, awaitable.

What an app does from a coroutine (send, abort, query, pending, stats, and the
runtime calls reschedule, abort_prefix and find_pending, and the dead-letter calls
dead_letters, requeue_dead, purge_dead and count_pending) without
blocking its event loop. The semantics are those of
:class:`~broker_adapter.base.BrokerAdapter`, sentence for sentence (its
docstrings are the contract); only the calls are awaited. Consumers stay on the
sync side: a dispatcher pulls in its own thread.

:class:`AsyncAdapterBase` owns what every async adapter shares, as
:class:`~broker_adapter.adapter.AdapterBase` does for the sync ones: argument
checks before any I/O, refusing calls once closed, ``send`` as a batch of one.
An adapter writes only its primitives (``_send_checked``, ``_abort``, ``_query``,
``_pending``, ``_stats``, ``_close``, ``_reschedule``, ``_abort_prefix``,
``_find_pending``, ``_dead_letters``, ``_requeue_dead``, ``_purge_dead``,
``_count_pending``: the arguments of the sync primitives of the same names), each a
coroutine that runs only while open.
:class:`~broker_adapter.threaded_async.ThreadedAsyncBroker` is the async face of any sync adapter (the embedded
broker: a RocksDB call is short and holds the GIL, so it is handed to a thread);
network brokers speak their protocol natively on the event loop
(:func:`broker_adapter.urls.open_async_broker` picks).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Self

from broker_adapter.adapter import check_messages
from broker_adapter.checks import (
    NewDue,
    check_abort_args,
    check_pending_limit,
)
from broker_adapter.dead_letter_calls import AsyncDeadLetterCalls
from broker_adapter.errors import BrokerClosed
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    BrokerStats,
    DeadLetterPage,
    MessageView,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    SendResult,
)
from broker_adapter.runtime_calls import (
    check_abort_prefix_call,
    check_find_call,
    check_reschedule_call,
)


class AsyncBrokerAdapter(abc.ABC):
    """The awaitable client calls of a broker; see :class:`BrokerAdapter` for each."""

    @abc.abstractmethod
    async def send(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send`."""

    @abc.abstractmethod
    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`."""

    @abc.abstractmethod
    async def abort(
        self, msg_id: str | None = None, *, key: str | None = None, topic: str | None = None
    ) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""

    @abc.abstractmethod
    async def query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""

    @abc.abstractmethod
    async def pending(
        self,
        topic: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""

    @abc.abstractmethod
    async def stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""

    @abc.abstractmethod
    async def reschedule(
        self,
        msg_id: str | None = None,
        *,
        key: str | None = None,
        topic: str | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        body: bytes | None = None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule`."""

    @abc.abstractmethod
    async def abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix`."""

    @abc.abstractmethod
    async def find_pending(
        self,
        topic: str | None = None,
        *,
        key_prefix: str | None = None,
        tag: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
        cursor: str | None = None,
        with_body: bool = False,
    ) -> PendingPage:
        """See :meth:`BrokerAdapter.find_pending`."""

    @abc.abstractmethod
    async def dead_letters(
        self,
        group: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        with_body: bool = False,
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters`."""

    @abc.abstractmethod
    async def requeue_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""

    @abc.abstractmethod
    async def purge_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""

    @abc.abstractmethod
    async def count_pending(
        self, edges_ms: Sequence[int], *, topic: str | None = None
    ) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the adapter's connections; later calls raise ``BrokerClosed``.
        Closing twice is harmless."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncAdapterBase(AsyncDeadLetterCalls, AsyncBrokerAdapter):
    """The shared half of every async adapter; see the module docstring."""

    _closed = False

    #: Largest body (plus properties) checked before a send; ``None``: the adapter checks.
    max_body_bytes: int | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def check_open(self) -> None:
        """Raise unless the adapter is open.

        :raises BrokerClosed: when it is closed.
        """
        if self._closed:
            raise BrokerClosed(f"this {type(self).__name__} is closed; open a new one")

    async def send(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send`."""
        self.check_open()
        check_messages((message,), self.max_body_bytes)
        return (await self._send_checked((message,)))[0]

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`."""
        self.check_open()
        check_messages(messages, self.max_body_bytes)
        if not messages:
            return []
        return await self._send_checked(messages)

    async def abort(
        self, msg_id: str | None = None, *, key: str | None = None, topic: str | None = None
    ) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        check_abort_args(msg_id, key, topic)
        self.check_open()
        return await self._abort(msg_id, key, topic)

    async def query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        self.check_open()
        return await self._query(msg_id)

    async def pending(
        self,
        topic: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        check_pending_limit(limit)
        self.check_open()
        return await self._pending(topic, start_ms, end_ms, limit)

    async def stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        self.check_open()
        return await self._stats()

    async def reschedule(
        self,
        msg_id: str | None = None,
        *,
        key: str | None = None,
        topic: str | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        body: bytes | None = None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule`."""
        due = check_reschedule_call(
            msg_id, key, topic, delay_ms, deliver_at_ms, body, self.max_body_bytes
        )
        self.check_open()
        return await self._reschedule(msg_id, key, topic, due, body)

    async def abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix`."""
        check_abort_prefix_call(topic, key_prefix)
        self.check_open()
        return await self._abort_prefix(topic, key_prefix)

    async def find_pending(
        self,
        topic: str | None = None,
        *,
        key_prefix: str | None = None,
        tag: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
        cursor: str | None = None,
        with_body: bool = False,
    ) -> PendingPage:
        """See :meth:`BrokerAdapter.find_pending`."""
        check_find_call(topic, key_prefix, tag, start_ms, end_ms, limit, cursor)
        self.check_open()
        return await self._find_pending(
            topic, key_prefix, tag, start_ms, end_ms, limit, cursor, bool(with_body)
        )

    async def close(self) -> None:
        """See :meth:`AsyncBrokerAdapter.close`."""
        if self._closed:
            return
        self._closed = True
        await self._close()

    @abc.abstractmethod
    async def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store checked messages (non-empty), all or nothing; results in input order."""

    @abc.abstractmethod
    async def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """Abort by ``msg_id``, or by ``key`` on ``topic``."""

    @abc.abstractmethod
    async def _query(self, msg_id: str) -> MessageView | None:
        """The view of ``msg_id`` or ``None``."""

    @abc.abstractmethod
    async def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """Up to ``limit`` pending messages in due order."""

    @abc.abstractmethod
    async def _stats(self) -> BrokerStats:
        """The counters."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Release the adapter's resources."""

    @abc.abstractmethod
    async def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`RuntimeCalls._reschedule <broker_adapter.runtime_calls.RuntimeCalls._reschedule>`."""

    @abc.abstractmethod
    async def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`RuntimeCalls._abort_prefix <broker_adapter.runtime_calls.RuntimeCalls._abort_prefix>`."""

    @abc.abstractmethod
    async def _find_pending(
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
        """See :meth:`RuntimeCalls._find_pending <broker_adapter.runtime_calls.RuntimeCalls._find_pending>`."""


__all__ = ["AsyncAdapterBase", "AsyncBrokerAdapter"]
