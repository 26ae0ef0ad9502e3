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
:class:`ThreadedAsyncBroker` is the async face of any sync adapter (the embedded
broker: a RocksDB call is short and holds the GIL, so it is handed to a thread);
network brokers speak their protocol natively on the event loop
(:func:`broker_adapter.urls.open_async_broker` picks).
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Self

from broker_adapter.adapter import check_messages
from broker_adapter.base import BrokerAdapter
from broker_adapter.checks import (
    NewDue,
    check_abort_args,
    check_find_args,
    check_key_prefix,
    check_pending_limit,
    check_reschedule_args,
)
from broker_adapter.dead_letter_calls import AsyncDeadLetterCalls
from broker_adapter.errors import BrokerClosed, InvalidArgument, InvalidMessage, MessageTooLarge
from broker_adapter.message import Message, check_topic
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

#: A caller's send waiting for its batch: its messages and the future of its answer.
_Send = tuple[Sequence[Message], Any]


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
        due = check_reschedule_args(msg_id, key, topic, delay_ms, deliver_at_ms, body)
        if topic is not None:
            check_topic(topic)
        if body is not None and self.max_body_bytes is not None and len(body) > self.max_body_bytes:
            raise MessageTooLarge(len(body), self.max_body_bytes)
        self.check_open()
        return await self._reschedule(msg_id, key, topic, due, body)

    async def abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix`."""
        check_topic(topic)
        check_key_prefix(key_prefix)
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
        check_find_args(topic, key_prefix, tag, start_ms, end_ms, limit, cursor)
        if topic is not None:
            check_topic(topic, allow_system=True)
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
        """See :meth:`AdapterBase._reschedule <broker_adapter.adapter.AdapterBase._reschedule>`."""

    @abc.abstractmethod
    async def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`AdapterBase._abort_prefix <broker_adapter.adapter.AdapterBase._abort_prefix>`."""

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
        """See :meth:`AdapterBase._find_pending <broker_adapter.adapter.AdapterBase._find_pending>`."""


class ThreadedAsyncBroker(AsyncAdapterBase):
    """The async face of a sync adapter: each call runs on a small thread pool.

    Sends are coalesced: the sends made while the loop is busy go to the broker as
    one ``send_batch`` on one thread, one batch at a time (the sends made while it
    runs wait for it and go next, together). A RocksDB write holds the GIL, so a
    thousand coroutines sending at once cost a few writes and thread hops instead
    of a thousand. The answers are those of separate sends: a keyed duplicate
    within a batch is ``DUPLICATE`` as it would be later, and when the joint batch
    is refused as invalid (nothing stored), each caller's own batch is sent again
    alone, so an error reaches only the caller it belongs to. Any other failure
    (the broker closed, a lost connection) reaches every caller of the batch, as it
    would have reached each of them. A caller cancelled before its batch leaves
    sends nothing.

    The event loop stays responsive under load: a joint batch holds at most
    :attr:`max_batch` messages (a caller's own batch is never split, so a larger
    one goes alone), which bounds how long the thread holds the GIL; and the
    answers are handed out :attr:`answers_per_turn` per loop turn, so the callers
    resumed in one turn (each building its next message) stay well under a
    millisecond of the loop's time.

    :param broker: the sync adapter (e.g. an app's embedded broker).
    :param own: close ``broker`` when this adapter closes (``False``: it belongs to
        someone else, e.g. the app that opened it).
    :param threads: most calls running at once (RocksDB calls are short: a few do).
    """

    #: Most messages in one joint ``send_batch``: the thread holds the GIL ~0.3 ms for
    #: 64 embedded sends (128: ~0.6 ms, and the loop's lag P99 above 1 ms).
    max_batch = 64
    #: Most callers resumed per loop turn when a batch's answers come back.
    answers_per_turn = 16

    def __init__(self, broker: BrokerAdapter, *, own: bool = False, threads: int = 4) -> None:
        self._broker = broker
        self._own = own
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="chronoq-async-broker")
        self._queued: deque[_Send] = deque()  # sends waiting for the next batch
        self._busy = False  # a batch is on a thread, or its dispatch is scheduled
        self._answers: deque[tuple[Any, list[SendResult] | BaseException]] = deque()
        self._dealing = False  # _deal is scheduled

    @property
    def broker(self) -> BrokerAdapter:
        """The sync adapter the calls run on."""
        return self._broker

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import asyncio  # here, not at the top: ``import broker_adapter`` stays ~30 ms lighter

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    async def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        import asyncio  # see _call

        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self._queued.append((messages, answer))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._send_next, loop)
        result: list[SendResult] = await answer
        return result

    def _send_next(self, loop: Any) -> None:
        """Hand the queued sends (up to :attr:`max_batch` messages) to a thread, as one
        batch; when none is left, the next send starts a batch itself."""
        queued = self._queued
        batch: list[_Send] = []
        size = 0
        while queued:
            messages, answer = queued[0]
            if batch and size + len(messages) > self.max_batch:
                break
            queued.popleft()
            if answer.done():  # the caller was cancelled before its batch left
                continue
            batch.append((messages, answer))
            size += len(messages)
        if not batch:
            self._busy = False
            return
        try:
            done = loop.run_in_executor(self._pool, self._send_on_thread, batch)
        except RuntimeError:  # the pool was shut down: closed while these waited
            self._busy = False
            closed = BrokerClosed(f"this {type(self).__name__} is closed; open a new one")
            for _, answer in (*batch, *queued):
                if not answer.done():
                    answer.set_exception(closed)
            queued.clear()
            return
        done.add_done_callback(partial(self._batch_done, loop, batch))

    def _batch_done(self, loop: Any, batch: list[_Send], done: Any) -> None:
        """On the loop: start the next batch, then queue each caller's outcome."""
        error = done.exception()
        answers = None if error is not None else done.result()
        self._send_next(loop)
        for i, (_, answer) in enumerate(batch):
            self._answers.append((answer, error if answers is None else answers[i]))
        if not self._dealing:
            self._dealing = True
            self._deal(loop)

    def _deal(self, loop: Any) -> None:
        """Complete up to :attr:`answers_per_turn` callers' futures; the rest next turn."""
        answers = self._answers
        for _ in range(min(self.answers_per_turn, len(answers))):
            answer, outcome = answers.popleft()
            if answer.done():  # the caller was cancelled meanwhile
                continue
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
            else:
                answer.set_result(outcome)
        if answers:
            loop.call_soon(self._deal, loop)
        else:
            self._dealing = False

    def _send_on_thread(self, turn: list[_Send]) -> list[list[SendResult] | BaseException]:
        """Each caller's results (or error): one batch, or one batch each when the
        joint one is refused as invalid (nothing was stored then)."""
        if len(turn) > 1:
            joint = [m for messages, _ in turn for m in messages]
            try:
                results = self._broker.send_batch(joint)
            except (InvalidMessage, InvalidArgument):
                pass  # someone's message is bad: let each batch answer for itself
            else:
                out: list[list[SendResult] | BaseException] = []
                start = 0
                for messages, _ in turn:
                    out.append(results[start : start + len(messages)])
                    start += len(messages)
                return out
        answers: list[list[SendResult] | BaseException] = []
        for messages, _ in turn:
            try:
                answers.append(self._broker.send_batch(messages))
            except Exception as e:  # noqa: BLE001 - handed to the caller it belongs to
                answers.append(e)
        return answers

    async def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        result: AbortResult = await self._call(self._broker.abort, msg_id, key=key, topic=topic)
        return result

    async def _query(self, msg_id: str) -> MessageView | None:
        result: MessageView | None = await self._call(self._broker.query, msg_id)
        return result

    async def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        result: list[MessageView] = await self._call(
            self._broker.pending, topic, start_ms, end_ms, limit
        )
        return result

    async def _stats(self) -> BrokerStats:
        result: BrokerStats = await self._call(self._broker.stats)
        return result

    async def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        result: RescheduleResult = await self._call(
            self._broker.reschedule,
            msg_id,
            key=key,
            topic=topic,
            delay_ms=due.delay_ms,
            deliver_at_ms=due.deliver_at_ms,
            body=body,
        )
        return result

    async def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        result: PrefixAbortResult = await self._call(self._broker.abort_prefix, topic, key_prefix)
        return result

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
        result: PendingPage = await self._call(
            self._broker.find_pending,
            topic,
            key_prefix=key_prefix,
            tag=tag,
            start_ms=start_ms,
            end_ms=end_ms,
            limit=limit,
            cursor=cursor,
            with_body=with_body,
        )
        return result

    async def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        result: DeadLetterPage = await self._call(
            self._broker.dead_letters, group, cursor=cursor, limit=limit, with_body=with_body
        )
        return result

    async def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        ids = None if msg_ids is None else list(msg_ids)
        result: int = await self._call(self._broker.requeue_dead, group, ids, limit=limit)
        return result

    async def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        ids = None if msg_ids is None else list(msg_ids)
        result: int = await self._call(self._broker.purge_dead, group, ids, limit=limit)
        return result

    async def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        result: PendingCounts = await self._call(
            self._broker.count_pending, list(edges), topic=topic
        )
        return result

    async def _close(self) -> None:
        self._pool.shutdown(wait=False)
        if self._own:
            await self._call_off_pool(self._broker.close)

    @staticmethod
    async def _call_off_pool(fn: Any) -> None:
        import asyncio  # see _call

        await asyncio.get_running_loop().run_in_executor(None, fn)


__all__ = ["AsyncAdapterBase", "AsyncBrokerAdapter", "ThreadedAsyncBroker"]
