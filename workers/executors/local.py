"""LocalExecutor: jobs on a bounded thread pool in this process (``executor="local"``).

Importing this module provides the ``local`` kind's factory
(:data:`scheduler.executor_kinds.EXECUTOR_KINDS`): every default dispatcher has one.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from broker_adapter.checks import check_int
from broker_adapter.results import ReceivedMessage
from scheduler.executor_kinds import EXECUTOR_KINDS
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.context import run_job

if TYPE_CHECKING:
    from workers.runs import App

_log = logging.getLogger("chronoq.workers.LocalExecutor")


class JobThreads:
    """Up to ``max_workers`` threads running calls from one queue; each call's
    :class:`~concurrent.futures.Future` is completed in its thread.

    What :class:`~concurrent.futures.ThreadPoolExecutor` does for the dispatcher,
    with less per call (issue 16): no idle semaphore (a Python-level condition
    taken twice per call) and no work-item object. A thread starts when a call
    finds none idle; threads end on :meth:`shutdown`, or after the main thread
    ended and the queue is empty (so an interpreter that exits without a
    shutdown is not held, and a running job still finishes first).

    :param max_workers: most threads.
    :param prefix: thread names are ``prefix_0``, ``prefix_1``...
    """

    def __init__(self, max_workers: int, prefix: str) -> None:
        self._max = max_workers
        self._prefix = prefix
        self._queue: queue.SimpleQueue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call that no submit has claimed
        self._shut = False

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        """Run ``fn(*args)`` on a thread; its future.

        :raises RuntimeError: after :meth:`shutdown`.
        """
        fut: Future[Any] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((fut, fn, args))
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max:
                name = f"{self._prefix}_{len(self._threads)}"
                t = threading.Thread(target=self._work, name=name)
                self._threads.append(t)
                t.start()
        return fut

    def _work(self) -> None:
        get, lock, main = self._queue.get, self._lock, threading.main_thread()
        while True:
            try:
                item = get(timeout=_IDLE_LOOK_S)
            except queue.Empty:
                if main.is_alive():
                    continue
                return  # the interpreter is exiting without a shutdown
            if item is None:
                return
            fut, fn, args = item
            del item
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn(*args)
                except BaseException as e:  # noqa: BLE001 - the future carries it
                    fut.set_exception(e)
                else:
                    fut.set_result(result)
                    result = None
            del fut, fn, args  # hold nothing of a finished call while idle
            with lock:
                self._idle += 1

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new calls, cancel the queued ones, let running ones finish; with
        ``wait``, join the threads."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()


#: How often an idle job thread looks whether the interpreter is exiting, s.
_IDLE_LOOK_S = 1.0


class LocalExecutor:
    """Runs each job on one of ``max_workers`` threads (``executor="local"``).

    The pool's queue is bounded by the dispatcher, which never holds more than
    ``prefetch + max_workers`` jobs. Each job runs in a copy of the submitting
    context, so :func:`workers.current_job` works inside it.

    :param max_workers: threads in the pool (``Settings.max_workers``).
    :param thread_name_prefix: names of the pool's threads.
    :raises InvalidArgument: for ``max_workers`` < 1.
    """

    def __init__(self, max_workers: int = 8, *, thread_name_prefix: str = "chronoq-job") -> None:
        self.max_workers = check_int("max_workers", max_workers)
        self._pool = JobThreads(max_workers, thread_name_prefix)

    @classmethod
    def for_app(cls, app: App) -> LocalExecutor:
        """The ``local`` kind's factory: ``Settings.max_workers`` threads."""
        return cls(app.settings.max_workers)

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`."""
        ctx = contextvars.copy_context()
        return self._pool.submit(ctx.run, (run_job, spec.func, call.args, call.kwargs))

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool; jobs not yet started are cancelled, running ones finish."""
        self._pool.shutdown(wait)

    def __repr__(self) -> str:
        return f"<LocalExecutor max_workers={self.max_workers}>"


EXECUTOR_KINDS.provide("local", LocalExecutor.for_app)

__all__ = ["JobThreads", "LocalExecutor"]
