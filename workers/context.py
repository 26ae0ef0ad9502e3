"""What a running job can see about itself: :func:`current_job` and :class:`JobContext`.

Python threads cannot be killed, so a job that runs over its ``timeout`` (or
that is still running when the worker shuts down) is *asked* to stop: the
dispatcher settles its message (nack or release) at once and sets the job's
cancel event. A long job should look at it between steps::

    @app.job(timeout=30)
    def export(day: str) -> None:
        job = current_job()
        for chunk in chunks(day):
            job.raise_if_cancelled()        # raises JobCancelled once cancelled
            write(chunk)

or wait on it instead of sleeping (``job.cancelled.wait(5)``). An ``async def``
job is cancelled for real: its executor registers a callback
(:meth:`JobContext.on_cancel`) that cancels its task, so the job sees
:class:`asyncio.CancelledError` at its next ``await``. Whatever the job
does after its cancellation is ignored: the message was already retried or
released, so the job body must be idempotent (delivery is at least once).

The context lives in a :mod:`contextvars` variable. The dispatcher sets it while
it submits the job, and executors run the job in a copy of the submitting
context (as :func:`asyncio.to_thread` does), so :func:`current_job` works in the
job's own thread without widening the executor interface.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from types import CoroutineType
from typing import Any

from broker_adapter.errors import ChronoqError
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec


class JobCancelled(ChronoqError):
    """Raised by :meth:`JobContext.raise_if_cancelled` once the job was cancelled.

    :param name: the job's name.
    :param why: why it was cancelled (a timeout, a shutdown).
    """

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.why = why
        super().__init__(f"job {name!r} was cancelled: {why}")


class JobTimeout(ChronoqError, TimeoutError):
    """A job ran longer than its ``timeout``; recorded as the failure reason.

    :param name: the job's name.
    :param timeout_s: its timeout in seconds.
    """

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        super().__init__(
            f"job {name!r} ran over its timeout of {timeout_s:g} s; it was asked to stop "
            "(see workers.current_job().cancelled)"
        )


class JobContext:
    """One attempt of one job, as its body sees it through :func:`current_job`.

    :param spec: the job's spec.
    :param call: the decoded call (name and arguments).
    :param message: the broker message that carried it (``msg_id``, ``attempts``...).
    :param fire_ms: for a cron run, the occurrence it stands for (epoch ms); else ``None``.
    :param clock_ms: the dispatcher's clock, read when the job starts.
    """

    __slots__ = (
        "_cancelled",
        "_clock_ms",
        "_on_cancel",
        "call",
        "cancel_reason",
        "fire_ms",
        "message",
        "spec",
        "started_mono",
        "started_ms",
    )

    def __init__(
        self,
        spec: JobSpec,
        call: JobCall,
        message: ReceivedMessage,
        fire_ms: int | None,
        clock_ms: Callable[[], float],
    ) -> None:
        self.spec = spec
        self.call = call
        self.message = message
        self.fire_ms = fire_ms
        self._clock_ms = clock_ms
        # Made on first use (see cancelled): most jobs are never cancelled nor asked.
        self._cancelled: threading.Event | None = None
        #: Why it was cancelled, once it is.
        self.cancel_reason: str | None = None
        #: ``time.monotonic()`` when the body started, ``None`` while queued.
        self.started_mono: float | None = None
        #: The dispatcher clock's time (epoch ms) when the body started.
        self.started_ms: float | None = None
        self._on_cancel: Callable[[str], None] | None = None

    @property
    def cancelled(self) -> threading.Event:
        """Set when the job should stop (timeout or shutdown); wait on it or poll it."""
        event = self._cancelled
        if event is None:
            with _EVENT_LOCK:  # one Event per job, whichever thread asks first
                event = self._cancelled
                if event is None:
                    event = self._cancelled = threading.Event()
        return event

    @property
    def name(self) -> str:
        """The job's name."""
        return self.spec.name

    @property
    def msg_id(self) -> str:
        """The id of the message being processed: the idempotency key downstream."""
        return self.message.msg_id

    @property
    def attempt(self) -> int:
        """Which delivery this is, 1 on the first."""
        return self.message.attempts

    @property
    def due_ms(self) -> int:
        """When this run was due, epoch ms: the cron occurrence, else the message's due time."""
        return self.fire_ms if self.fire_ms is not None else self.message.deliver_at_ms

    def is_cancelled(self) -> bool:
        """Whether the job was asked to stop."""
        event = self._cancelled
        return event is not None and event.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`JobCancelled` if the job was asked to stop; else do nothing.

        :raises JobCancelled: once cancelled.
        """
        if self.is_cancelled():
            raise JobCancelled(self.spec.name, self.cancel_reason or "cancelled")

    def cancel(self, reason: str) -> None:
        """Ask the job to stop (the dispatcher does this; jobs only read it), and call
        the callback given to :meth:`on_cancel`, if any."""
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()
        callback = self._on_cancel
        if callback is not None:
            callback(reason)

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        """Have :meth:`cancel` also call ``callback(reason)`` (an executor that can stop
        the job for real registers one, e.g. to cancel an asyncio task); called at
        once when the job was already cancelled. One callback per job: a second call
        replaces the first.

        The callback may run in any thread and more than once (a cancel racing this
        registration), so it must be idempotent, quick and must not raise.
        """
        self._on_cancel = callback
        if self.is_cancelled():
            callback(self.cancel_reason or "cancelled")

    def mark_started(self) -> None:
        """Record that the body starts now (executors call this in the job's thread)."""
        self.started_mono = time.monotonic()
        self.started_ms = self._clock_ms()

    def __repr__(self) -> str:
        return (
            f"<JobContext {self.spec.name} msg={self.message.msg_id} "
            f"attempt={self.message.attempts}>"
        )


# Guards the first creation of a job's cancel event (JobContext.cancelled).
_EVENT_LOCK = threading.Lock()

_CURRENT: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "chronoq_current_job", default=None
)


