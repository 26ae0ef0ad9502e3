"""The ``BrokerAdapter`` contract. Its docstrings are the contract: every adapter
(embedded RocksDB, remote server, Redis) keeps each sentence, and
``tests/conformance/`` has a test for each. Two parts live in their own modules:
the ``Consumer`` (:mod:`broker_adapter.consumer_contract`, re-exported here) and the
dead letters and pending counts (:mod:`broker_adapter.dead_letter_contract`,
inherited).

Delivery is at least once: a message may reach a consumer group more than once
(after an invisible-time expiry or a broker crash) and its ``msg_id`` stays the
same, so the id is the idempotency key downstream.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import ClassVar, Self

from broker_adapter.consumer_contract import Consumer
from broker_adapter.dead_letter_contract import DeadLetterContract
from broker_adapter.message import DELAY_LEVELS, Message
from broker_adapter.results import (
    AbortResult,
    BrokerStats,
    MessageView,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    SendResult,
)

#: Called by ``send_async`` with exactly one of a result or an exception.
SendCallback = Callable[[SendResult | None, BaseException | None], None]

# The defaults every adapter shares (each defined here only).
#: Largest body (plus properties) a broker accepts by default: 4 MiB.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: The furthest ahead a message may be due by default: 10 years of 366 days.
DEFAULT_MAX_DELAY_MS = 10 * 366 * 24 * 3600 * 1000
#: How long fired messages (and their keys) stay readable by default: 72 h.
DEFAULT_RETENTION_MS = 72 * 3600 * 1000
DEFAULT_INVISIBLE_MS = 60_000
DEFAULT_MAX_ATTEMPTS = 16
DEFAULT_MAX_INFLIGHT = 1_000
DEFAULT_MAX_INFLIGHT_BYTES = 100 * 1024 * 1024
#: RocketMQ's retry schedule: attempt ``n`` (1-based) waits delay level ``2 + n``,
#: i.e. 10 s, 30 s, 1 m, 2 m, ... 2 h, then stays at 2 h.
RETRY_LEVEL_OFFSET = 2
#: How far in the past a reschedule's ``deliver_at_ms`` may be (clock skew between a
#: client and its broker); such a time means now, an older one is refused.
RESCHEDULE_PAST_TOLERANCE_MS = 60_000


def retry_backoff_ms(attempt: int) -> int:
    """Backoff before redelivery after failed delivery number ``attempt`` (1-based)."""
    level = min(attempt + RETRY_LEVEL_OFFSET, len(DELAY_LEVELS))
    return DELAY_LEVELS[max(level, 1) - 1]


def retry_topic(group: str) -> str:
    """The topic where a group's retries wait: ``%RETRY%<group>``."""
    return f"%RETRY%{group}"


def dead_letter_topic(group: str) -> str:
    """The dead-letter topic of a group: ``%DLQ%<group>`` (consumers may subscribe to it)."""
    return f"%DLQ%{group}"


