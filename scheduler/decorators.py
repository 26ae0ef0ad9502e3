"""The schedule decorators of :class:`~scheduler.Scheduler`: ``@app.cron`` and
``@app.every``.

Both register a job (as ``@app.job`` does) with a :class:`~scheduler.spec.CronSpec`:
the job runs with no arguments at each fire time of its trigger, a cron
expression (:class:`~scheduler.triggers.CronTrigger`) or an anchored interval
(:class:`~scheduler.interval.IntervalTrigger`). Both are planned alike
(:mod:`scheduler.cron`): one idempotent message per occurrence, the same misfire
policy, jitter, ``max_running`` and no double fire across schedulers. They appear
in ``app.schedules.list()`` and can be paused there.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from broker_adapter.base import DEFAULT_MAX_ATTEMPTS
from scheduler.executor_kinds import EXECUTOR_KINDS
from scheduler.handles import JobHandle
from scheduler.interval import IntervalTrigger, Trigger
from scheduler.limits import RateLimit
from scheduler.spec import (
    DEFAULT_MAX_CATCH_UP,
    Coalesce,
    CronSpec,
    JobSpec,
    MisfirePolicy,
    RetryPolicy,
)
from scheduler.triggers import CronTrigger

P = ParamSpec("P")
R = TypeVar("R")


def job_options(
    executor: str | None,
    max_attempts: int,
    timeout: float | timedelta | None,
    topic: str | None,
    queue: str | None,
    retry: RetryPolicy | None,
    rate_limit: str | RateLimit | None = None,
) -> dict[str, Any]:
    """The JobSpec options ``@app.job``, ``@app.cron`` and ``@app.every`` share."""
    options: dict[str, Any] = {"executor": executor or "", "max_attempts": max_attempts}
    options.update(timeout=timeout, topic=topic, queue=queue, rate_limit=rate_limit)
    if retry is not None:
        options["retry"] = retry
    return options


class ScheduleDecorators(abc.ABC):
    """``cron`` and ``every``: the half of the Scheduler that registers schedules."""

    @abc.abstractmethod
    def _add(self, spec: JobSpec, cron: CronSpec | None) -> JobHandle[Any, Any]:
        """Register ``spec`` (with its schedule) and return its handle."""

    def cron(
        self,
        expr: str,
        /,
        *,
        tz: str = "UTC",
        misfire_grace_time: float | timedelta | None = None,
        coalesce: Coalesce = "latest",
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        max_running: int = 1,
        jitter: float | timedelta | None = None,
        executor: str | None = None,
        name: str | None = None,
        topic: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        queue: str | None = None,
        retry: RetryPolicy | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> Callable[[Callable[P, R]], JobHandle[P, R]]:
        """Register a cron job, run with no arguments at each fire time of ``expr``.

        Each occurrence is one message keyed ``cron:<name>:<fire_ms>`` (see
        :mod:`scheduler.cron`); DST rules are those of :mod:`scheduler.triggers`.

        :param expr: five fields (``minute hour day month weekday``), six with
            seconds first, or an alias such as ``@daily``.
        :param tz: IANA time zone the expression is read in.
        :param misfire_grace_time: how late (seconds or timedelta) an occurrence may
            still run; ``None`` means no limit.
        :param coalesce: of the missed occurrences within grace, run the
            ``"latest"``, the ``"earliest"`` or ``"all"`` (at most ``max_catch_up``).
        :param max_running: how many runs of it may overlap (enforced by the dispatcher).
        :param jitter: delay each occurrence by up to this many seconds, the same
            for every scheduler (derived from the occurrence's key).
        :param executor: see :meth:`Scheduler.job <scheduler.Scheduler.job>`; the other options (``rate_limit`` too) are
            :meth:`Scheduler.job <scheduler.Scheduler.job>`'s.
        :raises InvalidCron: for a malformed expression or an unknown time zone.
        :raises InvalidJobSpec: for an option that cannot work, or a function that
            cannot be called without arguments.
        :raises DuplicateJob: when another job already has the name.
        """
        trigger = CronTrigger(expr, tz)
        misfire = MisfirePolicy(
            grace_s=misfire_grace_time,  # type: ignore[arg-type]  # seconds() converts
            coalesce=coalesce,
            max_catch_up=max_catch_up,
        )
        options = job_options(executor, max_attempts, timeout, topic, queue, retry, rate_limit)
        return self._schedule_decorator(trigger, misfire, max_running, jitter, name, options)

    def every(
        self,
        every: timedelta | float,
        /,
        *,
        anchor: datetime | int | None = None,
        tz: str = "UTC",
        misfire_grace_time: float | timedelta | None = None,
        coalesce: Coalesce = "latest",
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        max_running: int = 1,
        jitter: float | timedelta | None = None,
        executor: str | None = None,
        name: str | None = None,
        topic: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        queue: str | None = None,
        retry: RetryPolicy | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> Callable[[Callable[P, R]], JobHandle[P, R]]:
        """Register an interval job, run with no arguments every ``every``::

            @app.every(timedelta(seconds=90))
            def heartbeat() -> None: ...

        Anchored and drift-free: occurrence ``n`` is at ``anchor + n * every``
        (never "``every`` after the last run ended"), the same in every process and
        across restarts. Everything else is as for :meth:`cron`: one message per
        occurrence keyed ``cron:<name>:<fire_ms>``, the misfire policy, jitter,
        ``max_running``, and no occurrence fired twice by two schedulers.

        :param every: the interval, a timedelta or seconds (at least 1 s).
        :param anchor: an aware datetime (or epoch ms) that is a fire time; the Unix
            epoch by default, so ``every=timedelta(minutes=7)`` fires at every
            multiple of 7 minutes since 1970-01-01T00:00Z, across hour boundaries.
        :param tz: the zone its fire times are shown in (it does not move them).
        :param misfire_grace_time: see :meth:`cron`; the other options too.
        :raises InvalidSchedule: for an interval under 1 s or a naive anchor.
        :raises InvalidJobSpec: for an option that cannot work, or a function that
            cannot be called without arguments.
        :raises DuplicateJob: when another job already has the name.
        """
        trigger = IntervalTrigger(every, anchor, tz)
        return self._schedule_decorator(
            trigger,
            MisfirePolicy(
                grace_s=misfire_grace_time,  # type: ignore[arg-type]  # seconds() converts
                coalesce=coalesce,
                max_catch_up=max_catch_up,
            ),
            max_running,
            jitter,
            name,
            job_options(executor, max_attempts, timeout, topic, queue, retry, rate_limit),
        )

    def _schedule_decorator(
        self,
        trigger: Trigger,
        misfire: MisfirePolicy,
        max_running: int,
        jitter: float | timedelta | None,
        name: str | None,
        options: dict[str, Any],
    ) -> Callable[[Callable[P, R]], JobHandle[P, R]]:
        def decorate(fn: Callable[P, R]) -> JobHandle[P, R]:
            spec = JobSpec.for_function(fn, name, **options)
            EXECUTOR_KINDS.get(spec.executor).check_cron_function(fn)
            cron = CronSpec(spec, trigger, misfire, max_running, jitter)  # type: ignore[arg-type]
            return self._add(spec, cron)

        return decorate


__all__ = ["ScheduleDecorators", "job_options"]
