"""The runtime calls of :class:`~broker_adapter.shared.broker.SharedBroker`: each goes to
the current owner (this process's embedded broker, or the owner's server for a
client) and is repeated once on the new owner after a handover; why each may be
repeated is in :mod:`broker_adapter.shared.broker`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from broker_adapter.base import BrokerAdapter
from broker_adapter.checks import NewDue
from broker_adapter.results import (
    DeadLetterPage,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
)

_T = TypeVar("_T")


class SharedRuntimeCalls:
    """The runtime primitives of ``SharedBroker`` (a mixin of it: it uses the broker's
    ``_call``, which follows handovers)."""

    if TYPE_CHECKING:

        def _call(self, op: str, fn: Callable[[BrokerAdapter], _T], retry: bool) -> _T: ...

    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule` (repeated once after a handover)."""

        def move(b: BrokerAdapter) -> RescheduleResult:
            return b.reschedule(
                msg_id,
                key=key,
                topic=topic,
                delay_ms=due.delay_ms,
                deliver_at_ms=due.deliver_at_ms,
                body=body,
            )

        return self._call("reschedule", move, retry=True)

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix` (repeated once after a handover)."""
        return self._call("abort_prefix", lambda b: b.abort_prefix(topic, key_prefix), True)

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
        """See :meth:`BrokerAdapter.find_pending` (a read: repeated once after a handover)."""

        def find(b: BrokerAdapter) -> PendingPage:
            return b.find_pending(
                topic,
                key_prefix=key_prefix,
                tag=tag,
                start_ms=start_ms,
                end_ms=end_ms,
                limit=limit,
                cursor=cursor,
                with_body=with_body,
            )

        return self._call("find_pending", find, retry=True)

    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """See :meth:`BrokerAdapter.acquire_rate` (the owner's buckets)."""
        return self._call("acquire_rate", lambda b: b.acquire_rate(bucket, limit, period_ms), True)

    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """See :meth:`BrokerAdapter.acquire_slot` (the owner's semaphores)."""
        return self._call(
            "acquire_slot", lambda b: b.acquire_slot(name, limit, holder, lease_ms), True
        )

    def _release_slot(self, name: str, holder: str) -> bool:
        """See :meth:`BrokerAdapter.release_slot`."""
        return self._call("release_slot", lambda b: b.release_slot(name, holder), True)

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` (a read: repeated once after a handover)."""
        return self._call(
            "dead_letters",
            lambda b: b.dead_letters(group, cursor=cursor, limit=limit, with_body=with_body),
            True,
        )

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead` (repeated once after a handover: what the
        lost call requeued is no dead letter any more, so it is not requeued twice)."""
        ids = None if msg_ids is None else list(msg_ids)
        return self._call("requeue_dead", lambda b: b.requeue_dead(group, ids, limit=limit), True)

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead` (repeated once after a handover, as a requeue)."""
        ids = None if msg_ids is None else list(msg_ids)
        return self._call("purge_dead", lambda b: b.purge_dead(group, ids, limit=limit), True)

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` (a read: repeated once after a handover)."""
        return self._call(
            "count_pending", lambda b: b.count_pending(list(edges), topic=topic), True
        )


__all__ = ["SharedRuntimeCalls"]
