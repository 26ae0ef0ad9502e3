"""Run an app in one process: its broker, a :class:`~workers.dispatcher.Dispatcher`
and the schedule planner, until SIGINT/SIGTERM (``chronoq run module:app``).

Start-up: join the consumer group, store a record for each cron/interval job that
has none (so ``chronoq schedules list`` shows it from the broker alone), arm the
next occurrence of every schedule that is not paused (the cron jobs and the
stored schedules of ``app.schedules``; a paused cron job stays paused across
restarts), run the app's :func:`on_start` hooks, then pull and run jobs. Every
``arm_interval_s`` the schedules are armed again (idempotent: an armed
occurrence is not armed twice), which heals an occurrence lost to a failed send
or to a process that died between storing a schedule and arming it.

Shutdown (SIGTERM, SIGINT, ``stop_event`` or :func:`stop_app`): stop pulling,
let running jobs finish for up to ``drain_timeout_s``, release what still runs
for redelivery, leave the group. A second SIGINT/SIGTERM cuts the drain short.
Nothing is lost either way: a message is acked only after its job succeeded.

Importing this module makes :func:`run_app` what ``app.run()`` calls
(:func:`scheduler.runners.set_app_runner`): the scheduler layer cannot import it.
"""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from scheduler.runners import set_app_runner
from workers.dispatcher import App, Dispatcher
from workers.gc_tuning import tune_gc
from workers.job_metrics import JobMetrics
from workers.schedule_runs import RunLog

_log = logging.getLogger("chronoq.workers.Runner")

F = TypeVar("F", bound=Callable[[], Any])

_HOOKS: weakref.WeakKeyDictionary[Any, list[Callable[[], Any]]] = weakref.WeakKeyDictionary()
_STOPS: weakref.WeakKeyDictionary[Any, threading.Event] = weakref.WeakKeyDictionary()


def on_start(app: App) -> Callable[[F], F]:
    """Register a function (no arguments) that :func:`run_app` calls once the
    dispatcher has joined its group and the cron jobs are armed; for apps that
    drive themselves, e.g. a demo that schedules its first jobs::

        @on_start(app)
        def open_shop() -> None:
            close_order.schedule(1, delay=3, key="order:1")

    An exception in a hook stops the run (after a clean drain) and propagates.
    """

    def register(func: F) -> F:
        _HOOKS.setdefault(app, []).append(func)
        return func

    return register


def stop_app(app: App) -> bool:
    """Ask the :func:`run_app` running ``app`` to stop (from any thread, e.g. a job).

    :returns: ``False`` when ``app`` is not running.
    """
    stop = _STOPS.get(app)
    if stop is None:
        return False
    stop.set()
    return True


def _install_signals(stop: threading.Event, dispatcher: Dispatcher) -> Callable[[], None]:
    """Handle SIGINT/SIGTERM (main thread only); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    seen: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if seen:
            _log.warning("%s again: releasing running jobs now", name)
            dispatcher.hurry()
            return
        seen.append(signum)
        _log.info(
            "%s: stopping (running jobs get up to %g s to finish; again to hurry)",
            name,
            dispatcher.drain_timeout_s,
        )
        stop.set()
        dispatcher.stop()

    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore


def _arm_periodically(app: App, stop: threading.Event, interval_s: float) -> None:
    while not stop.wait(interval_s):
        try:
            armed = app.planner.arm_all()
        except Exception:  # noqa: BLE001 - keep arming; the next round may succeed
            _log.exception("arming schedules failed; retrying in %g s", interval_s)
            continue
        if armed:
            _log.info("armed %d missing schedule occurrence(s)", armed)


def run_app(
    app: App,
    *,
    stop_event: threading.Event | None = None,
    exit_when_idle: bool = False,
    drain_timeout_s: float = 30.0,
    arm_interval_s: float = 30.0,
    dispatcher: Dispatcher | None = None,
    job_metrics: JobMetrics | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    freeze_gc: bool = False,
) -> int:
    """Run ``app``'s dispatcher and schedule planner until stopped; see the module docstring.

    The broker is left open (``app.close()`` closes it), so the caller can still
    inspect it afterwards.

    :param stop_event: set it to stop (tests, embedding); SIGINT/SIGTERM set it too
        when called from the main thread.
    :param exit_when_idle: also stop once nothing is ready, running or pending on
        the app's topics (cron occurrences aside): for batch runs and demos.
    :param drain_timeout_s: how long running jobs may take to finish on stop.
    :param arm_interval_s: how often the schedules are armed again.
    :param dispatcher: a ready-made dispatcher (custom executors); one is built otherwise,
        with a :class:`~workers.schedule_runs.RunLog` and a
        :class:`~workers.job_metrics.JobMetrics` (give yours those hooks to record
        the schedules' last runs and the job metrics and stats, and pass the latter
        as ``job_metrics``).
    :param job_metrics: the :class:`~workers.job_metrics.JobMetrics` hook of ``dispatcher``:
        its gauges read the dispatcher, and it serves ``/metrics`` when a port is set.
    :param metrics_port: serve the job metrics (Prometheus) on this port (0: a free
        one); ``app.settings.metrics_port`` (``CHRONOQ_METRICS_PORT``) by default.
    :param metrics_host: the address to bind; ``app.settings.metrics_host`` by default.
    :param freeze_gc: once the dispatcher joined, freeze the start-up heap
        (:func:`workers.gc_tuning.tune_gc`: shorter GC pauses on the job-start path); a
        whole-process choice, made by ``chronoq run``, which owns its process.
    :raises MissingExtra: with a metrics port but no ``chronoq[metrics]``.
    :raises InvalidArgument: for a non-loopback metrics host without ``CHRONOQ_TOKEN``.
    :returns: messages processed.
    """
    stop = stop_event or threading.Event()
    _STOPS[app] = stop
    if dispatcher is None:  # with the hooks that record last runs, job metrics and stats
        job_metrics = job_metrics or JobMetrics(app)
        dispatcher = Dispatcher(
            app, drain_timeout_s=drain_timeout_s, hooks=[RunLog(app), job_metrics]
        )
    settings = app.settings
    port = settings.metrics_port if metrics_port is None else metrics_port
    if job_metrics is not None:
        job_metrics.watch(dispatcher)
        if port is not None:
            url = job_metrics.serve(port, metrics_host or settings.metrics_host, settings.token)
            _log.info("job metrics on %s", url)
    elif port is not None:
        _log.warning("metrics port %d ignored: the dispatcher given has no JobMetrics hook", port)
    restore = _install_signals(stop, dispatcher)
    armer: threading.Thread | None = None
    try:
        dispatcher.open()
        if freeze_gc:
            tune_gc()
        crons = app.registry.crons()
        if crons:
            app.schedules.publish_decorators()
        armed = app.planner.arm_all()
        if crons or armed:
            _log.info("%d cron job(s); %d schedule occurrence(s) newly armed", len(crons), armed)
        armer = threading.Thread(
            target=_arm_periodically,
            args=(app, stop, arm_interval_s),
            name="chronoq-cron-armer",
            daemon=True,
        )
        armer.start()
        for hook in _HOOKS.get(app, []):
            hook()
        dispatcher.run_forever(stop_event=stop, exit_when_idle=exit_when_idle)
    finally:
        stop.set()
        dispatcher.drain()
        if armer is not None:
            armer.join(timeout=5)
        restore()
        _STOPS.pop(app, None)
        if job_metrics is not None:
            job_metrics.stop_serving()
    return dispatcher.processed


set_app_runner(run_app)

__all__ = ["on_start", "run_app", "stop_app"]
