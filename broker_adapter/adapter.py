"""AdapterBase: the semantics every adapter shares; each adapter writes its primitives.

Like kombu's virtual transport, the base owns the public methods of
:class:`~broker_adapter.base.BrokerAdapter`: it checks arguments, refuses calls
on a closed broker, turns ``send`` into a one-message batch and
``send_async``/``send_oneway`` into batches on an
:class:`~broker_adapter.async_sender.AsyncSender`, and writes the ``consumer``
signature with its defaults once. An adapter implements only what differs:

==========================  ==========================================================
primitive                   called with
==========================  ==========================================================
``_send_checked(msgs)``     a non-empty sequence of checked messages (type, size)
``_abort(id, key, topic)``  exactly one of ``id`` or (``key`` and ``topic``)
``_query(msg_id)``          any string
``_pending(t, s, e, n)``    ``n >= 1``
``_consumer(g, ts, lim)``   a checked group, its topics without repeats, limits
``_stats()``                nothing
``_close()``                nothing; async sends are flushed, the broker marked closed
==========================  ==========================================================

the runtime primitives (``_reschedule``, ``_abort_prefix``, ``_find_pending``,
``_acquire_rate``, ``_acquire_slot``, ``_release_slot``) of its base
:class:`~broker_adapter.runtime_calls.RuntimeCalls`, and the dead-letter primitives
(``_dead_letters``, ``_requeue_dead``, ``_purge_dead``, ``_count_pending``) of its
base :class:`~broker_adapter.dead_letter_calls.DeadLetterCalls`, and may override
``_send_one`` (a single send with its own wire form), ``_submit`` (an async send
path of its own), ``_flush`` (more to wait for), ``_before_close`` (work to
finish while still open) and ``max_body_bytes`` (``None``: the adapter checks
sizes itself, e.g. against a server's limit learnt on connecting). Each primitive
runs only while the broker is open.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker_adapter.async_sender import AsyncSender
from broker_adapter.base import (
    DEFAULT_INVISIBLE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INFLIGHT_BYTES,
    BrokerAdapter,
    Consumer,
    SendCallback,
)
from broker_adapter.checks import (
    check_abort_args,
    check_int,
    check_pending_limit,
)
from broker_adapter.dead_letter_calls import DeadLetterCalls
from broker_adapter.errors import BrokerClosed, InvalidArgument, InvalidMessage, MessageTooLarge
from broker_adapter.message import Message, check_topic
from broker_adapter.results import (
    AbortResult,
    BrokerStats,
    MessageView,
    SendResult,
)
from broker_adapter.runtime_calls import RuntimeCalls

log = logging.getLogger("chronoq.broker_adapter.AdapterBase")
log.addHandler(logging.NullHandler())


@dataclass(frozen=True, slots=True)
class ConsumerLimits:
    """The limits of one consumer, checked (see :meth:`BrokerAdapter.consumer`)."""

    invisible_ms: int = DEFAULT_INVISIBLE_MS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES


def check_messages(messages: Sequence[Message], body_limit: int | None) -> None:
    """Raise unless every item is a :class:`Message` no larger than ``body_limit``.

    :raises InvalidArgument: for an item that is not a ``Message``.
    :raises MessageTooLarge: for a body (plus properties) over ``body_limit``.
    """
    for m in messages:
        if not isinstance(m, Message):
            raise InvalidArgument(f"send takes Message objects, got {type(m).__name__}")
        if body_limit is not None:
            size = len(m.body) + (len(m.properties_bytes()) if m.properties else 0)
            if size > body_limit:
                raise MessageTooLarge(size, body_limit)


def check_consumer_args(group: str, topics: Iterable[str], **limits: object) -> tuple[str, ...]:
    """Check a ``consumer(...)`` call: the group name, at least one topic (``%DLQ%...``
    allowed), every limit an int >= 1; returns the topics without repeats, in order.

    :raises InvalidTopic: for a bad group or topic name.
    :raises InvalidArgument: for no topic or a bad limit.
    """
    check_topic(group)
    names = tuple(dict.fromkeys(check_topic(t, allow_system=True) for t in topics))
    if not names:
        raise InvalidArgument("a consumer needs at least one topic")
    for label, limit in limits.items():
        check_int(label, limit)
    return names


class AdapterBase(RuntimeCalls, DeadLetterCalls, BrokerAdapter):
    """The shared half of every adapter; see the module docstring for the primitives."""

    _closed = False
    _sender: AsyncSender | None = None
    _sender_lock = threading.Lock()  # guards the lazy creation of any adapter's sender

    #: Largest body (plus properties) checked before a send; ``None``: the adapter checks.
    max_body_bytes: int | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def check_open(self) -> None:
        """Raise unless the broker is open (for the adapter's helpers too).

        :raises BrokerClosed: when the broker is closed.
        """
        if self._closed:
            raise BrokerClosed(f"this {type(self).__name__} is closed; open a new one")

    # -- sending ---------------------------------------------------------------------------

    def send(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send`."""
        if self._closed:
            self.check_open()
        # check_messages((message,), ...) inlined: a single send is the hot path of
        # schedule() (issue 16); same checks, same errors.
        limit = self.max_body_bytes
        if type(message) is not Message or (
            limit is not None and (message.properties or len(message.body) > limit)
        ):
            check_messages((message,), limit)
        return self._send_one(message)

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`."""
        self.check_open()
        check_messages(messages, self.max_body_bytes)
        if not messages:
            return []
        return self._send_checked(messages)

    def send_async(self, message: Message, callback: SendCallback) -> None:
        """See :meth:`BrokerAdapter.send_async`."""
        self.check_open()
        check_messages((message,), self.max_body_bytes)
        self._submit(message, callback)

    def send_oneway(self, message: Message) -> None:
        """See :meth:`BrokerAdapter.send_oneway`."""
        self.check_open()
        try:
            check_messages((message,), self.max_body_bytes)
        except (InvalidArgument, InvalidMessage) as e:  # one-way: log, never raise
            log.warning("one-way send refused: %s", e)
            return
        self._submit(message, None)

    def flush(self, timeout_s: float = 10.0) -> None:
        """See :meth:`BrokerAdapter.flush`."""
        self.check_open()
        self._flush(timeout_s)

    def _send_one(self, message: Message) -> SendResult:
        """Send one checked message (default: a batch of one)."""
        return self._send_checked((message,))[0]

    def _submit(self, message: Message, callback: SendCallback | None) -> None:
        """Start an async (``callback``) or one-way (``None``) send of a checked message
        (default: batched on a background :class:`AsyncSender`)."""
        sender = self._sender
        if sender is None:
            with self._sender_lock:
                sender = self._sender
                if sender is None:
                    sender = self._sender = AsyncSender(self.send_batch)
        sender.submit(message, callback)

    def _flush(self, timeout_s: float) -> None:
        """Wait for the async and one-way sends made so far (default: the sender's)."""
        if self._sender is not None:
            self._sender.flush(timeout_s)

    def _before_close(self) -> None:
        """Finish what must complete while the broker is still open (default: the async
        sends still queued)."""
        if self._sender is not None:
            self._sender.close()

    # -- the rest of the contract -----------------------------------------------------------

    def abort(
        self, msg_id: str | None = None, *, key: str | None = None, topic: str | None = None
    ) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        check_abort_args(msg_id, key, topic)
        self.check_open()
        return self._abort(msg_id, key, topic)

    def query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        self.check_open()
        return self._query(msg_id)

    def pending(
        self,
        topic: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        check_pending_limit(limit)
        self.check_open()
        return self._pending(topic, start_ms, end_ms, limit)

    def consumer(
        self,
        group: str,
        topics: Iterable[str],
        *,
        invisible_ms: int = DEFAULT_INVISIBLE_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    ) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`."""
        names = check_consumer_args(
            group,
            topics,
            invisible_ms=invisible_ms,
            max_attempts=max_attempts,
            max_inflight=max_inflight,
            max_inflight_bytes=max_inflight_bytes,
        )
        self.check_open()
        limits = ConsumerLimits(invisible_ms, max_attempts, max_inflight, max_inflight_bytes)
        return self._consumer(group, names, limits)

    def stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        self.check_open()
        return self._stats()

    def close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        if self._closed:
            return
        try:
            self._before_close()
        finally:
            self._closed = True
        self._close()

    # -- primitives ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store checked messages, all or nothing; results in input order."""

    @abc.abstractmethod
    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """Abort by ``msg_id``, or by ``key`` on ``topic``."""

    @abc.abstractmethod
    def _query(self, msg_id: str) -> MessageView | None:
        """The view of ``msg_id`` or ``None``."""

    @abc.abstractmethod
    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """Up to ``limit`` pending messages in due order."""

    @abc.abstractmethod
    def _consumer(self, group: str, topics: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """A new member of ``group`` on ``topics``."""

    @abc.abstractmethod
    def _stats(self) -> BrokerStats:
        """The counters."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release the adapter's resources (async sends are already complete)."""


__all__ = ["AdapterBase", "ConsumerLimits", "check_consumer_args", "check_messages"]
