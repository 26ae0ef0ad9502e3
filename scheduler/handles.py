"""What ``@app.job`` returns: a :class:`JobHandle` that schedules, cancels and looks up
timed runs of one job, and the :class:`ScheduledJob` receipt of each run.

The messages they send are described in :mod:`scheduler.wire` (each run carries its
job's name as tags). Moving a pending run (``reschedule``, ``run_now``) is in
:mod:`scheduler.run_control`; the receipts, which can act on their own run, in
:mod:`scheduler.receipts`; the runs of ``schedule_many`` (:class:`Call`) in
:mod:`scheduler.batch_calls`.

Timeouts: the order auto-close workflow
---------------------------------------

A timeout is a job scheduled for "later, unless cancelled first". Schedule it
when the order is created, under a key derived from the order, and cancel it when
the order is paid::

    @app.job()
    def close_order(order_id: int) -> None:
        with db.transaction():
            order = db.orders.get(order_id, for_update=True)
            if order.state == "unpaid":  # idempotent: check the state inside the job
                order.state = "closed"

    close_order.schedule(order.id, delay=timedelta(minutes=30), key=f"order:{order.id}")
    ...
    status = close_order.cancel(key=f"order:{order.id}")  # on payment

``cancel`` answers with an :class:`~broker_adapter.results.AbortStatus`:

* ``ABORTED``: the close will never run, whatever the race with its time;
* ``ALREADY_DELIVERED``: the timeout fired first; the close job is queued, running
  or done. Payment and close now race *in your data*, so the job body must decide
  from the order's current state ("close only if still unpaid", under a row lock or
  a compare-and-set), and the payment path must do the same ("mark paid only if not
  closed", or refund);
* ``NOT_FOUND``: no close was scheduled under that key (or it fired longer ago
  than the broker keeps fired messages: 72 h by default).

Delivery is at least once (a crash can redeliver a job that ran), so the same
state check makes a repeated close harmless. Sending the same key twice while
the first is pending answers ``SendStatus.DUPLICATE`` and stores nothing, so
"schedule the timeout" is idempotent too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, ParamSpec, TypeVar

from broker_adapter.errors import InvalidArgument
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, MessageView, SendResult
from scheduler.batch_calls import Call, CallLike, batch_messages, check_key
from scheduler.receipts import ScheduledJob, receipt_class
from scheduler.run_control import RunControl
from scheduler.spec import CronSpec, JobSpec
from scheduler.timing import resolve_timing
from scheduler.wire import Positional, make_encoder, positional

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

P = ParamSpec("P")
R = TypeVar("R")

_NOW: Positional = (None, None, None, None, None)
# Receipts are named tuples: tuple.__new__ builds one without NamedTuple's Python-level
# __new__ (a third of the cost, once per scheduled run).
_new = tuple.__new__
# Delay types whose equal values give the same timing (and no error, once checked).
_PLAIN_DELAYS: frozenset[type] = frozenset({int, float, timedelta, type(None)})


class _Unset:
    """The type of no delay yet: schedule()'s cache matches nothing at first."""


_NO_MESSAGE = Message("unset", b"")


