"""The ``Consumer`` contract: one member of a consumer group.

The other half of the broker contract (:mod:`broker_adapter.base`, which
re-exports it): ``BrokerAdapter.consumer`` returns one. Its docstrings are the
contract, as the broker's are: every adapter keeps each sentence, and
``tests/conformance/`` has a test for each.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from broker_adapter.results import ReceivedMessage


class Consumer(abc.ABC):
    """One member of a consumer group, pulling from its topics.

    Each group gets every message of its topics; members of one group share
    them. A consumer is a context manager; leaving it closes it.
    """

    group: str
    topics: tuple[str, ...]

    @abc.abstractmethod
    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """Take up to ``max_messages`` fired messages of this group's topics.

        Long poll: returns as soon as at least one message is there, or an empty
        list after ``wait_ms`` milliseconds (``0`` does not wait). Messages of one
        topic come in the order they fired. A pulled message is invisible to the
        group until acked, nacked or until its invisible time (``invisible_ms``,
        default 60 s) passes; then it is delivered again with ``attempts`` + 1.
        Flow control: while this consumer holds ``max_inflight`` messages (default
        1,000) or ``max_inflight_bytes`` of bodies (default 100 MiB), pull returns
        no more (waiting up to ``wait_ms`` for room) until some are acked or nacked;
        below both limits a pull hands out at least one message, even one that
        crosses the byte limit. ``wait_ms`` is real time; invisible time, delays
        and backoff follow the broker's clock.

        :raises InvalidArgument: for ``max_messages`` < 1 or ``wait_ms`` < 0.
        :raises BrokerClosed: when the consumer or its broker is closed.
        """

    @abc.abstractmethod
    def ack(self, message: ReceivedMessage) -> bool:
        """Mark the message consumed by this group.

        Returns ``True`` if it was in flight in this group (any member may ack),
        ``False`` if not (already acked, nacked, or its invisible time passed and
        it went back for redelivery); a second ack changes nothing.

        :raises BrokerClosed: when the consumer or its broker is closed.
        """

    def ack_batch(self, messages: Sequence[ReceivedMessage]) -> list[bool]:
        """Ack several messages at once (one round trip to a network broker): for
        each, in order, what :meth:`ack` would return.

        :raises BrokerClosed: when the consumer or its broker is closed.
        """
        return [self.ack(m) for m in messages]

    @abc.abstractmethod
    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """Give the message back for a later retry of this group only.

        It is delivered again after ``delay_ms``, or by default after RocketMQ's
        backoff for its attempt (10 s, 30 s, 1 m, ... 2 h). When it has been
        delivered ``max_attempts`` times (default 16) it goes instead to the
        dead-letter topic ``%DLQ%<group>`` and its state becomes ``DEAD``;
        ``reason`` is recorded and shown by ``query``. Returns ``False`` (doing
        nothing) when the message was not in flight here.

        :raises InvalidArgument: for a negative ``delay_ms``.
        :raises BrokerClosed: when the consumer or its broker is closed.
        """

    @abc.abstractmethod
    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """Move the message to ``%DLQ%<group>`` now, recording ``reason``.

        For failures no retry can fix (e.g. an unknown job). The dead letter keeps
        its ``msg_id``. Returns ``False`` (doing nothing) when the message was not
        in flight here.

        :raises BrokerClosed: when the consumer or its broker is closed.
        """

    @abc.abstractmethod
    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """Keep an in-flight message invisible for ``invisible_ms`` more, counted from
        now (RocketMQ's changeInvisibleDuration), for work that outlives its
        invisible time. The message's receipt stays valid. Returns ``False``
        (doing nothing) when the message was not in flight here.

        :raises InvalidArgument: unless ``invisible_ms`` is an int >= 1.
        :raises BrokerClosed: when the consumer or its broker is closed.
        """

    @abc.abstractmethod
    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """Give the message back to this group without counting the delivery as an
        attempt: for work that never started (the consumer is stopping, or what
        it hands the message to is unreachable). It is delivered again after
        ``delay_ms`` with the same ``attempts``, and a release never sends it to
        the dead-letter topic. Returns ``False`` (doing nothing) when the message
        was not in flight here.

        :raises InvalidArgument: unless ``delay_ms`` is an int >= 0.
        :raises BrokerClosed: when the consumer or its broker is closed.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Stop consuming. Messages still in flight here are released for
        redelivery at once (``attempts`` + 1). Closing twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["Consumer"]
