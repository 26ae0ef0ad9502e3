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


#: What a call queued with :meth:`JobThreads.start` reports when it ends:
#: ``done(started, result, error)``; ``started`` is ``False`` when it was cancelled
#: before it started (``result`` and ``error`` are then ``None``).
Done = Callable[[bool, Any, BaseException | None], None]


class QueuedCall:
    """A call queued on :class:`JobThreads` without a :class:`~concurrent.futures.Future`
    (:meth:`JobThreads.start`): it reports its end to its ``done`` callback.

    Exactly one of :meth:`run` (a pool thread) and :meth:`cancel` (any thread) takes
    it, whichever pops its one claim token first (``list.pop`` is atomic in
    CPython: the FAQ's "What kinds of global value mutation are thread-safe?"), so
    no lock is taken per call. Once taken it drops its function, arguments and
    callback: it holds nothing of a finished job.

    :param fn: what to call.
    :param args: its arguments.
    :param done: told how it ended, in the thread that ran (or cancelled) it.
    """

    __slots__ = ("_claim", "args", "done", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> None:
        self.fn: Callable[..., Any] | None = fn
        self.args: tuple[Any, ...] = args
        self.done: Done | None = done
        self._claim = [True]

    def _take(self) -> Done | None:
        """The callback, for the one caller that takes the call; ``None`` for the other."""
        try:
            self._claim.pop()
        except IndexError:
            return None
        done = self.done
        self.done = None
        return done

    def cancel(self) -> bool:
        """Cancel the call unless it started (or was cancelled); whether it was.
        Its callback is told here, in the calling thread."""
        done = self._take()
        if done is None:
            return False
        self.fn, self.args = None, ()
        _report(done, False, None, None)
        return True

    def run(self, *, here: bool = False) -> None:
        """Run the call and report its end, unless it was cancelled.

        :param here: run in a thread that is not the pool's (the dispatcher's, running
            a job itself: :mod:`workers.inline_runs`): an exception that is not an
            :class:`Exception` (``KeyboardInterrupt``, ``SystemExit``) is reported as
            the job's error and then raised again, so that it still stops that thread.
        """
        done = self._take()
        fn, args = self.fn, self.args
        self.fn, self.args = None, ()
        if done is None or fn is None:
            return
        try:
            result = fn(*args)
        except BaseException as e:  # reported to the callback
            _report(done, True, None, e)
            if here and not isinstance(e, Exception):
                raise
        else:
            _report(done, True, result, None)


def _report(done: Done, started: bool, result: Any, error: BaseException | None) -> None:
    try:
        done(started, result, error)
    except Exception:  # noqa: BLE001 - as a Future's done callback: logged, the thread goes on
        _log.exception("done callback %r raised", done)


def _ignore(started: bool, result: Any, error: BaseException | None) -> None:
    """A done callback for a call whose end matters to no one."""


class _FutureCall:
    """A call queued with :meth:`JobThreads.submit`: completes its future."""

    __slots__ = ("args", "fn", "future")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.future = future
        self.fn = fn
        self.args = args

    def cancel(self) -> bool:
        return self.future.cancel()

    def run(self) -> None:
        fut = self.future
        if fut.set_running_or_notify_cancel():
            try:
                result = self.fn(*self.args)
            except BaseException as e:  # noqa: BLE001 - the future carries it
                fut.set_exception(e)
            else:
                fut.set_result(result)


class JobThreads:
    """Up to ``max_workers`` threads running calls from one queue.

    What :class:`~concurrent.futures.ThreadPoolExecutor` does for the dispatcher,
    with less per call (issue 16): no idle semaphore (a Python-level condition
    taken twice per call) and no work-item object; and with :meth:`start`, no
    future either (a future takes its condition about eight times per call, and
    its done callback made a reference cycle with the dispatcher's run, left to
    the cyclic GC). A thread starts when a call finds none idle; threads end on
    :meth:`shutdown`, or after the main thread ended and the queue is empty (so an
    interpreter that exits without a shutdown is not held, and a running job
    still finishes first).

    :param max_workers: most threads.
    :param prefix: thread names are ``prefix_0``, ``prefix_1``...
    """

    def __init__(self, max_workers: int, prefix: str) -> None:
        self._max = max_workers
        self._prefix = prefix
        self._queue: queue.SimpleQueue[QueuedCall | _FutureCall | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call that no submit has claimed
        self._shut = False

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        """Run ``fn(*args)`` on a thread; its future.

        :raises RuntimeError: after :meth:`shutdown`.
        """
        fut: Future[Any] = Future()
        self._put(_FutureCall(fut, fn, args))
        return fut

    def start(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> QueuedCall:
        """Run ``fn(*args)`` on a thread and call ``done(started, result, error)`` in it
        when it ends (or in the cancelling thread when it is cancelled first, with
        ``started`` false); the queued call, to :meth:`QueuedCall.cancel` it.

        :raises RuntimeError: after :meth:`shutdown`.
        """
        call = QueuedCall(fn, args, done)
        self._put(call)
        return call

    def check_open(self) -> None:
        """:raises RuntimeError: after :meth:`shutdown`."""
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def queue(self, call: QueuedCall) -> None:
        """Queue a call built elsewhere (:meth:`LocalExecutor.prepare_job`).

        :raises RuntimeError: after :meth:`shutdown`.
        """
        self._put(call)

    def _put(self, call: QueuedCall | _FutureCall) -> None:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put(call)
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max:
                name = f"{self._prefix}_{len(self._threads)}"
                t = threading.Thread(target=self._work, name=name)
                self._threads.append(t)
                t.start()

    def _work(self) -> None:
        get, lock, main = self._queue.get, self._lock, threading.main_thread()
        while True:
            try:
                call = get(timeout=_IDLE_LOOK_S)
            except queue.Empty:
                if main.is_alive():
                    continue
                return  # the interpreter is exiting without a shutdown
            if call is None:
                return
            call.run()
            del call  # hold nothing of a finished call while idle
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
                call = self._queue.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call.cancel()
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

    def start_job(
        self, spec: JobSpec, call: JobCall, message: ReceivedMessage, done: Done
    ) -> QueuedCall:
        """:meth:`submit` without a future, for the dispatcher (issue 16): ``done(started,
        result, error)`` is called in the job's thread when it ends, or with
        ``started`` false in the cancelling thread if it is cancelled first.

        :returns: the queued call (``cancel()`` it before it starts).
        :raises RuntimeError: when the executor is shut down.
        """
        ctx = contextvars.copy_context()
        return self._pool.start(ctx.run, (run_job, spec.func, call.args, call.kwargs), done)

    def prepare_job(
        self, spec: JobSpec, call: JobCall, message: ReceivedMessage, done: Done
    ) -> QueuedCall:
        """:meth:`start_job`'s call without queueing it: for a dispatcher thread that runs
        the job itself (:meth:`QueuedCall.run` with ``here``, see :mod:`workers.inline_runs`).

        :raises RuntimeError: when the executor is shut down.
        """
        self._pool.check_open()
        ctx = contextvars.copy_context()
        return QueuedCall(ctx.run, (run_job, spec.func, call.args, call.kwargs), done)

    def queue(self, call: QueuedCall) -> None:
        """Queue a call made by :meth:`prepare_job` after all (its thread could not run it).

        :raises RuntimeError: when the executor is shut down.
        """
        self._pool.queue(call)

    def occupy(self, until: threading.Event) -> None:
        """Keep one of the pool's threads waiting until ``until`` is set: a job run
        outside the pool (:mod:`workers.inline_runs`) takes a thread's place.

        :raises RuntimeError: when the executor is shut down.
        """
        self._pool.start(until.wait, (), _ignore)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool; jobs not yet started are cancelled, running ones finish."""
        self._pool.shutdown(wait)

    def __repr__(self) -> str:
        return f"<LocalExecutor max_workers={self.max_workers}>"


EXECUTOR_KINDS.provide("local", LocalExecutor.for_app)

__all__ = ["Done", "JobThreads", "LocalExecutor", "QueuedCall"]