def current_job() -> JobContext:
    """The context of the job running in this thread.

    :raises RuntimeError: outside a job run by a dispatcher (e.g. when the job
        function is called directly); use :func:`find_current_job` to get ``None``.
    """
    job = _CURRENT.get()
    if job is None:
        raise RuntimeError(
            "current_job() is only available inside a job run by a chronoq dispatcher; "
            "use workers.find_current_job() where the function may also be called directly"
        )
    return job


def find_current_job() -> JobContext | None:
    """The context of the job running in this thread, or ``None`` outside one."""
    return _CURRENT.get()


class CoroutineNotAwaited(ChronoqError, TypeError):
    """A job run by an executor of plain functions returned a coroutine: it would be
    counted a success without running (its function is a plain ``def`` that returns
    a coroutine, e.g. an async function wrapped by a sync decorator).

    :param name: the job function's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"job function {name} returned a coroutine, which was not run; make it an "
            "async def function (it then runs on the dispatcher's event loop, "
            "executor='async'), or await the coroutine inside it"
        )


def run_job(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Call ``func(*args, **kwargs)`` as a job body: marks the start time first.

    Executors that run the body in this process call it inside a copy of the
    submitting context (see the module docstring).

    :raises CoroutineNotAwaited: when the call returns a coroutine (it is closed).
    """
    job = _CURRENT.get()
    if job is not None:
        job.mark_started()
    result = func(*args, **kwargs)
    if type(result) is CoroutineType:
        result.close()
        raise CoroutineNotAwaited(getattr(func, "__qualname__", repr(func)))
    return result


async def run_async_job(
    func: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Any:
    """Await ``func(*args, **kwargs)`` as a job body: marks the start time first.

    The async counterpart of :func:`run_job`, for executors that run coroutine
    functions on an event loop (in a task whose context is the submitting one's copy).
    """
    job = _CURRENT.get()
    if job is not None:
        job.mark_started()
    return await func(*args, **kwargs)


def set_current(job: JobContext | None) -> contextvars.Token[JobContext | None]:
    """Make ``job`` the current job of this context; returns the token to reset it."""
    return _CURRENT.set(job)


def reset_current(token: contextvars.Token[JobContext | None]) -> None:
    """Undo :func:`set_current`."""
    _CURRENT.reset(token)


__all__ = [
    "CoroutineNotAwaited",
    "JobCancelled",
    "JobContext",
    "JobTimeout",
    "current_job",
    "find_current_job",
    "reset_current",
    "run_async_job",
    "run_job",
    "set_current",
]
