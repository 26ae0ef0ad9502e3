"""Moving a job's pending runs: ``job.reschedule(...)`` and ``job.run_now(...)``,
sync and awaitable; the half of :class:`~scheduler.handles.JobHandle` that changes
runs already scheduled.

A run is named as for ``cancel``: by ``key`` (on the job's topic) or by
``msg_id``. The broker moves it in one atomic step (see
:meth:`BrokerAdapter.reschedule <broker_adapter.base.BrokerAdapter.reschedule>`):
never two deliveries, never none, whatever the race with the old or the new fire
time; the run keeps its id, key and attempts, and its key stays taken.

The order workflow::

    remind_customer.schedule(42, delay=timedelta(minutes=15), key="order:42:remind")
    close_order.schedule(42, delay=timedelta(minutes=30), key="order:42:close")
    ...  # the customer asks for 20 more minutes
    remind_customer.reschedule(key="order:42:remind", delay=timedelta(minutes=35))
    close_order.reschedule(key="order:42:close", delay=timedelta(minutes=50))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import InvalidArgument, UnknownTopic
from broker_adapter.results import MessageView, PendingPage, RescheduleResult
from scheduler.errors import InvalidSchedule, UnserializableArgument
from scheduler.receipts import RescheduleReceipt
from scheduler.spec import CRON_KEY_PREFIX
from scheduler.timing import resolve_timing

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

#: Pending runs read per page while looking for a key's run (see :meth:`RunControl.reschedule`).
_KEY_PAGE = 100


class _Move(NamedTuple):
    """A checked reschedule: which run, where to, with which body."""

    msg_id: str | None
    key: str | None
    topic: str | None
    delay_ms: int | None
    deliver_at_ms: int | None
    body: bytes | None

    def by_id(self, msg_id: str) -> _Move:
        """The same move, addressed by ``msg_id``."""
        return self._replace(msg_id=msg_id, key=None, topic=None)


def _receipt(result: RescheduleResult) -> RescheduleReceipt:
    return RescheduleReceipt(result.status, result.msg_id, result.deliver_at_ms)


class RunControl:
    """``reschedule``/``run_now`` and their ``_async`` twins, mixed into
    :class:`~scheduler.handles.JobHandle` (which sets the attributes below)."""

    app: Scheduler
    topic: str
    _encode: Callable[[tuple[Any, ...] | list[Any], Mapping[str, Any]], bytes]

    @property
    def name(self) -> str:
        """The job's registered name."""
        raise NotImplementedError  # pragma: no cover - JobHandle defines it

    def reschedule(
        self,
        *,
        key: str | None = None,
        msg_id: str | None = None,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> RescheduleReceipt:
        """Move a pending run of this job to a new due time, optionally with new arguments.

        Name the run by ``key`` (on this job's topic) or by ``msg_id``; give exactly
        one of ``delay`` (from now, on the broker's clock) and ``at``. With ``args``
        and/or ``kwargs`` the run's call is replaced by ``job(*args, **kwargs)``
        (the one not given is empty); without them the arguments stay.

        :param delay: a :class:`~datetime.timedelta` or seconds, >= 0 (0: run now).
        :param at: an aware datetime (one in the past by at most
            ``settings.past_tolerance_ms`` means now).
        :returns: a :class:`~scheduler.receipts.RescheduleReceipt`: ``RESCHEDULED``
            with the new due time, ``ALREADY_DELIVERED`` (it fired first: the job
            runs with its old arguments; write it to check the current state) or
            ``NOT_FOUND``.
        :raises InvalidArgument: unless exactly one of ``key`` and ``msg_id`` is
            given; with new arguments, for a run that belongs to another job.
        :raises InvalidSchedule: unless exactly one of ``delay`` and ``at`` is given,
            for a naive or too-old ``at``, a negative delay, or a ``cron:`` key
            (cron occurrences follow their schedule).
        :raises UnserializableArgument: for an argument JSON cannot carry.
        :raises InvalidDelay: past the broker's max delay.
        :raises MessageTooLarge: for new arguments over the broker's size limit.

        Nothing changes when an error is raised.
        """
        move = self._move(key, msg_id, delay, at, args, kwargs)
        broker = self.app.client_broker(f"{self.name}.reschedule")
        if move.body is not None:
            move = self._checked_target(broker, move)
        return _receipt(broker.reschedule(move.msg_id, **_fields(move)))

    async def reschedule_async(
        self,
        *,
        key: str | None = None,
        msg_id: str | None = None,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> RescheduleReceipt:
        """The awaitable :meth:`reschedule` (same checks, same move, same answers)."""
        move = self._move(key, msg_id, delay, at, args, kwargs)
        broker = await self.app.async_broker()
        if move.body is not None:
            if move.msg_id is not None:
                move = self._owned(move, await broker.query(move.msg_id))
            else:
                move = await self._owned_by_key_async(move)
        return _receipt(await broker.reschedule(move.msg_id, **_fields(move)))

    def run_now(self, *, key: str | None = None, msg_id: str | None = None) -> RescheduleReceipt:
        """Make a pending run of this job due now (a reschedule with ``delay=0``): a
        dispatcher starts it as soon as it pulls it.

        :returns: see :meth:`reschedule`.
        :raises InvalidArgument: unless exactly one of ``key`` and ``msg_id`` is given.
        """
        move = self._move(key, msg_id, 0, None, None, None)
        broker = self.app.client_broker(f"{self.name}.run_now")
        return _receipt(broker.reschedule(move.msg_id, **_fields(move)))

    async def run_now_async(
        self, *, key: str | None = None, msg_id: str | None = None
    ) -> RescheduleReceipt:
        """The awaitable :meth:`run_now`."""
        move = self._move(key, msg_id, 0, None, None, None)
        broker = await self.app.async_broker()
        return _receipt(await broker.reschedule(move.msg_id, **_fields(move)))

    # -- checks -------------------------------------------------------------------------

    def _move(
        self,
        key: str | None,
        msg_id: str | None,
        delay: timedelta | float | None,
        at: datetime | None,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
    ) -> _Move:
        """Check a reschedule's arguments (before anything is sent)."""
        if (key is None) == (msg_id is None):
            raise InvalidArgument(
                f"{self.name}: give exactly one of key=... or msg_id=... to name the run"
            )
        if isinstance(key, str) and key.startswith(CRON_KEY_PREFIX):
            raise InvalidSchedule(
                f"key={key!r} is a cron occurrence, which follows its schedule; change the "
                "schedule instead, or cancel the occurrence"
            )
        if delay is None and at is None:
            raise InvalidSchedule(
                f"{self.name}.reschedule() takes one of delay= or at= (delay=0 runs it now)"
            )
        settings = self.app.settings
        timing = resolve_timing(
            now_ms=self.app.clock.now_ms(),
            past_tolerance_ms=settings.past_tolerance_ms,
            delay=delay,
            at=at,
        )
        body = None
        if args is not None or kwargs is not None:
            if args is not None and not isinstance(args, tuple | list):
                raise UnserializableArgument(
                    "args", args, "give the new arguments as a tuple or list"
                )
            body = self._encode(
                args if args is not None else (), kwargs if kwargs is not None else {}
            )
        topic = None if key is None else self.topic
        return _Move(msg_id, key, topic, timing.get("delay_ms"), timing.get("deliver_at_ms"), body)

    def _owned(self, move: _Move, view: MessageView | None) -> _Move:
        """``move``, after checking that the run ``view`` shows is this job's.

        Runs carry their job's name as tags; an untagged run (sent before runs were
        tagged) is taken as this job's.
        """
        if view is not None and view.tags is not None and view.tags != self.name:
            raise InvalidArgument(
                f"{view.key or view.msg_id} is a run of job {view.tags!r}, not {self.name!r}; "
                f"new arguments would turn it into a {self.name} run: reschedule it with "
                f"that job's handle"
            )
        return move if view is None else move.by_id(view.msg_id)

    def _checked_target(self, broker: BrokerAdapter, move: _Move) -> _Move:
        """The move of a new body, addressed to this job's run (see :meth:`_owned`)."""
        if move.msg_id is not None:
            return self._owned(move, broker.query(move.msg_id))
        cursor: str | None = None
        while True:
            try:
                page = broker.find_pending(**_key_search(move, cursor))
            except UnknownTopic:  # nothing was ever sent here: the broker answers NOT_FOUND
                return move
            found = _exact(page, move.key)
            if found is not None or page.cursor is None:
                return self._owned(move, found)
            cursor = page.cursor

    async def _owned_by_key_async(self, move: _Move) -> _Move:
        """:meth:`_checked_target` by key, on the async broker."""
        broker = await self.app.async_broker()
        cursor: str | None = None
        while True:
            try:
                page = await broker.find_pending(**_key_search(move, cursor))
            except UnknownTopic:
                return move
            found = _exact(page, move.key)
            if found is not None or page.cursor is None:
                return self._owned(move, found)
            cursor = page.cursor


def _fields(move: _Move) -> dict[str, Any]:
    """The keyword arguments of ``broker.reschedule`` for ``move``."""
    return {
        "key": move.key,
        "topic": move.topic,
        "delay_ms": move.delay_ms,
        "deliver_at_ms": move.deliver_at_ms,
        "body": move.body,
    }


def _key_search(move: _Move, cursor: str | None) -> dict[str, Any]:
    """``find_pending`` arguments for the pending runs under ``move.key`` (one page)."""
    return {"topic": move.topic, "key_prefix": move.key, "limit": _KEY_PAGE, "cursor": cursor}


def _exact(page: PendingPage, key: str | None) -> MessageView | None:
    return next((v for v in page.messages if v.key == key), None)


__all__ = ["RunControl"]
