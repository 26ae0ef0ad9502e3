"""The Celery side of chronoq: a ready Celery app, the generic task, and
:func:`schedule_task` for tasks of an existing Celery app.

chronoq jobs on Celery workers (one module serves both processes)::

    # shop.py
    from scheduler import Scheduler
    from workers.celery import celery_app_for

    scheduler = Scheduler("rocksdb://./chronoq-data")
    app = celery_app_for(scheduler, "redis://127.0.0.1:6379/0")   # a ready Celery app

    @scheduler.job(executor="celery", queue="orders")
    def close_order(order_id: int) -> None: ...

    close_order.schedule(42, delay=timedelta(minutes=30), key="order:42")

::

    celery -A shop worker -Q orders,celery     # runs the jobs (Celery finds ``shop.app``)
    chronoq run shop:scheduler                  # fires them: publishes each at its time

Celery's ``-A shop`` takes the module's ``app`` attribute whatever it is, so name
the Celery app ``app`` (and the Scheduler otherwise), or point at it:
``celery -A shop:celery_app worker``.

The app has one generic task, :data:`~workers.celery.publish.RUN_TASK`
(``chronoq.run``), which resolves the job by name in the Scheduler's registry
and runs it with :func:`workers.current_job` set (message id = Celery task id,
attempt, due time). It is declared ``acks_late`` with ``reject_on_worker_lost``,
so a worker killed mid-task gives the task back to Celery, which runs it again
under the same id. A redelivered chronoq message finds its task ``SENT`` (stored
by the executor once Celery's broker accepted it, with a Redis result backend)
or later and waits for it instead of publishing a second run.

An existing Celery app: :func:`install` adds the generic task to it and binds
the Scheduler, and :func:`schedule_task` then schedules any of its tasks::

    install(celery_app, scheduler)
    schedule_task(send_receipt, (42,), countdown=60, key="receipt:42")   # not apply_async

``install`` also registers the ``"celery"`` executor for the Scheduler (see
:func:`~workers.executors.base.register_executor`), so ``chronoq run`` needs no
option. Retries belong to chronoq (see :mod:`workers.celery.executor`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from celery import Celery

from broker_adapter.results import ReceivedMessage
from scheduler.handles import Call, JobHandle, ScheduledJob
from scheduler.jobcall import JobCall
from scheduler.registry import JobRegistry
from scheduler.scheduler import Scheduler
from workers.celery.executor import CeleryExecutor
from workers.celery.publish import RUN_TASK, TASK_JOB_PREFIX
from workers.celery.redis_backend import BACKEND_PATH
from workers.celery.redis_transport import TRANSPORT_PATH
from workers.context import JobContext, reset_current, run_job, set_current
from workers.executors.base import register_executor

#: Where :func:`celery_app_for` connects when given no URL.
DEFAULT_CELERY_URL = "redis://127.0.0.1:6379/0"
#: Environment variable read for the default URL.
CELERY_URL_ENV = "CHRONOQ_CELERY_BROKER_URL"

_BOUND: weakref.WeakKeyDictionary[Any, Scheduler] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _wall_ms() -> float:
    return time.time() * 1000.0


def run_registered(
    registry: JobRegistry,
    task_id: str,
    job: str,
    args: Iterable[Any],
    kwargs: Mapping[str, Any],
    *,
    due_ms: int | None = None,
    attempt: int = 1,
    topic: str | None = None,
    key: str | None = None,
) -> Any:
    """Run the registered job ``job`` as the body of Celery task ``task_id``.

    :raises JobNotFound: when this worker does not know the job (a Celery failure,
        which chronoq retries: a deploy may bring the job).
    """
    spec = registry.get(job)
    call = JobCall(job, tuple(args), dict(kwargs))
    now = int(_wall_ms())
    message = ReceivedMessage(
        task_id, topic or "", b"", now if due_ms is None else due_ms, now, attempt, b"", key
    )
    token = set_current(JobContext(spec, call, message, None, _wall_ms))
    try:
        return run_job(spec.func, call.args, call.kwargs)
    finally:
        reset_current(token)


def install(
    celery_app: Any, scheduler: Scheduler, *, executor_options: Mapping[str, Any] | None = None
) -> Any:
    """Add the generic task to ``celery_app`` and bind ``scheduler`` to it.

    After this, Celery workers of ``celery_app`` run ``scheduler``'s
    ``executor="celery"`` jobs, :func:`schedule_task` works for the app's tasks,
    and dispatchers built for ``scheduler`` get a :class:`CeleryExecutor`. Outcomes
    need a result backend on ``celery_app`` (or ``{"track_results": False}``); with a
    backend other than Redis, ``task_track_started=True`` lets a redelivery wait for
    a running task rather than publish it again (Redis gets the ``SENT`` state).

    :param executor_options: keyword arguments of that :class:`CeleryExecutor`
        (e.g. ``{"track_results": False}``).
    :returns: the generic Celery task.
    """
    registry = scheduler.registry

    @celery_app.task(  # type: ignore[untyped-decorator]
        name=RUN_TASK,
        bind=True,
        shared=False,  # one per app: several apps in a process must not share it
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def run(
        self: Any,
        job: str,
        args: list[Any],
        kwargs: dict[str, Any],
        due_ms: int | None = None,
        attempt: int = 1,
        topic: str | None = None,
        key: str | None = None,
    ) -> Any:
        return run_registered(
            registry,
            str(self.request.id),
            job,
            args,
            kwargs,
            due_ms=due_ms,
            attempt=attempt,
            topic=topic,
            key=key,
        )

    options = dict(executor_options or {})
    with _LOCK:
        _BOUND[celery_app] = scheduler
    register_executor(scheduler, "celery", lambda: CeleryExecutor(celery_app, **options))
    return run


def celery_app_for(
    scheduler: Scheduler,
    broker_url: str | None = None,
    *,
    result_backend: str | None = None,
    main: str = "chronoq",
    executor_options: Mapping[str, Any] | None = None,
    **conf: Any,
) -> Any:
    """A ready Celery app for ``scheduler``'s jobs, :func:`install`-ed.

    JSON only (never pickle), results in ``result_backend`` (default: the broker
    URL), a 5 s connect timeout so a down broker fails a publish fast instead of
    blocking. ``task_track_started`` stays off (Celery's default): the executor's
    ``SENT`` state already tells a redelivery that a task is in Celery's hands, and
    ``STARTED`` would cost the worker two more result-backend round trips per task.
    A ``redis://`` or ``rediss://`` broker goes through
    :class:`~workers.celery.redis_transport.RedisTransport`, and such a result backend is
    :class:`~workers.celery.redis_backend.RedisResultBackend`: Celery's own, minus a
    throwaway client object per delivery and per ack, and minus a round trip per
    stored result.

    :param broker_url: the Celery broker; default ``$CHRONOQ_CELERY_BROKER_URL`` or
        ``redis://127.0.0.1:6379/0``.
    :param conf: more Celery settings (they win over the defaults above), e.g.
        ``broker_transport_options={"visibility_timeout": 3600}``.
    """
    url = broker_url or os.environ.get(CELERY_URL_ENV) or DEFAULT_CELERY_URL
    backend = result_backend or url
    if _is_redis(backend):
        backend = f"{BACKEND_PATH}+{backend}"
    app = Celery(main, broker=url, backend=backend)
    settings: dict[str, Any] = {
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"socket_connect_timeout": 5},
        "redis_socket_connect_timeout": 5,
    }
    if _is_redis(url):
        settings["broker_transport"] = TRANSPORT_PATH
    settings.update(conf)
    app.conf.update(settings)
    install(app, scheduler, executor_options=executor_options)
    return app


def _is_redis(url: str) -> bool:
    return url.partition("://")[0] in ("redis", "rediss")


def scheduler_of(celery_app: Any) -> Scheduler:
    """The Scheduler :func:`install`-ed on ``celery_app``.

    :raises LookupError: when none was.
    """
    with _LOCK:
        found = _BOUND.get(celery_app)
    if found is None:
        raise LookupError(
            f"no chronoq Scheduler is bound to Celery app {getattr(celery_app, 'main', '?')!r}; "
            "call workers.celery.install(celery_app, scheduler) first"
        )
    return found


def task_job(scheduler: Scheduler, task: Any) -> JobHandle[Any, Any]:
    """The chronoq job ``celery:<task.name>`` that publishes Celery task ``task``
    (registered on first use).

    A task with Celery retries of its own (``autoretry_for``) gets
    ``max_attempts=1``: Celery retries it, chronoq does not (never both).
    """
    name = TASK_JOB_PREFIX + str(task.name)
    with _LOCK:
        if scheduler.registry.find(name) is None:
            own_retries = bool(getattr(task, "autoretry_for", ()))
            scheduler.job(name=name, executor="celery", max_attempts=1 if own_retries else 16)(task)
    return scheduler.handle(name)


def schedule_task(
    task: Any,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    countdown: float | timedelta | None = None,
    eta: datetime | None = None,
    key: str | None = None,
    scheduler: Scheduler | None = None,
) -> ScheduledJob:
    """Run Celery task ``task`` later through chronoq: like ``task.apply_async(args,
    kwargs, countdown=..., eta=...)``, but the timer lives in chronoq, so no Celery
    worker holds it until it is due, and ``key`` makes it cancellable
    (``task_job(scheduler, task).cancel(key=...)``) and idempotent.

    The task is published (``send_task(task.name, args, kwargs, task_id=msg_id)``)
    with its own routing when due.

    :param countdown: seconds (or a timedelta) from now; at most one of this and ``eta``.
    :param eta: an aware datetime.
    :param key: business key: at most one pending run per key.
    :param scheduler: the chronoq Scheduler; by default the one bound to ``task.app``.
    :returns: the :class:`~scheduler.handles.ScheduledJob` receipt (``msg_id`` is the
        Celery task id it will get).
    :raises LookupError: without ``scheduler`` when none is bound to the task's app.
    :raises InvalidSchedule: for both ``countdown`` and ``eta``, a naive ``eta``...
    """
    sched = scheduler if scheduler is not None else scheduler_of(task.app)
    handle = task_job(sched, task)
    call = Call(tuple(args), dict(kwargs or {}), key=key, delay=countdown, at=eta)
    return handle.schedule_many([call])[0]


__all__ = [
    "CELERY_URL_ENV",
    "DEFAULT_CELERY_URL",
    "celery_app_for",
    "install",
    "run_registered",
    "schedule_task",
    "scheduler_of",
    "task_job",
]
