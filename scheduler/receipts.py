"""What the scheduler's client calls answer: the :class:`ScheduledJob` receipt of a
``schedule()`` (which can move, run or cancel its run), the
:class:`RescheduleReceipt` of a ``reschedule()``/``run_now()``, and the
:class:`CancelAllResult` of ``app.cancel_all()``.

A receipt knows its job: each :class:`~scheduler.handles.JobHandle` makes its
receipts of a subclass of :class:`ScheduledJob` (:func:`receipt_class`) whose class
attribute ``job`` is the handle. The receipt stays a 4-field named tuple (no
per-receipt cost on the hot ``schedule()`` path; unpacking and ``_asdict()`` are
unchanged); a copy or a pickle of it is a plain :class:`ScheduledJob` whose
``job`` is ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from broker_adapter.errors import InvalidArgument
from broker_adapter.results import (
    MAX_REPORTED_KEYS,
    AbortStatus,
    PrefixAbortResult,
    RescheduleStatus,
    SendStatus,
)

if TYPE_CHECKING:
    from scheduler.handles import JobHandle


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class RescheduleReceipt:
    """The answer of ``job.reschedule(...)`` and ``job.run_now(...)``.

    :param status: ``RESCHEDULED`` (it was pending and is now due at
        :attr:`deliver_at`, with the new arguments if given), ``ALREADY_DELIVERED``
        (it had fired: nothing changed, the job is queued, running or done) or
        ``NOT_FOUND`` (no pending run under that key or id: never scheduled,
        cancelled, or fired longer ago than the broker keeps fired messages).
    :param msg_id: the run's message id (``None`` only for ``NOT_FOUND`` by key).
    :param deliver_at_ms: when it is due now, epoch ms: the new time for
        ``RESCHEDULED``, the time it fired at for ``ALREADY_DELIVERED``; ``None``
        for ``NOT_FOUND``.
    """

    status: RescheduleStatus
    msg_id: str | None
    deliver_at_ms: int | None

    @property
    def rescheduled(self) -> bool:
        """Whether the run moved (``status`` is ``RESCHEDULED``)."""
        return self.status is RescheduleStatus.RESCHEDULED

    @property
    def deliver_at(self) -> datetime | None:
        """:attr:`deliver_at_ms` as an aware UTC datetime (``None`` for ``NOT_FOUND``)."""
        return None if self.deliver_at_ms is None else _utc(self.deliver_at_ms)


@dataclass(frozen=True, slots=True)
class CancelAllResult:
    """The answer of ``app.cancel_all(key_prefix=...)``, summed over the topics it covered.

    :param aborted: pending runs aborted (each will never run).
    :param already_delivered: keys under the prefix whose last run had already
        fired, in key order (at most :data:`~broker_adapter.results.MAX_REPORTED_KEYS`
        of them; a key used on two topics is listed twice).
    :param already_delivered_count: how many such keys in all.
    :param topics: the topics that were searched.
    """

    aborted: int
    already_delivered: tuple[str, ...] = ()
    already_delivered_count: int = 0
    topics: tuple[str, ...] = ()

    @property
    def any_fired(self) -> bool:
        """Whether a run under the prefix had fired before the call (so its job ran or will)."""
        return self.already_delivered_count > 0

    @classmethod
    def of(cls, results: Iterable[PrefixAbortResult], topics: Sequence[str]) -> CancelAllResult:
        """The sum of one ``abort_prefix`` result per topic."""
        aborted = count = 0
        keys: list[str] = []
        for r in results:
            aborted += r.aborted
            count += r.already_delivered_count
            keys.extend(r.already_delivered)
        return cls(aborted, tuple(sorted(keys)[:MAX_REPORTED_KEYS]), count, tuple(topics))


class ScheduledJob(NamedTuple):
    """The receipt of one ``schedule()``: which message, when, and whether it is new.

    A named tuple (like :class:`~broker_adapter.results.SendResult`): immutable,
    and cheap to build on the hot ``schedule()`` path. A receipt from a job
    handle also acts on its run: :meth:`run_now`, :meth:`reschedule` and
    :meth:`cancel` (and ``_async`` twins) address it by ``msg_id``.

    :param msg_id: the broker's message id (the idempotency key downstream).
    :param deliver_at_ms: when it is due, epoch ms.
    :param key: the business key it was sent with, if any.
    :param status: ``OK`` when stored now; ``DUPLICATE`` when a pending message
        with the same key already existed (``msg_id``/``deliver_at_ms`` are then
        that message's, and nothing new was stored).
    """

    msg_id: str
    deliver_at_ms: int
    key: str | None
    status: SendStatus

    @property
    def deliver_at(self) -> datetime:
        """When it was due when scheduled, as an aware UTC datetime."""
        return _utc(self.deliver_at_ms)

    @property
    def duplicate(self) -> bool:
        """``True`` when the key was already taken and nothing new was stored."""
        return self.status is SendStatus.DUPLICATE

    @property
    def job(self) -> JobHandle[Any, Any] | None:
        """The handle of the job this run belongs to; ``None`` for a receipt built by
        hand, copied or unpickled (a handle's receipts override this)."""
        return None

    def _handle(self) -> JobHandle[Any, Any]:
        handle = self.job
        if handle is None:
            raise InvalidArgument(
                f"this receipt (msg {self.msg_id}) does not know its job; call the job's "
                f"handle instead, e.g. close_order.run_now(msg_id={self.msg_id!r})"
            )
        return handle

    def run_now(self) -> RescheduleReceipt:
        """Make this run due now (``job.run_now(msg_id=receipt.msg_id)``).

        :raises InvalidArgument: for a receipt that does not know its job.
        """
        return self._handle().run_now(msg_id=self.msg_id)

    async def run_now_async(self) -> RescheduleReceipt:
        """The awaitable :meth:`run_now`."""
        return await self._handle().run_now_async(msg_id=self.msg_id)

    def reschedule(
        self,
        *,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> RescheduleReceipt:
        """Move this run (``job.reschedule(msg_id=receipt.msg_id, ...)``; see
        :meth:`JobHandle.reschedule <scheduler.run_control.RunControl.reschedule>`)."""
        return self._handle().reschedule(
            msg_id=self.msg_id, delay=delay, at=at, args=args, kwargs=kwargs
        )

    async def reschedule_async(
        self,
        *,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> RescheduleReceipt:
        """The awaitable :meth:`reschedule`."""
        return await self._handle().reschedule_async(
            msg_id=self.msg_id, delay=delay, at=at, args=args, kwargs=kwargs
        )

    def cancel(self) -> AbortStatus:
        """Cancel this run (``job.cancel(msg_id=receipt.msg_id)``)."""
        return self._handle().cancel(msg_id=self.msg_id)

    async def cancel_async(self) -> AbortStatus:
        """The awaitable :meth:`cancel`."""
        return await self._handle().cancel_async(msg_id=self.msg_id)

    # A handle's receipt class is made at run time: copies and pickles are plain.
    def __reduce__(self) -> tuple[type[ScheduledJob], tuple[Any, ...]]:
        return ScheduledJob, tuple(self)


def receipt_class(handle: JobHandle[Any, Any]) -> type[ScheduledJob]:
    """The :class:`ScheduledJob` subclass whose receipts act through ``handle``."""
    attrs = {"__slots__": (), "job": handle, "__module__": __name__, "__qualname__": "ScheduledJob"}
    return type("ScheduledJob", (ScheduledJob,), attrs)


__all__ = ["CancelAllResult", "RescheduleReceipt", "ScheduledJob", "receipt_class"]
