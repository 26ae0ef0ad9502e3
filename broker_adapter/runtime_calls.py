"""The runtime calls of the sync adapter base: schedules edited while they run, rate
limits and slots.

:class:`RuntimeCalls` is the half of :class:`~broker_adapter.adapter.AdapterBase`
that owns ``reschedule``, ``abort_prefix``, ``find_pending``, ``acquire_rate``,
``acquire_slot`` and ``release_slot`` (as
:class:`~broker_adapter.dead_letter_calls.DeadLetterCalls` owns the dead-letter
calls): the arguments are checked (:mod:`~broker_adapter.checks`) and the broker
found open before any primitive runs, so every adapter raises the same typed error
for bad input and changes nothing. An adapter writes the six primitives:

==========================  ==========================================================
primitive                   called with
==========================  ==========================================================
``_reschedule(i, k, t,      one of ``id`` or (``key`` and ``topic``); a checked
due, body)``                :class:`~broker_adapter.checks.NewDue` (the adapter resolves
                            it on its clock); ``body`` bytes (size checked) or ``None``
``_abort_prefix(t, p)``     a checked topic name and a non-empty prefix
``_find_pending(t, p, tag,  checked filters (``p`` only with ``t``, the topic's name
s, e, n, cursor, body)``    checked), ``n >= 1``; the adapter decodes its cursor
``_acquire_rate(b, n, p)``  a checked bucket name, ``n >= 1``, ``p >= 1``
``_acquire_slot(s, n, h,    checked names, ``n >= 1``, ``lease >= 1``
lease)``
``_release_slot(s, h)``     checked names
==========================  ==========================================================
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from broker_adapter.checks import (
    NewDue,
    check_find_args,
    check_int,
    check_key_prefix,
    check_name,
    check_reschedule_args,
)
from broker_adapter.errors import MessageTooLarge
from broker_adapter.message import check_topic
from broker_adapter.results import PendingPage, PrefixAbortResult, RescheduleResult


def check_reschedule_call(
    msg_id: object,
    key: object,
    topic: object,
    delay_ms: object,
    deliver_at_ms: object,
    body: bytes | None,
    max_body_bytes: int | None,
) -> NewDue:
    """Every check of a ``reschedule`` call, sync or async (``AsyncAdapterBase`` makes
    them too); its due.

    :raises InvalidArgument: see :func:`~broker_adapter.checks.check_reschedule_args`.
    :raises InvalidTopic: for a bad topic name.
    :raises MessageTooLarge: for a body over ``max_body_bytes``.
    """
    due = check_reschedule_args(msg_id, key, topic, delay_ms, deliver_at_ms, body)
    if topic is not None:
        check_topic(topic)
    if body is not None and max_body_bytes is not None and len(body) > max_body_bytes:
        raise MessageTooLarge(len(body), max_body_bytes)
    return due


def check_abort_prefix_call(topic: str, key_prefix: str) -> None:
    """Every check of an ``abort_prefix`` call, sync or async.

    :raises InvalidTopic: for a bad topic name.
    :raises InvalidArgument: for an empty or non-str prefix.
    """
    check_topic(topic)
    check_key_prefix(key_prefix)


def check_find_call(
    topic: str | None,
    key_prefix: str | None,
    tag: str | None,
    start_ms: int | None,
    end_ms: int | None,
    limit: int,
    cursor: str | None,
) -> None:
    """Every check of a ``find_pending`` call, sync or async (system topics may be
    searched).

    :raises InvalidArgument: see :func:`~broker_adapter.checks.check_find_args`.
    :raises InvalidTopic: for a bad topic name.
    """
    check_find_args(topic, key_prefix, tag, start_ms, end_ms, limit, cursor)
    if topic is not None:
        check_topic(topic, allow_system=True)


class RuntimeCalls(abc.ABC):
    """The runtime calls of :class:`~broker_adapter.adapter.AdapterBase` (a base of it)."""

    if TYPE_CHECKING:
        max_body_bytes: int | None

        def check_open(self) -> None: ...

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
        """See :meth:`BrokerAdapter.reschedule <broker_adapter.base.BrokerAdapter.reschedule>`."""
        due = check_reschedule_call(
            msg_id, key, topic, delay_ms, deliver_at_ms, body, self.max_body_bytes
        )
        self.check_open()
        return self._reschedule(msg_id, key, topic, due, body)

    def abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix <broker_adapter.base.BrokerAdapter.abort_prefix>`."""
        check_abort_prefix_call(topic, key_prefix)
        self.check_open()
        return self._abort_prefix(topic, key_prefix)

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
        """See :meth:`BrokerAdapter.find_pending <broker_adapter.base.BrokerAdapter.find_pending>`."""
        check_find_call(topic, key_prefix, tag, start_ms, end_ms, limit, cursor)
        self.check_open()
        return self._find_pending(
            topic, key_prefix, tag, start_ms, end_ms, limit, cursor, bool(with_body)
        )

    def acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """See :meth:`BrokerAdapter.acquire_rate <broker_adapter.base.BrokerAdapter.acquire_rate>`."""
        check_name("bucket", bucket)
        check_int("limit", limit)
        check_int("period_ms", period_ms)
        self.check_open()
        return self._acquire_rate(bucket, limit, period_ms)

    def acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """See :meth:`BrokerAdapter.acquire_slot <broker_adapter.base.BrokerAdapter.acquire_slot>`."""
        check_name("name", name)
        check_name("holder", holder)
        check_int("limit", limit)
        check_int("lease_ms", lease_ms)
        self.check_open()
        return self._acquire_slot(name, limit, holder, lease_ms)

    def release_slot(self, name: str, holder: str) -> bool:
        """See :meth:`BrokerAdapter.release_slot <broker_adapter.base.BrokerAdapter.release_slot>`."""
        check_name("name", name)
        check_name("holder", holder)
        self.check_open()
        return self._release_slot(name, holder)

    # -- primitives ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """Move the pending message by ``msg_id`` or by ``key`` on ``topic`` to ``due``."""

    @abc.abstractmethod
    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """Abort the pending messages of ``topic`` under ``key_prefix``, in bounded chunks."""

    @abc.abstractmethod
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
        """One page of pending messages in due order, with bounded work."""

    @abc.abstractmethod
    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """Take a permit of ``bucket`` (0) or say how long to wait (ms)."""

    @abc.abstractmethod
    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """Take (or renew) ``holder``'s slot of ``name``."""

    @abc.abstractmethod
    def _release_slot(self, name: str, holder: str) -> bool:
        """Give back ``holder``'s slot of ``name``."""


__all__ = ["RuntimeCalls"]
