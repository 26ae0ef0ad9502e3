"""The :class:`ThreadedAsyncBroker`: the async face of any sync adapter.

The embedded broker's calls are short and hold the GIL, so its async face runs
them on a few threads and coalesces the sends of a loop turn into one batch;
network brokers speak their protocol natively on the event loop instead
(:func:`broker_adapter.urls.open_async_broker` picks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from broker_adapter.async_base import AsyncAdapterBase
from broker_adapter.base import BrokerAdapter
from broker_adapter.checks import NewDue
from broker_adapter.errors import BrokerClosed, InvalidArgument, InvalidMessage
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

#: A caller's send waiting for its batch: its messages and the future of its answer.
_Send = tuple[Sequence[Message], Any]


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


__all__ = ["ThreadedAsyncBroker"]