class JobHandle(RunControl, Generic[P, R]):
    """A registered job: call it directly to run it now, in this process, or
    :meth:`schedule` it to run later through the broker; :meth:`cancel`,
    :meth:`~scheduler.run_control.RunControl.reschedule` or
    :meth:`~scheduler.run_control.RunControl.run_now` a scheduled run.

    Returned by ``@app.job`` and ``@app.cron``; :attr:`spec` is its
    :class:`~scheduler.spec.JobSpec`, :attr:`cron` its
    :class:`~scheduler.spec.CronSpec` (``None`` for a plain job).
    """

    # Copied from the function by functools.update_wrapper.
    __name__: str
    __qualname__: str
    __wrapped__: Callable[P, R]

    def __init__(self, app: Scheduler, spec: JobSpec, cron: CronSpec | None = None) -> None:
        self.app = app
        self.spec = spec
        self.cron = cron
        #: The topic this job's messages go to.
        self.topic = spec.topic_or(app.settings.topic)
        self._encode = make_encoder(spec.name)
        self._name = spec.name
        # The last timing schedule() used and a message of this job with it (see _message).
        self._last: tuple[Positional, Message] | None = None
        # schedule()'s last plain delay: its type, value and a message of it.
        self._plain: tuple[type, object, Message] = (_Unset, None, _NO_MESSAGE)
        self._tolerance = app.settings.past_tolerance_ms
        self._calls = _CallNames.of(spec.name)
        # Receipts of this class act on their run through this handle (receipt.run_now()).
        self._receipt = receipt_class(self)
        functools.update_wrapper(self, spec.func)

    @property
    def name(self) -> str:
        """The job's registered name (carried by its messages)."""
        return self.spec.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function now, in this thread (no broker involved)."""
        result: R = self.spec.func(*args, **kwargs)
        return result

    def __repr__(self) -> str:
        kind = "cron" if self.cron is not None else "job"
        return f"<JobHandle {kind} {self.spec.name} executor={self.spec.executor}>"

    # -- scheduling -------------------------------------------------------------------

    def _timing(
        self, delay: timedelta | float | None, at: datetime | None, delay_level: int | None
    ) -> Positional:
        """The checked timing as Message's positional fields after ``tags``."""
        # Fast path: a plain number of seconds needs no datetime work (nor a dict).
        if at is None and delay_level is None:
            if delay is None:
                return _NOW
            if type(delay) is int and delay >= 0:
                return (None, delay * 1000, None, None, None)
            if type(delay) is float and 0.0 <= delay < 1e15:
                return (None, round(delay * 1000), None, None, None)
        return positional(
            resolve_timing(
                now_ms=self.app.clock.now_ms(),
                past_tolerance_ms=self._tolerance,
                delay=delay,
                at=at,
                delay_level=delay_level,
            )
        )

    def schedule(
        self,
        *args: Any,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        delay_level: int | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> ScheduledJob:
        """Run the job later with ``args`` and ``kwargs``: send it as a timed message.

        Give at most one of ``delay``, ``at`` and ``delay_level``; none runs it as
        soon as a dispatcher pulls it. Everything is checked before anything is sent.

        :param delay: a :class:`~datetime.timedelta` or seconds (int or float), >= 0.
        :param at: an *aware* datetime; one in the past by at most
            ``settings.past_tolerance_ms`` runs at once.
        :param delay_level: RocketMQ delay level 1 (1 s) to 18 (2 h).
        :param key: business key such as ``"order:42"``: at most one pending run per
            key and topic (a second send answers ``DUPLICATE``), and
            :meth:`cancel` finds the run by it. Keys starting with ``cron:`` are reserved.
        :returns: the :class:`ScheduledJob` receipt.
        :raises InvalidSchedule: for a naive or too-old ``at``, a negative delay, a
            level outside 1..18, more than one timing argument, or a ``cron:`` key.
        :raises UnserializableArgument: for an argument JSON cannot carry.
        :raises InvalidMessage: for a key that is not a str of 1 to 512 characters.
        :raises InvalidDelay: when the due time is past the broker's max delay.
        """
        # The hot path (issue 16): a repeated plain delay (the same int, float,
        # timedelta or None as the last call's) reuses its checked message without
        # working out the timing again; anything else goes through _message.
        plain = self._plain
        if at is None and delay_level is None and type(delay) is plain[0] and delay == plain[1]:
            if key is not None:
                check_key(key)
            message = plain[2].with_body(self._encode(args, kwargs), key)
        else:
            message = self._message(args, kwargs, delay, at, delay_level, key)
            if at is None and delay_level is None and type(delay) in _PLAIN_DELAYS:
                self._plain = (type(delay), delay, message)
        status, msg_id, due = self.app.client_broker(self._calls.schedule).send(message)
        return _new(self._receipt, (msg_id, due, key, status))  # no NamedTuple.__new__

    async def schedule_async(
        self,
        *args: Any,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        delay_level: int | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> ScheduledJob:
        """The awaitable :meth:`schedule`: the same checks, message and receipt, sent
        through the app's async client (:mod:`scheduler.async_client`) without
        blocking the event loop.

        :raises BrokerClosed: after ``app.close()``/``await app.aclose()``; and what
            :meth:`schedule` raises, before anything is sent.
        """
        message = self._message(args, kwargs, delay, at, delay_level, key)
        result = await (await self.app.async_broker()).send(message)
        return self._receipt(result.msg_id, result.deliver_at_ms, key, result.status)

    def _message(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: timedelta | float | None,
        at: datetime | None,
        delay_level: int | None,
        key: str | None,
    ) -> Message:
        """The (checked) message of one run: shared by :meth:`schedule` and its twin."""
        if key is not None:
            check_key(key)
        timing = self._timing(delay, at, delay_level)
        body = self._encode(args, kwargs)
        # Runs mostly repeat one timing (delay=30 * 60): a copy of the last message
        # built for it (Message.with_body) costs less than a new one.
        last = self._last
        if last is None or last[0] != timing:
            last = self._last = (timing, Message(self.topic, b"", None, self._name, *timing))
        return last[1].with_body(body, key)

    def schedule_many(
        self,
        calls: Iterable[CallLike],
        *,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        delay_level: int | None = None,
    ) -> list[ScheduledJob]:
        """Schedule many runs in one broker round trip (one ``send_batch``).

        All or nothing: every call is checked first, and if one is invalid the
        error is raised and nothing is sent. Keys repeated within the batch answer
        ``DUPLICATE`` for all but the first.

        ::

            close_order.schedule_many([((42,), {}, "order:42"), ((43,), {}, "order:43")],
                                      delay=timedelta(minutes=30))
            close_order.schedule_many([Call((44,), key="order:44", delay=60)])

        :param calls: each a :class:`Call`, ``(args, kwargs)`` or ``(args, kwargs, key)``.
        :param delay: the default timing of calls that set none (see :meth:`schedule`).
        :param at: the default timing of calls that set none.
        :param delay_level: the default timing of calls that set none.
        :returns: one :class:`ScheduledJob` per call, in order.
        :raises InvalidSchedule: see :meth:`schedule`; the message names the call's index.
        :raises UnserializableArgument: see :meth:`schedule`.
        :raises TypeError: for an entry that is neither a :class:`Call` nor a 2- or 3-tuple.
        """
        default = self._timing(delay, at, delay_level)
        messages, keys = self._messages(calls, default)
        if not messages:
            return []
        results = self.app.client_broker(self._calls.schedule_many).send_batch(messages)
        return _receipts(self._receipt, results, keys)

    async def schedule_many_async(
        self,
        calls: Iterable[CallLike],
        *,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        delay_level: int | None = None,
    ) -> list[ScheduledJob]:
        """The awaitable :meth:`schedule_many`: the same checks, messages (one
        ``send_batch``) and receipts, through the app's async client.

        :raises BrokerClosed: after the app closed; and what :meth:`schedule_many`
            raises, before anything is sent.
        """
        default = self._timing(delay, at, delay_level)
        messages, keys = self._messages(calls, default)
        if not messages:
            return []
        results = await (await self.app.async_broker()).send_batch(messages)
        return _receipts(self._receipt, results, keys)

    def _messages(
        self, calls: Iterable[CallLike], default: Positional
    ) -> tuple[list[Message], list[str | None]]:
        """The messages of ``schedule_many``'s calls (checked), and their keys."""
        template = Message(self.topic, b"", None, self._name, *default)
        return batch_messages(calls, template, self._encode, self._timing)

    # -- cancelling and looking up ----------------------------------------------------

    def cancel(self, *, key: str | None = None, msg_id: str | None = None) -> AbortStatus:
        """Cancel a scheduled run, by ``key`` (on this job's topic) or by ``msg_id``.

        The abort is durable and takes effect when it reaches the broker:

        * ``ABORTED``: the run will never happen (cancelling twice answers it twice;
          the key is then free for a new run);
        * ``ALREADY_DELIVERED``: it fired before the cancel arrived, so the job is
          queued, running or done. This is the order-timeout race: write the job
          body so that it checks the current state ("close the order only if it is
          still unpaid") and is harmless when it should no longer act; see this
          module's "Timeouts" section;
        * ``NOT_FOUND``: no such run (never scheduled, or a typo in the key).

        :raises InvalidArgument: unless exactly one of ``key`` and ``msg_id`` is given.
        """
        topic = self._cancel_topic(key, msg_id)
        broker = self.app.client_broker(self._calls.cancel)
        return broker.abort(msg_id, key=key, topic=topic).status

    async def cancel_async(
        self, *, key: str | None = None, msg_id: str | None = None
    ) -> AbortStatus:
        """The awaitable :meth:`cancel` (same abort, same three answers).

        :raises InvalidArgument: unless exactly one of ``key`` and ``msg_id`` is given.
        :raises BrokerClosed: after the app closed.
        """
        topic = self._cancel_topic(key, msg_id)
        broker = await self.app.async_broker()
        return (await broker.abort(msg_id, key=key, topic=topic)).status

    def _cancel_topic(self, key: str | None, msg_id: str | None) -> str | None:
        """The topic a cancel names (this job's, by key; none by id), after its checks."""
        if (key is None) == (msg_id is None):
            raise InvalidArgument("cancel() takes exactly one of key=... or msg_id=...")
        return None if key is None else self.topic

    def get(self, msg_id: str) -> MessageView | None:
        """The broker's current view of a run (pending, ready, in flight, done,
        aborted or dead), or ``None`` for an unknown id."""
        return self.app.client_broker(self._calls.get).query(msg_id)

    async def get_async(self, msg_id: str) -> MessageView | None:
        """The awaitable :meth:`get`.

        :raises BrokerClosed: after the app closed.
        """
        return await (await self.app.async_broker()).query(msg_id)


class _CallNames(NamedTuple):
    """A handle's call names for the loop rule's message, formatted once."""

    schedule: str
    schedule_many: str
    cancel: str
    get: str

    @classmethod
    def of(cls, job: str) -> _CallNames:
        return cls(*(f"{job}.{call}" for call in cls._fields))


def _receipts(
    cls: type[ScheduledJob], results: list[SendResult], keys: list[str | None]
) -> list[ScheduledJob]:
    """One ``cls`` receipt per send result (built without NamedTuple's checks)."""
    return [_new(cls, (r[1], r[2], k, r[0])) for r, k in zip(results, keys, strict=True)]


__all__ = ["Call", "CallLike", "JobHandle", "ScheduledJob"]
