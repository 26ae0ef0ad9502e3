"""EventLoopExecutor: ``async def`` jobs on one event loop in this process
(``executor="async"``, the default for a coroutine function).

One loop, in one thread the executor owns (started with the first job), runs
every async job of the dispatcher as a task: a thousand jobs awaiting I/O cost a
thousand tasks, not a thousand threads. Each task runs in a copy of the
submitting :mod:`contextvars` context, so :func:`workers.current_job` works in
it. The dispatcher's bounds, retries, dead letters and timeouts apply as for
sync jobs; a cancelled job (timeout, shutdown) is cancelled for real: its task
gets :class:`asyncio.CancelledError` at its next ``await`` (the job context's
:meth:`~workers.context.JobContext.on_cancel` callback).

A finished job's future is completed on a thread of its own, not on the loop: the
dispatcher settles the message in that future's callbacks (an ack is a network
round trip on ``redis://`` or ``chronoq://``), which must not stall the other jobs.

A blocking call in an async job stalls every other one: a
:class:`~workers.executors.loop_watchdog.LoopWatchdog` logs one WARNING per
stall longer than ``blocked_warn_s`` (``CHRONOQ_ASYNC_BLOCKED_MS``, default
100 ms), naming the job whose step blocks.

Importing this module provides the ``async`` kind's factory
(:data:`scheduler.executor_kinds.EXECUTOR_KINDS`): every default dispatcher has one.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from broker_adapter.results import ReceivedMessage
from scheduler.errors import InvalidSettings
from scheduler.executor_kinds import ASYNC_KIND, EXECUTOR_KINDS
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.context import JobCancelled, JobContext, JobTimeout, find_current_job, run_async_job
from workers.executors.loop_watchdog import DEFAULT_BLOCKED_WARN_S, LoopWatchdog

if TYPE_CHECKING:
    from workers.runs import App

_log = logging.getLogger("chronoq.workers.EventLoopExecutor")

#: The variable of the blocked-loop threshold, in ms.
BLOCKED_MS_ENV = EXECUTOR_KINDS.get(ASYNC_KIND).env_prefix + "BLOCKED_MS"
#: On shutdown, how long cancelled tasks get to finish before the loop closes, s.
SHUTDOWN_GRACE_S = 5.0


class EventLoopExecutor:
    """Runs each ``async def`` job as a task on one event loop (``executor="async"``).

    :param blocked_warn_s: a loop that does not turn for this long (a blocking call
        in a job) gets one WARNING naming the job, s.
    :param thread_name: the name of the loop's thread.
    :raises ValueError: for ``blocked_warn_s`` <= 0.
    """

    def __init__(
        self,
        *,
        blocked_warn_s: float = DEFAULT_BLOCKED_WARN_S,
        thread_name: str = "chronoq-event-loop",
    ) -> None:
        if not blocked_warn_s > 0:
            raise ValueError(f"blocked_warn_s must be > 0, got {blocked_warn_s!r}")
        self.blocked_warn_s = blocked_warn_s
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: LoopWatchdog | None = None
        self._jobs: dict[asyncio.Task[Any], JobContext | None] = {}  # on the loop only
        # One thread completes the jobs' futures, so settling never runs on the loop.
        self._settler = ThreadPoolExecutor(1, thread_name_prefix=f"{thread_name}-settle")
        self._closed = False

    @classmethod
    def for_app(cls, app: App) -> EventLoopExecutor:
        """The ``async`` kind's factory; reads ``CHRONOQ_ASYNC_BLOCKED_MS``.

        :raises InvalidSettings: for a value that is not a whole number > 0.
        """
        raw = os.environ.get(BLOCKED_MS_ENV)
        if raw is None:
            return cls()
        try:
            ms = int(raw)
        except ValueError:
            ms = 0
        if ms <= 0:
            why = "must be a whole number of ms > 0, e.g. 100"
            raise InvalidSettings("blocked_ms", BLOCKED_MS_ENV, raw, why)
        return cls(blocked_warn_s=ms / 1000)

    @property
    def watchdog(self) -> LoopWatchdog | None:
        """The watchdog of the loop, once the first job started it."""
        return self._watchdog

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`; the job's function must
        be a coroutine function (the ``async`` kind checks it at decoration).

        :raises RuntimeError: when the executor is shut down.
        """
        if self._closed:
            raise RuntimeError("the async executor is shut down")
        loop = self._loop or self._start()
        fut: Future[Any] = Future()
        ctx = contextvars.copy_context()
        loop.call_soon_threadsafe(self._begin, ctx, spec, call, fut)
        return fut

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the async executor is shut down")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._watchdog = LoopWatchdog(loop, self.blocked_warn_s, self._describe, _log)
                self._thread = threading.Thread(
                    target=self._run, args=(loop,), name=self._thread_name, daemon=True
                )
                self._thread.start()
                self._watchdog.start()
                self._loop = loop
            return self._loop

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's thread: run until :meth:`shutdown`, then cancel what is left."""
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel("the async executor is shutting down")
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def _begin(
        self, ctx: contextvars.Context, spec: JobSpec, call: JobCall, fut: Future[Any]
    ) -> None:
        """Start the job's task (on the loop), unless its future was cancelled first."""
        if not fut.set_running_or_notify_cancel():
            return  # cancelled while queued (a drain): it never starts
        loop = asyncio.get_running_loop()
        job = ctx.run(find_current_job)
        coro = run_async_job(spec.func, call.args, call.kwargs)
        task = loop.create_task(coro, name=f"chronoq job {spec.name}", context=ctx)
        self._jobs[task] = job
        if job is not None:
            job.on_cancel(partial(self._cancel_task, loop, task))
        task.add_done_callback(partial(self._end, spec, job, fut))

    @staticmethod
    def _cancel_task(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], reason: str) -> None:
        """A job context's cancel callback (any thread): cancel its task on the loop."""
        try:
            loop.call_soon_threadsafe(task.cancel, reason)
        except RuntimeError:  # the loop is closed: the task ended with it
            pass

    def _end(
        self,
        spec: JobSpec,
        job: JobContext | None,
        fut: Future[Any],
        task: asyncio.Task[Any],
    ) -> None:
        """The task ended (on the loop): complete the job's future."""
        self._jobs.pop(task, None)
        if task.cancelled():
            # Cancelled by the dispatcher (timeout, drain: the run is settled already)
            # or by itself; settled as the sync job's would be.
            reason = job.cancel_reason if job is not None else None
            if reason == "timeout" and spec.timeout is not None:
                self._complete(fut.set_exception, JobTimeout(spec.name, spec.timeout))
            else:
                why = reason or "its task was cancelled"
                self._complete(fut.set_exception, JobCancelled(spec.name, why))
            return
        error = task.exception()
        if error is not None:
            self._complete(fut.set_exception, error)
        else:
            self._complete(fut.set_result, task.result())

    def _complete(self, setter: Any, value: Any) -> None:
        """Complete a job's future off the loop (its callbacks settle the message)."""
        try:
            self._settler.submit(setter, value)
        except RuntimeError:  # shut down (a task cancelled by the loop's stop): here
            setter(value)

    def _describe(self, task: asyncio.Task[Any] | None) -> str:
        """The job a task runs, for the watchdog's warning (its thread)."""
        job = None if task is None else self._jobs.get(task)
        if job is None:
            return "no job's task (a callback on the loop)" if task is None else task.get_name()
        return f"job {job.name} msg={job.msg_id}"

    def shutdown(self, wait: bool = True) -> None:
        """Stop the loop: tasks still running are cancelled (the dispatcher's drain
        released their messages first); with ``wait``, wait for the loop's thread."""
        with self._lock:
            self._closed = True
            loop, thread, watchdog = self._loop, self._thread, self._watchdog
        if watchdog is not None:
            watchdog.stop()
        if loop is not None:
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # already closed
                pass
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()
        self._settler.shutdown(wait=wait)  # after the loop: its last completions go through

    def __repr__(self) -> str:
        return f"<EventLoopExecutor blocked_warn_s={self.blocked_warn_s:g}>"


EXECUTOR_KINDS.provide(ASYNC_KIND, EventLoopExecutor.for_app)

__all__ = ["BLOCKED_MS_ENV", "SHUTDOWN_GRACE_S", "EventLoopExecutor"]
