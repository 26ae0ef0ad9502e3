"""SparkExecutor: ``executor="spark"`` jobs on the process's shared SparkSession.

::

    @app.job(executor="spark", topic="chronoq.spark", timeout=600)
    def nightly(spark: SparkSession, day: str) -> None:
        spark.read.parquet(f"/data/orders/{day}").groupBy("shop").count().write...

The function gets the session (:func:`spark_tasks.session.get_spark`) first. The
``spark`` kind is dedicated (:data:`scheduler.executor_kinds.EXECUTOR_KINDS`):
only the dispatcher of ``chronoq worker --executor spark module:app`` has this
executor (see :mod:`workers.routing`), so only that process starts a JVM.
Importing this module provides the kind's factory (:meth:`SparkExecutor.for_app`).

Each run sets the Spark *job group* of its thread to the message id, with the
description ``chronoq <job> msg=<id> attempt=<n>`` (Spark's UI and logs show
both). When the dispatcher gives up on a run (its ``timeout``, or a shutdown
past the drain time) the job's cancel event is set, and this executor cancels
the run's job group (``SparkContext.cancelJobGroup``): its Spark jobs stop, and
the body's next Spark action raises. Failures are settled by the dispatcher
like any job's: retry per the retry policy, then the dead-letter topic.

Aborts while a job runs: an abort that reaches the broker after the message
fired answers ``ALREADY_DELIVERED`` and changes nothing in the broker, so the
worker would never learn of it. :func:`abort_run` sends the abort and, when it
lost that race, an *abort notice* to :data:`ABORT_TOPIC`; the executor (given
the ``app``) watches that topic and logs every notice with what it found: a
Spark run of that message still going (WARNING: the run continues, since the
message was delivered; write the job idempotently, or check
:attr:`SparkExecutor.late_aborts`), or nothing running here.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from broker_adapter.errors import ChronoqError
from broker_adapter.message import Message
from broker_adapter.results import AbortResult, AbortStatus, ReceivedMessage
from scheduler.executor_kinds import EXECUTOR_KINDS
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from spark_tasks.settings import SparkSettings
from workers.context import JobContext, find_current_job, run_job

if TYPE_CHECKING:
    from scheduler.handles import JobHandle
    from workers.runs import App

_log = logging.getLogger("chronoq.workers.SparkExecutor")

#: Topic of abort notices (aborts that arrived after their message fired).
ABORT_TOPIC = "chronoq.aborts"


def abort_run(
    handle: JobHandle[Any, Any], *, key: str | None = None, msg_id: str | None = None
) -> AbortResult:
    """Cancel a scheduled run like ``handle.cancel``; when it already fired, also send
    an abort notice so the worker running it reports the late abort.

    :returns: the broker's :class:`~broker_adapter.results.AbortResult`.
    :raises InvalidArgument: unless exactly one of ``key`` and ``msg_id`` is given.
    """
    broker = handle.app.broker
    if (key is None) == (msg_id is None):
        from broker_adapter.errors import InvalidArgument

        raise InvalidArgument("abort_run() takes exactly one of key=... or msg_id=...")
    res = broker.abort(msg_id) if msg_id is not None else broker.abort(key=key, topic=handle.topic)
    if res.status is AbortStatus.ALREADY_DELIVERED and res.msg_id is not None:
        notice = {"msg_id": res.msg_id, "job": handle.name, "key": key, "topic": handle.topic}
        broker.send(Message(ABORT_TOPIC, json.dumps(notice).encode()))
    return res


class _Running:
    __slots__ = ("group", "job", "name", "spark_cancelled")

    def __init__(self, name: str, group: str, job: JobContext | None) -> None:
        self.name = name
        self.group = group
        self.job = job
        self.spark_cancelled = False


class SparkExecutor:
    """Runs Spark jobs on the shared session, ``max_concurrent`` at a time.

    :param app: the app; needed to watch abort notices (``None``: no watching).
    :param session: returns the SparkSession; by default
        :func:`spark_tasks.session.get_spark` with ``settings``.
    :param settings: where the Spark master comes from; by default
        :meth:`SparkSettings.from_env <spark_tasks.settings.SparkSettings.from_env>`
        (``CHRONOQ_SPARK_MASTER``).
    :param max_concurrent: Spark jobs run at once (threads submitting to the session).
    :param stop_session: stop the shared session on :meth:`shutdown`.
    :param watch_interval_s: how often cancel events and abort notices are checked.
    """

    def __init__(
        self,
        app: App | None = None,
        *,
        session: Callable[[], Any] | None = None,
        settings: SparkSettings | None = None,
        max_concurrent: int = 2,
        stop_session: bool = True,
        watch_interval_s: float = 0.1,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent!r}")
        self.app = app
        self.settings = settings
        self._session = session or self._default_session
        self._pool = ThreadPoolExecutor(max_concurrent, thread_name_prefix="chronoq-spark")
        self._stop_session = stop_session
        self._interval = watch_interval_s
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        #: ``(msg_id, job name)`` of runs an abort notice reached while they ran.
        self.late_aborts: list[tuple[str, str]] = []
        #: Job groups cancelled after a timeout or shutdown.
        self.cancelled_groups: list[str] = []

    @classmethod
    def for_app(cls, app: App) -> SparkExecutor:
        """The ``spark`` kind's factory: an executor watching ``app``'s abort notices,
        its session already starting (:meth:`warm_up`)."""
        executor = cls(app)
        executor.warm_up()
        return executor

    def warm_up(self) -> threading.Thread:
        """Start the session on a background thread now, so the JVM's start (~5 s)
        overlaps the dispatcher's and does not make the first Spark job late."""

        def start() -> None:
            try:
                self._session()
            except Exception:  # noqa: BLE001 - the first job will raise it again
                _log.exception("starting the SparkSession failed")

        thread = threading.Thread(target=start, name="chronoq-spark-warm-up", daemon=True)
        thread.start()
        return thread

    def _default_session(self) -> Any:
        from spark_tasks.session import get_spark

        return get_spark(self.settings)

    # -- the Executor protocol ---------------------------------------------------------

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`."""
        self._ensure_watcher()
        ctx = contextvars.copy_context()
        running = _Running(spec.name, message.msg_id, find_current_job())
        return self._pool.submit(ctx.run, self._run, spec, call, message, running)

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking jobs, cancel the job groups still running, stop the watcher
        and (with ``stop_session``) the shared session."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            left = list(self._running.values())
        for run in left:
            self._cancel_group(run, "the executor is shutting down")
        self._pool.shutdown(wait=wait)
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        if self._stop_session:
            from spark_tasks.session import stop_spark

            stop_spark()

    # -- running -----------------------------------------------------------------------

    def _run(self, spec: JobSpec, call: JobCall, message: ReceivedMessage, run: _Running) -> Any:
        spark = self._session()
        sc = spark.sparkContext
        description = f"chronoq {spec.name} msg={message.msg_id} attempt={message.attempts}"
        sc.setJobGroup(run.group, description, interruptOnCancel=True)
        with self._lock:
            self._running[run.group] = run
        try:
            if run.job is not None and run.job.is_cancelled():
                raise RuntimeError(f"{description}: cancelled before it started")
            return run_job(spec.func, (spark, *call.args), call.kwargs)
        finally:
            with self._lock:
                self._running.pop(run.group, None)
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)

    def _cancel_group(self, run: _Running, why: str) -> None:
        if run.spark_cancelled:
            return
        run.spark_cancelled = True
        _log.warning("job %s msg=%s: cancelling its Spark job group (%s)", run.name, run.group, why)
        self.cancelled_groups.append(run.group)
        try:
            self._session().sparkContext.cancelJobGroup(run.group)
        except Exception:  # noqa: BLE001 - a stopped context has nothing left to cancel
            _log.exception("cancelling Spark job group %s failed", run.group)

    # -- watching: cancel events and abort notices -------------------------------------

    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            with self._lock:
                if self._watcher is None:
                    self._watcher = threading.Thread(
                        target=self._watch, name="chronoq-spark-watch", daemon=True
                    )
                    self._watcher.start()

    def _watch(self) -> None:
        consumer = None
        if self.app is not None:
            try:
                group = f"{self.app.settings.group}.spark-aborts"
                consumer = self.app.broker.consumer(group, [ABORT_TOPIC])
            except ChronoqError as e:
                _log.warning("not watching abort notices: %s", e)
        try:
            while not self._stop.is_set():
                with self._lock:
                    runs = list(self._running.values())
                for run in runs:
                    if run.job is not None and run.job.is_cancelled():
                        self._cancel_group(run, run.job.cancel_reason or "cancelled")
                if consumer is None:
                    self._stop.wait(self._interval)
                    continue
                try:
                    notices = consumer.pull(32, int(self._interval * 1000))
                except ChronoqError:
                    return  # broker closed under us: shutting down
                for n in notices:
                    self._on_notice(n)
                    consumer.ack(n)
        finally:
            if consumer is not None:
                try:
                    consumer.close()
                except ChronoqError:
                    pass

    def _on_notice(self, n: ReceivedMessage) -> None:
        try:
            notice = json.loads(n.body)
            msg_id = str(notice["msg_id"])
        except (ValueError, KeyError, TypeError):
            _log.warning("ignoring a malformed abort notice msg=%s", n.msg_id)
            return
        with self._lock:
            run = self._running.get(msg_id)
        if run is not None:
            self.late_aborts.append((msg_id, run.name))
            _log.warning(
                "job %s msg=%s: an abort arrived while it runs on Spark (key %s); it was "
                "already delivered, so the run goes on: its body must be idempotent",
                run.name,
                msg_id,
                notice.get("key"),
            )
        else:
            _log.info(
                "abort notice for msg=%s (job %s): no Spark run of it here (already "
                "finished, or running on another worker)",
                msg_id,
                notice.get("job"),
            )

    def __repr__(self) -> str:
        return f"<SparkExecutor running={len(self._running)}>"


EXECUTOR_KINDS.provide("spark", SparkExecutor.for_app)

__all__ = ["ABORT_TOPIC", "SparkExecutor", "abort_run"]