class BrokerAdapter(DeadLetterContract):
    """A broker of timed messages: send, abort, query, consume.

    A broker is a context manager; leaving it closes it. All methods are safe
    to call from several threads.
    """

    #: Whether its calls are answered on this machine in microseconds (the embedded
    #: broker, ``memory://``, a shared ``rocksdb://`` directory), not over a network;
    #: a sync call of such a broker may run on an event loop (see
    #: :mod:`scheduler.loop_rule`).
    local: ClassVar[bool] = False

    @abc.abstractmethod
    def send(self, message: Message) -> SendResult:
        """Store ``message`` for delivery at its time.

        Returns ``SendResult(OK, msg_id, deliver_at_ms)`` once the message is
        durable: from then on it is delivered or aborted, never lost, also if the
        process is killed. ``deliver_at_ms`` is when it is due (a time in the past
        means now). If the topic already has a *pending* message with the same
        ``key``, nothing is stored and the result is ``DUPLICATE`` with that
        message's id and time: sends with a key are idempotent. The same holds
        when the last message with that key already fired (and was not aborted)
        and was asked for the very same due millisecond as this one (as given,
        before a past time is moved to now): re-sending one occurrence (e.g. a
        cron run ``cron:<name>:<fire_ms>``) never fires it twice.

        :raises MessageTooLarge: when the body is over the broker's max size
            (default 4 MiB); nothing is stored.
        :raises InvalidDelay: when the due time is past the broker's max delay
            (default 10 years); nothing is stored.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Send several messages at once, all or nothing; results in input order.

        The same rules as ``send`` apply to each message, and to keys repeated
        within the batch (the second is a ``DUPLICATE`` of the first). If any
        message is invalid, the error is raised and none is stored.

        :raises MessageTooLarge: see ``send``.
        :raises InvalidDelay: see ``send``.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def send_async(self, message: Message, callback: SendCallback) -> None:
        """Send without waiting; ``callback(result, None)`` or ``callback(None, error)``
        is called exactly once, on another thread, when the send completes.

        :raises InvalidMessage: at once, for what can be checked without a round
            trip (including ``MessageTooLarge`` against the broker's limit).
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def send_oneway(self, message: Message) -> None:
        """Send and forget: no result, no callback; errors are logged, not raised
        (except a closed broker). ``flush()`` waits until such sends are stored.

        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every ``send_async``/``send_oneway`` made before has completed."""

    @abc.abstractmethod
    def abort(
        self, msg_id: str | None = None, *, key: str | None = None, topic: str | None = None
    ) -> AbortResult:
        """Cancel a pending message, by ``msg_id`` or by ``key`` and ``topic``.

        The abort takes effect when it arrives and is durable: ``ABORTED`` means
        the message will never be delivered, whatever the race with its fire time.
        ``ALREADY_DELIVERED`` means it had fired before the abort arrived (it may
        be ready, in flight or done); by key, it names the last message sent with
        that key. ``NOT_FOUND`` means no such message (for a key: no message with
        that key on that topic). Aborting twice (by id or by key) answers
        ``ABORTED`` twice. After an abort the key is free for a new message.

        :raises InvalidArgument: unless exactly one of ``msg_id`` or
            (``key`` and ``topic``) is given.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def query(self, msg_id: str) -> MessageView | None:
        """The message's current view in any state, or ``None`` for an unknown id
        (a malformed id is unknown too).

        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def pending(
        self,
        topic: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """Up to ``limit`` messages not yet due, in due-time order, optionally only
        of ``topic`` and due in ``[start_ms, end_ms)``.

        :raises InvalidArgument: for ``limit`` < 1.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def reschedule(
        self,
        msg_id: str | None = None,
        *,
        key: str | None = None,
        topic: str | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        body: bytes | None = None,
    ) -> RescheduleResult:
        """Move a pending message, by ``msg_id`` or by ``key`` and ``topic``, to a new
        due time (``delay_ms`` from now, or ``deliver_at_ms``), optionally with a new
        ``body``, in one atomic step.

        ``RESCHEDULED``: it was pending and is now due at the new time (``delay_ms=0``
        runs it now); it keeps its id, key, tags, properties and attempts, and its key
        keeps the due time its first send asked for, so re-sending that occurrence is
        still a ``DUPLICATE``. ``ALREADY_DELIVERED``: it had fired before the call
        arrived; nothing changed. ``NOT_FOUND``: no pending message with that id
        (or key on that topic): never sent, or aborted. Whatever the race with the
        old or the new fire time, the message is delivered exactly once as far as
        the broker is concerned: never twice, never lost. By key it names the last
        message sent with that key, as ``abort`` does. A message waiting for a retry
        has fired: ``ALREADY_DELIVERED``.

        :raises InvalidArgument: unless exactly one of ``msg_id`` or (``key`` and
            ``topic``) is given, and exactly one of ``delay_ms`` or ``deliver_at_ms``;
            or for a ``body`` that is not bytes.
        :raises InvalidDelay: for a negative ``delay_ms``, a ``deliver_at_ms`` more
            than :data:`RESCHEDULE_PAST_TOLERANCE_MS` in the past (a time less far
            in the past means now), or a time past the broker's max delay.
        :raises MessageTooLarge: for a body (plus the message's properties) over the
            broker's max size.
        :raises BrokerClosed: when the broker is closed.

        Nothing changes when an error is raised.
        """

    @abc.abstractmethod
    def abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """Abort every pending message of ``topic`` whose key starts with ``key_prefix``.

        Answers how many were aborted (each as ``abort`` would: never delivered) and
        the keys under the prefix whose last message had already fired. The work
        is done in bounded chunks, so a prefix matching millions of messages does
        not stall the timing wheel; each chunk is atomic, the whole call is not: a
        message sent under the prefix while the call runs may or may not be
        aborted, and one that falls due meanwhile may fire (it is then listed as
        already delivered, or not at all if its key was passed before).

        :raises InvalidArgument: for an empty or non-str ``key_prefix``.
        :raises InvalidTopic: for a bad topic name.
        :raises UnknownTopic: for a topic the broker never had a message on.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def find_pending(
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
        """A page of pending (not yet fired, not aborted) messages in due-time order,
        filtered by any of: ``topic``, a ``key_prefix`` (needs ``topic``), the exact
        ``tag`` (the scheduler tags each run with its job's name) and a due time in
        ``[start_ms, end_ms)``.

        Pass the page's ``cursor`` back (with the same filters) for the next page;
        ``None`` means there is no more. A page holds at most ``limit`` messages and
        may hold fewer, even none, before the last: each call does bounded work
        however many messages are pending. Messages sent or moved between pages may
        or may not show up; none shows up twice unless it was rescheduled later
        between two pages. ``with_body`` adds each message's body to its view.

        :raises InvalidArgument: for ``limit`` < 1, an empty ``key_prefix`` or one
            without ``topic``, ``start_ms``/``end_ms`` that are not ints >= 0, or a
            malformed cursor.
        :raises InvalidTopic: for a bad topic name.
        :raises UnknownTopic: for a topic the broker never had a message on.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """Take one permit of the rate limit ``bucket``: at most ``limit`` permits per
        ``period_ms``, shared by every client of this broker (all processes and
        machines), with bursts of up to ``limit`` (a GCRA / leaky bucket).

        Returns ``0`` when the permit was taken, else how many ms to wait before
        asking again (nothing was taken). The state is the broker's (in memory for
        the embedded broker: a restart starts every bucket full).

        :raises InvalidArgument: for an empty ``bucket`` or non-positive ``limit``
            or ``period_ms``.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """Take one of ``limit`` slots of the semaphore ``name`` for ``holder`` (e.g. a
        run's id) for ``lease_ms``: ``True`` when taken (or ``holder`` already held
        one: its lease is renewed), ``False`` when all ``limit`` are held. A lease not
        renewed or released within ``lease_ms`` expires (its holder died), so the
        slot frees itself. Shared by every client of this broker.

        :raises InvalidArgument: for an empty ``name`` or ``holder``, or non-positive
            ``limit`` or ``lease_ms``.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def release_slot(self, name: str, holder: str) -> bool:
        """Give back ``holder``'s slot of semaphore ``name``: ``True`` when it held one
        (and its lease had not expired), else ``False`` (nothing changes).

        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
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
        """A member of consumer ``group`` on ``topics`` (and the group's retries).

        A group seen for the first time starts at the oldest fired message still
        retained on its topics, so nothing that fired before it connected is
        skipped. Two groups on one topic each get every message.

        :raises InvalidTopic: for a bad topic or group name.
        :raises InvalidArgument: for non-positive limits.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def stats(self) -> BrokerStats:
        """Counters: pending and fired per topic; ready, in flight, dead and acked per group.

        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Flush pending async sends, stop background threads and release the
        broker's resources. Closing twice is harmless; any other call afterwards
        raises ``BrokerClosed``."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = [
    "DEFAULT_INVISIBLE_MS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_DELAY_MS",
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_RETENTION_MS",
    "RESCHEDULE_PAST_TOLERANCE_MS",
    "RETRY_LEVEL_OFFSET",
    "BrokerAdapter",
    "Consumer",
    "SendCallback",
    "dead_letter_topic",
    "retry_backoff_ms",
    "retry_topic",
]
