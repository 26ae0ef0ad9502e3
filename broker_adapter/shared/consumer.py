"""SharedConsumer: a consumer-group member of a shared directory's client that follows
the directory from owner to owner.

It holds a member on the current owner (a remote one, or this process's own
embedded one once it took over). When its broker attaches again (a handover,
see :mod:`broker_adapter.shared.broker`) it joins the group again there and
keeps pulling: a pull cut by the owner's death is simply repeated (what the dead
owner had handed out is delivered again by the next one). Each received message's
receipt starts with the 4-byte generation it was pulled in, so settling a message
of an earlier owner does not reach the new one: it answers ``False``, as for any
message no longer in flight here, and the message is delivered again.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker_adapter.base import Consumer
from broker_adapter.checks import (
    check_invisible_ms,
    check_nack_delay,
    check_pull_args,
    check_release_delay,
)
from broker_adapter.errors import BrokerClosed, ConnectionFailed
from broker_adapter.results import ReceivedMessage

if TYPE_CHECKING:
    from broker_adapter.adapter import ConsumerLimits
    from broker_adapter.shared.broker import SharedBroker

log = logging.getLogger("chronoq.broker_adapter.SharedBroker")
log.addHandler(logging.NullHandler())

_GEN = struct.Struct(">I")


class SharedConsumer(Consumer):
    """A member of ``group`` on ``topics`` of a :class:`SharedBroker`'s current owner.

    :param broker: the shared broker (a client when this is made).
    :param limits: the member's limits, checked by the adapter base.
    """

    def __init__(
        self, broker: SharedBroker, group: str, topics: tuple[str, ...], limits: ConsumerLimits
    ) -> None:
        self._broker = broker
        self.group = group
        self.topics = topics
        self._limits = limits
        self._lock = threading.Lock()
        self.closed = False
        self._generation, self._inner = broker.member(group, topics, limits)
        self._tag = _GEN.pack(self._generation & 0xFFFFFFFF)

    def _check(self) -> None:
        if self.closed:
            raise BrokerClosed(f"consumer of group {self.group!r} is closed")
        self._broker.check_open()

    def _current(self) -> tuple[int, Consumer]:
        """The member on the broker's current owner (joining there after a handover)."""
        if self._broker.generation != self._generation:
            with self._lock:
                if self._broker.generation != self._generation:
                    old = self._inner
                    try:
                        old.close()
                    except (ConnectionFailed, BrokerClosed):
                        pass  # gone with its owner
                    self._generation, self._inner = self._broker.member(
                        self.group, self.topics, self._limits
                    )
                    self._tag = _GEN.pack(self._generation & 0xFFFFFFFF)
                    log.info("group %s: joined again after a handover", self.group)
        return self._generation, self._inner

    def _lost(self, generation: int) -> None:
        """The member of ``generation`` failed: make sure the broker attached again."""
        self._check()
        self._broker.reattach(generation)

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`; a pull cut by a handover is
        repeated on the new owner within ``wait_ms``."""
        check_pull_args(max_messages, wait_ms)
        self._check()
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            generation, inner = self._current()
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                got = inner.pull(max_messages, remaining)
            except (ConnectionFailed, BrokerClosed):
                self._lost(generation)
                if time.monotonic() >= deadline:
                    return []
                continue
            tag = self._tag if generation == self._generation else _GEN.pack(generation)
            return [m._replace(receipt=tag + m.receipt) for m in got]

    def _settle(
        self, message: ReceivedMessage, fn: Callable[[Consumer, ReceivedMessage], bool]
    ) -> bool:
        """``fn(member, message)`` with the receipt it had there, if ``message`` was pulled
        from the current owner; ``False`` for one of an earlier owner."""
        self._check()
        receipt = message.receipt
        generation, inner = self._current()
        if not isinstance(receipt, bytes) or receipt[:4] != _GEN.pack(generation & 0xFFFFFFFF):
            return False  # pulled from an earlier owner: it is delivered again
        try:
            return fn(inner, message._replace(receipt=receipt[4:]))
        except (ConnectionFailed, BrokerClosed):
            self._lost(generation)
            return False  # the owner went away with it in flight: delivered again

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        return self._settle(message, lambda c, m: c.ack(m))

    def ack_batch(self, messages: Sequence[ReceivedMessage]) -> list[bool]:
        """See :meth:`broker_adapter.base.Consumer.ack_batch`: one call for the messages
        of the current owner."""
        self._check()
        generation, inner = self._current()
        tag = _GEN.pack(generation & 0xFFFFFFFF)
        ours = [i for i, m in enumerate(messages) if m.receipt[:4] == tag]
        out = [False] * len(messages)
        if not ours:
            return out
        try:
            acked = inner.ack_batch(
                [messages[i]._replace(receipt=messages[i].receipt[4:]) for i in ours]
            )
        except (ConnectionFailed, BrokerClosed):
            self._lost(generation)
            return out
        for i, ok in zip(ours, acked, strict=True):
            out[i] = ok
        return out

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        check_nack_delay(delay_ms)
        return self._settle(message, lambda c, m: c.nack(m, delay_ms, reason))

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        return self._settle(message, lambda c, m: c.dead_letter(m, reason))

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        return self._settle(message, lambda c, m: c.extend(m, invisible_ms))

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`."""
        check_release_delay(delay_ms)
        return self._settle(message, lambda c, m: c.release(m, delay_ms))

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        try:
            self._inner.close()
        except (ConnectionFailed, BrokerClosed):
            pass  # gone with its owner: its messages come back on their own

    def __repr__(self) -> str:
        return f"<SharedConsumer group={self.group!r} topics={self.topics!r}>"


__all__ = ["SharedConsumer"]
