"""The :class:`Scheduler` facade: what an application touches.

::

    app = Scheduler()                       # broker from CHRONOQ_BROKER_URL

    @app.job(max_attempts=5)
    def close_order(order_id: int) -> None: ...

    @app.cron("0 5 * * *", tz="Asia/Shanghai", misfire_grace_time=60)
    def cleanup() -> None: ...

    close_order.schedule(42, delay=timedelta(minutes=30), key="order:42")
    close_order.cancel(key="order:42")
    app.run()                               # dispatcher + cron planner until SIGTERM

Decorating touches no broker; the broker is opened on first use (``app.broker``),
so importing an app module is cheap and side-effect free.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar, overload

from broker_adapter.base import DEFAULT_MAX_ATTEMPTS, BrokerAdapter
from broker_adapter.clock import Clock
from scheduler.app_broker import AppBroker
from scheduler.app_calls import AppCalls
from scheduler.decorators import ScheduleDecorators, job_options
from scheduler.errors import InvalidSettings
from scheduler.handles import JobHandle
from scheduler.limits import RateLimit
from scheduler.registry import JobRegistry
from scheduler.runners import app_runner
from scheduler.settings import Settings
from scheduler.spec import (
    CronSpec,
    JobSpec,
    RetryPolicy,
    check_job_function,
)

if TYPE_CHECKING:
    from scheduler.cron import CronPlanner
    from scheduler.schedules import Schedules

P = ParamSpec("P")
R = TypeVar("R")


class Scheduler(AppBroker, AppCalls, ScheduleDecorators):
    """Jobs, cron jobs and the broker they are sent through.

    Every client call has an awaitable twin (``schedule_async``, ``cancel_async``,
    ..., :meth:`pending_async`): see :mod:`scheduler.async_client`; close with
    :meth:`close` or ``await`` :meth:`aclose`. The broker, opened on first use, and
    its lifetime are :class:`~scheduler.app_broker.AppBroker`'s.

    :param broker: a broker URL (overrides ``settings.broker_url``), an open
        :class:`~broker_adapter.base.BrokerAdapter` (used as given, never closed
        here), or ``None`` for ``settings.broker_url``.
    :param settings: the settings; by default :meth:`Settings.from_env` (``CHRONOQ_*``).
    :param clock: time source, also handed to the broker this scheduler opens
        (a :class:`~broker_adapter.clock.ManualClock` in tests).
    :param overrides: :class:`Settings` fields that win over ``settings`` and the
        environment, e.g. ``topic="shop.jobs"``.
    :raises InvalidSettings: for a bad setting (at construction, not on first use).
    :raises TypeError: for a ``broker`` that is neither a str nor a BrokerAdapter.
    """

    def __init__(
        self,
        broker: str | BrokerAdapter | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        **overrides: Any,
    ) -> None:
        if broker is not None and not isinstance(broker, str | BrokerAdapter):
            raise TypeError(
                f"broker= takes a URL such as 'rocksdb://./chronoq-data' or a BrokerAdapter, "
                f"got {type(broker).__name__}"
            )
        if isinstance(broker, str):
            overrides["broker_url"] = broker
        if settings is None:
            settings = Settings.from_env(**overrides)
        elif not isinstance(settings, Settings):
            raise TypeError(f"settings= takes a Settings, got {type(settings).__name__}")
        elif overrides:
            known = Settings.env_names()
            for name, value in overrides.items():
                if name not in known:
                    raise InvalidSettings(
                        name,
                        f"CHRONOQ_{name.upper()}",
                        value,
                        f"no such setting; known settings: {', '.join(known)}",
                    )
            settings = dataclasses.replace(settings, **overrides)
        self._settings = settings
        self._hold_broker(broker if isinstance(broker, BrokerAdapter) else None, clock)
        self._registry = JobRegistry()
        self._handles: dict[str, JobHandle[Any, Any]] = {}
        from scheduler.cron import CronPlanner  # cron.py imports this module's names

        self._planner = CronPlanner(self)
        self._schedules: Schedules | None = None

    # -- properties -----------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The validated settings."""
        return self._settings

    @property
    def registry(self) -> JobRegistry:
        """Registered jobs and cron jobs; dispatchers resolve job names here."""
        return self._registry

    @property
    def planner(self) -> CronPlanner:
        """The :class:`~scheduler.cron.CronPlanner` that arms this app's schedules."""
        return self._planner

    @property
    def schedules(self) -> Schedules:
        """The app's schedules at runtime (:class:`~scheduler.schedules.Schedules`):
        ``add``/``update``/``pause``/``resume``/``remove``/``get``/``list``/``run_now``,
        stored in the broker; the ``@app.cron``/``@app.every`` jobs are listed too."""
        found = self._schedules
        if found is None:
            from scheduler.schedules import Schedules  # schedules.py imports this module's names

            found = self._schedules = Schedules(self)
        return found

    def handle(self, name: str) -> JobHandle[Any, Any]:
        """The :class:`JobHandle` of the job registered here under ``name``.

        :raises JobNotFound: for an unknown name.
        """
        found = self._handles.get(name)
        if found is None:
            self._registry.get(name)  # raises JobNotFound with a suggestion
            raise AssertionError(name)  # pragma: no cover - registry and handles agree
        return found

    # -- decorators -------------------------------------------------------------------

    @overload
    def job(self, func: Callable[P, R], /) -> JobHandle[P, R]: ...

    @overload
    def job(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        executor: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        topic: str | None = None,
        queue: str | None = None,
        retry: RetryPolicy | None = None,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> Callable[[Callable[P, R]], JobHandle[P, R]]: ...

    def job(
        self,
        func: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        executor: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        topic: str | None = None,
        queue: str | None = None,
        retry: RetryPolicy | None = None,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> JobHandle[P, R] | Callable[[Callable[P, R]], JobHandle[P, R]]:
        """Register a job; use as ``@app.job`` or ``@app.job(...)``.

        The function stays callable directly; the returned :class:`JobHandle` adds
        ``schedule``, ``schedule_many``, ``cancel`` and ``get``.

        :param name: unique job name; ``module.qualname`` by default. Messages carry
            it, so renaming a job orphans its pending messages.
        :param executor: a registered executor kind
            (:data:`~scheduler.executor_kinds.EXECUTOR_KINDS`): ``"local"`` (thread
            pool), ``"async"`` (the dispatcher's event loop), ``"celery"``,
            ``"spark"``, or one registered since. By default ``"async"`` for an
            ``async def`` function, else ``"local"``.
        :param max_attempts: deliveries before the message goes to the dead-letter topic.
        :param timeout: seconds (or timedelta) one attempt may run.
        :param topic: the topic of its messages; by default ``settings.topic``.
        :param queue: the queue, for an executor kind with queues (``"celery"``).
        :param retry: backoff between attempts; RocketMQ's schedule by default.
        :param max_running: most runs going at once across every dispatcher of the
            app (``None``: no limit); a run over it waits, never fails.
        :param rate_limit: most runs started per second, minute or hour across every
            dispatcher (``"100/s"``, ``"30/m"``, ``"5/10s"``; see
            :class:`~scheduler.limits.RateLimit`); a run over it waits, never fails.
        :raises InvalidJobSpec: for an option that cannot work.
        :raises DuplicateJob: when another job already has the name.
        """
        if func is not None and not callable(func):
            if inspect.iscoroutine(func):
                check_job_function(func)  # raises InvalidJobSpec: decorate the function
            raise TypeError(f"@app.job takes options by keyword, e.g. @app.job(name={func!r})")
        options = job_options(executor, max_attempts, timeout, topic, queue, retry, rate_limit)
        options["max_running"] = max_running

        def decorate(fn: Callable[P, R]) -> JobHandle[P, R]:
            spec = JobSpec.for_function(fn, name, **options)
            return self._add(spec, None)

        return decorate(func) if func is not None else decorate

    def _add(self, spec: JobSpec, cron: CronSpec | None) -> JobHandle[Any, Any]:
        if cron is not None:
            self._registry.register_cron(cron)
        else:
            self._registry.register(spec)
        existing = self._handles.get(spec.name)
        if existing is not None and existing.spec.func is spec.func:
            return existing
        handle: JobHandle[Any, Any] = JobHandle(self, spec, cron)
        self._handles[spec.name] = handle
        return handle

    # -- looking around ---------------------------------------------------------------

    def topics(self) -> set[str]:
        """The topics this app's jobs are sent to (always includes ``settings.topic``);
        a dispatcher subscribes to these."""
        default = self._settings.topic
        return {default} | {spec.topic_or(default) for spec in self._registry}

    # -- running and closing ----------------------------------------------------------

    def run(self, *, stop_event: threading.Event | None = None) -> None:
        """Run a dispatcher and the cron planner on this app until SIGINT/SIGTERM
        (or until ``stop_event`` is set).

        The runner is :func:`workers.runner.run_app`, registered when ``workers`` is
        imported (:mod:`scheduler.runners`: the scheduler layer cannot import it).

        :param stop_event: set it to stop (for tests and embedding).
        :raises NoAppRunner: when ``workers`` was not imported.
        """
        app_runner()(self, stop_event=stop_event)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Scheduler {self._broker_label()} {len(self._registry)} jobs>"


__all__ = ["Scheduler"]
