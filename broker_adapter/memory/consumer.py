"""MemoryConsumer: a member of a memory broker's consumer group, and its long poll.

Everything runs under the store's lock; a waiting ``pull`` sleeps on the store's
``changed`` condition, bounded by the next due time so that with the system
clock a message fires (and is handed out) at its millisecond.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker_adapter.adapter import ConsumerLimits
from broker_adapter.base import Consumer
from broker_adapter.checks import (
    check_invisible_ms,
    check_nack_delay,
    check_pull_args,
    check_release_delay,
)
from broker_adapter.errors import BrokerClosed
from broker_adapter.memory.groups import MemoryGroup
from broker_adapter.memory.store import MemoryStore
from broker_adapter.results import ReceivedMessage

#: Longest a waiting pull sleeps before it reads the clock again.
CLOCK_SLICE_S = 0.2


class MemoryConsumer(Consumer):
    """A member of consumer group ``group.name`` on ``topics`` (and the group's retries).

    :param store: the broker's state.
    :param group: the group's state.
    :param topics: the topics it subscribed to.
    :param limits: its invisible time, attempts and flow-control limits.
    :param check_open: raises ``BrokerClosed`` once the broker handle is closed.
    """

    def __init__(
        self,
        store: MemoryStore,
        group: MemoryGroup,
        topics: tuple[str, ...],
        limits: ConsumerLimits,
        check_open: Callable[[], None],
    ) -> None:
        self._store = store
        self._group = group
        self._limits = limits
        self._check_open = check_open
        self._reads = [*topics, group.retry_topic]
        self._turn = 0
        self.group = group.name
        self.topics = topics
        self.closed = False

    def _check(self) -> None:
        if self.closed:
            raise BrokerClosed(f"this consumer of group {self.group!r} is closed; open a new one")
        self._check_open()

    # -- pulling ---------------------------------------------------------------------------

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`."""
        check_pull_args(max_messages, wait_ms)
        self._check()
        store = self._store
        deadline = time.monotonic() + wait_ms / 1000
        with store.lock:
            while True:
                now = store.tick()
                got = self._take(max_messages, now)
                remaining = deadline - time.monotonic()
                if got or remaining <= 0:
                    return got
                due = store.next_due()
                if due is not None:  # wake for it: the system clock moves on its own
                    remaining = min(remaining, max(due - now, 1) / 1000)
                # In slices, reading the clock after each: a step of the system clock
                # (which tells nobody) is seen within one.
                store.changed.wait(min(remaining, CLOCK_SLICE_S))
                self._check()

    def _take(self, max_messages: int, now: int) -> list[ReceivedMessage]:
        """Put up to ``max_messages`` ready copies in flight, round robin over the
        topics, within flow control (lock held)."""
        group, limits, store = self._group, self._limits, self._store
        group.invisible_ms, group.max_attempts = limits.invisible_ms, limits.max_attempts
        held = group.held_by_count(self)
        room = min(max_messages, limits.max_inflight - held[0])
        byte_room = limits.max_inflight_bytes - held[1]
        out: list[ReceivedMessage] = []
        if room <= 0 or byte_room <= 0:
            return out
        self._turn = (self._turn + 1) % len(self._reads)
        for i in range(len(self._reads)):
            topic = self._reads[(self._turn + i) % len(self._reads)]
            for flight, received in group.take(
                topic,
                store.log(topic),
                room - len(out),
                byte_room,
                self,
                now + limits.invisible_ms,
                store.new_receipt,
                may_cross=not out,
            ):
                byte_room -= flight.copy.message.size
                out.append(received)
            if len(out) >= room or byte_room <= 0:
                break
        return out

    # -- settling ----------------------------------------------------------------------------

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        self._check()
        with self._store.lock:
            self._store.tick()
            flight = self._group.settle(message.receipt)
            if flight is None:
                return False
            self._group.acked(flight)
            self._store.changed.notify_all()  # a pull may wait for room
        return True

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        check_nack_delay(delay_ms)
        return self._settle(message, delay_ms, reason, dead=False)

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        return self._settle(message, None, reason, dead=True)

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`."""
        check_release_delay(delay_ms)
        return self._settle(message, delay_ms, None, dead=False, counts=False)

    def _settle(
        self,
        message: ReceivedMessage,
        delay_ms: int | None,
        reason: str | None,
        *,
        dead: bool,
        counts: bool = True,
    ) -> bool:
        self._check()
        store = self._store
        with store.lock:
            store.tick()
            flight = self._group.settle(message.receipt)
            if flight is None:
                return False
            store.redeliver(self._group, flight, delay_ms, reason, dead=dead, counts=counts)
            store.tick()  # a retry due now fires now
            store.changed.notify_all()
        return True

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        self._check()
        with self._store.lock:
            now = self._store.tick()
            return self._group.extend(message.receipt, now + invisible_ms)

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        store = self._store
        with store.lock:
            for flight in self._group.held_by(self):
                store.redeliver(self._group, flight, 0, "consumer closed", dead=False)
            store.tick()
            store.changed.notify_all()

    def __repr__(self) -> str:
        return f"<MemoryConsumer group={self.group!r} topics={self.topics!r}>"


__all__ = ["MemoryConsumer"]
