"""MemoryBroker: the ``memory://`` adapter, in process and not durable.

For tests and demos: the whole :class:`~broker_adapter.base.BrokerAdapter`
contract (timed messages, keyed duplicates, aborts, consumer groups, retries,
dead letters, retention) on plain Python data, with time from an injected
:class:`~broker_adapter.clock.Clock`. With a
:class:`~broker_adapter.clock.ManualClock` nothing happens between two advances
and everything due happens during one (no thread, no sleeping); see
:mod:`~broker_adapter.memory.store`. Nothing survives the process: a send is
"accepted", never durable. URLs and sharing: :mod:`~broker_adapter.memory.shared`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker_adapter.adapter import AdapterBase, ConsumerLimits
from broker_adapter.base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_RETENTION_MS,
    Consumer,
)
from broker_adapter.checks import NewDue, check_positive_settings
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import InvalidArgument
from broker_adapter.memory import dead_letters, runtime
from broker_adapter.memory.consumer import MemoryConsumer
from broker_adapter.memory.finder import find_pending
from broker_adapter.memory.shared import SHARED, StoreSettings
from broker_adapter.memory.store import MemoryStore
from broker_adapter.memory.views import broker_stats, message_view, pending_views
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
from broker_adapter.urls import split_url

_INT_PARAMS = ("max_body_bytes", "max_delay_ms", "retention_ms")


class MemoryBroker(AdapterBase):
    """A broker in this process's memory (``memory://`` or ``memory://NAME``).

    :param name: ``None`` for a private broker; a name to share one broker among
        every handle opened with that name in this process while one is open
        (see :mod:`~broker_adapter.memory.shared`).
    :param clock: time source (a ``ManualClock`` in tests); a named broker keeps
        the clock it was created with, and a later open may only pass that one.
    :param max_body_bytes: largest body (plus properties) accepted (default 4 MiB).
    :param max_delay_ms: the furthest ahead a message may be due (default 10 years).
    :param retention_ms: how long fired and aborted messages, and their keys, stay
        known (default 72 h of broker time).
    :raises InvalidArgument: for a setting that is not an int >= 1, or one that
        differs from an open broker of the same name.
    """

    local = True  # answered on this machine (see BrokerAdapter.local)

    def __init__(
        self,
        name: str | None = None,
        *,
        clock: Clock | None = None,
        max_body_bytes: int | None = None,
        max_delay_ms: int | None = None,
        retention_ms: int | None = None,
    ) -> None:
        given = {
            k: v
            for k, v in (
                ("max_body_bytes", max_body_bytes),
                ("max_delay_ms", max_delay_ms),
                ("retention_ms", retention_ms),
            )
            if v is not None
        }
        check_positive_settings(**given)
        settings = StoreSettings(
            max_body_bytes or DEFAULT_MAX_BODY_BYTES,
            max_delay_ms or DEFAULT_MAX_DELAY_MS,
            retention_ms or DEFAULT_RETENTION_MS,
        )
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgument(f"a memory broker's name is a non-empty str, got {name!r}")
        self.name = name
        if name is None:
            self._store = MemoryStore(
                clock or SystemClock(),
                max_delay_ms=settings.max_delay_ms,
                retention_ms=settings.retention_ms,
            )
        else:
            self._store, settings = SHARED.acquire(name, clock, settings, set(given), SystemClock())
        self.max_body_bytes = settings.max_body_bytes
        self.max_delay_ms = settings.max_delay_ms
        self.retention_ms = settings.retention_ms
        self._consumers: list[MemoryConsumer] = []

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> MemoryBroker:
        """Open ``memory://[NAME][?max_body_bytes=...&max_delay_ms=...&retention_ms=...]``.

        :raises InvalidArgument: for an unknown parameter or one that is not an int.
        """
        _scheme, name, params = split_url(url)
        opts: dict[str, Any] = {}
        for key, value in params.items():
            if key not in _INT_PARAMS:
                raise InvalidArgument(
                    f"unknown parameter {key!r} in {url!r}; memory:// takes {', '.join(_INT_PARAMS)}"
                )
            try:
                opts[key] = int(value)
            except ValueError as e:
                raise InvalidArgument(f"{key} in {url!r} must be an int") from e
        opts.update(kwargs)
        return cls(name or None, **opts)

    @property
    def clock(self) -> Clock:
        """The clock this broker reads (a shared broker's: the one it was created with)."""
        return self._store.clock

    def body(self, msg_id: str) -> bytes | None:
        """The body of a message this broker still knows, ``None`` otherwise: for test
        tools (the contract's views carry no bodies), e.g. to tell which job a pending
        message will run.

        :raises BrokerClosed: when the broker is closed.
        """
        self.check_open()
        with self._store.lock:
            msg = self._store.messages.get(msg_id)
            return None if msg is None else msg.body

    # -- primitives -----------------------------------------------------------------------

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`."""
        with self._store.lock:
            self.check_open()  # closed while waiting for the lock
            return self._store.send(messages)

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        with self._store.lock:
            return self._store.abort(msg_id, key, topic)

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        with self._store.lock:
            self._store.tick()
            return message_view(self._store, msg_id)

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        with self._store.lock:
            self._store.tick()
            return pending_views(self._store, topic, start_ms, end_ms, limit)

    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule`."""
        return runtime.reschedule(self._store, msg_id, key, topic, due, body, self.max_body_bytes)

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix`."""
        return runtime.abort_prefix(self._store, topic, key_prefix)

    def _find_pending(
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
        """See :meth:`BrokerAdapter.find_pending` and :mod:`~broker_adapter.memory.finder`."""
        return find_pending(
            self._store, topic, key_prefix, tag, start_ms, end_ms, limit, cursor, with_body
        )

    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """See :meth:`BrokerAdapter.acquire_rate` (shared by this named broker's handles)."""
        return self._store.rates.acquire(bucket, limit, period_ms)

    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """See :meth:`BrokerAdapter.acquire_slot`."""
        return self._store.slots.acquire(name, limit, holder, lease_ms)

    def _release_slot(self, name: str, holder: str) -> bool:
        """See :meth:`BrokerAdapter.release_slot`."""
        return self._store.slots.release(name, holder)

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` and :mod:`~broker_adapter.memory.dead_letters`."""
        return dead_letters.dead_letters(self._store, group, cursor, limit, with_body)

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""
        return dead_letters.requeue_dead(self._store, group, msg_ids, limit)

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return dead_letters.purge_dead(self._store, group, msg_ids, limit)

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` (always exact; see
        :mod:`~broker_adapter.memory.dead_letters`)."""
        return dead_letters.count_pending(self._store, edges, topic)

    def _consumer(self, group: str, topics: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`."""
        store = self._store
        with store.lock:
            g = store.group(group)
            for topic in topics:
                g.attach(topic, store.log(topic))
            g.invisible_ms, g.max_attempts = limits.invisible_ms, limits.max_attempts
            consumer = MemoryConsumer(store, g, topics, limits, self.check_open)
            self._consumers.append(consumer)
        return consumer

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        with self._store.lock:
            self._store.tick()
            return broker_stats(self._store)

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`: this handle's consumers release what they
        hold; the data goes with the last handle of a named broker."""
        for consumer in self._consumers:
            consumer.close()
        self._consumers.clear()
        if self.name is None or SHARED.release(self.name, self._store):
            self._store.close()
        else:
            with self._store.lock:
                self._store.changed.notify_all()  # this handle's waiting pulls end

    def __repr__(self) -> str:
        where = f"memory://{self.name}" if self.name else "memory://"
        return f"<MemoryBroker {where}{' closed' if self.closed else ''}>"


__all__ = ["MemoryBroker"]
