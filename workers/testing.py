"""ChronoqKit: test an app's timed jobs on a manual clock, without sleeping.

The kit points an app at a ``memory://`` broker and a
:class:`~broker_adapter.clock.ManualClock` (through :meth:`Scheduler.use_broker
<scheduler.Scheduler.use_broker>`, so an app a module built at import works as
is) and runs a real :class:`~workers.dispatcher.Dispatcher` on demand: sync jobs
on its thread pool, ``async def`` jobs on its event loop. Time moves only when
the test says so::

    kit = ChronoqKit(app)                      # or the ``chronoq`` pytest fixture
    close_order.schedule(42, delay=timedelta(minutes=30), key="order:42")
    kit.advance(minutes=29)                    # nothing due yet: nothing runs
    kit.advance(minutes=1)                     # due now: runs, here, before it returns
    assert [r.args for r in kit.ran] == [(42,)]

:meth:`ChronoqKit.advance` steps through every due time on the way (a retry due
10 s after a failure runs within ``advance(minutes=1)``), so each job sees the
clock at its own due time. The pytest fixtures are in :mod:`workers.pytest_plugin`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

from broker_adapter.clock import ManualClock
from broker_adapter.errors import DecodeError, InvalidArgument
from broker_adapter.memory import MemoryBroker
from broker_adapter.results import MessageView, ReceivedMessage
from scheduler import Scheduler
from scheduler.jobcall import JobCall
from workers.context import JobContext
from workers.dispatcher import Dispatcher
from workers.hooks import DispatchHook
from workers.runs import Run
from workers.settlement import Settlement


@dataclass(frozen=True, slots=True)
class JobRun:
    """One attempt of one job, as the kit saw it.

    :param job: the job's name.
    :param args: its positional arguments.
    :param kwargs: its keyword arguments.
    :param msg_id: the message that carried it.
    :param attempt: 1 for the first delivery, 2 for the first retry...
    :param error: what it raised, ``None`` when it returned.
    """

    job: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    msg_id: str
    attempt: int
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the attempt returned without an error."""
        return self.error is None


class RunRecorder(DispatchHook):
    """A dispatch hook that records each job attempt and each dead letter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[JobRun] = []
        self._dead: list[tuple[str, str | None]] = []

    def after_job(self, run: Run, job: JobContext, error: BaseException | None) -> None:
        """Record the attempt (any thread)."""
        call = run.call
        entry = JobRun(job.name, call.args, call.kwargs, job.msg_id, job.attempt, error)
        with self._lock:
            self._runs.append(entry)

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        """Record a message going to the dead-letter topic."""
        if settlement is Settlement.DEAD:
            with self._lock:
                self._dead.append((message.msg_id, job))

    def runs(self) -> list[JobRun]:
        """Every attempt so far, in the order they finished."""
        with self._lock:
            return list(self._runs)

    def dead(self) -> list[tuple[str, str | None]]:
        """``(msg_id, job name)`` of each dead letter so far."""
        with self._lock:
            return list(self._dead)


def _job_name(job: str | Any | None) -> str | None:
    """A job's name from a name or a job handle (anything with ``.name``)."""
    return job if job is None or isinstance(job, str) else str(job.name)


class ChronoqKit:
    """An app on a memory broker and a manual clock, with a dispatcher run on demand.

    :param app: the app under test; bound to ``broker`` and ``clock`` until :meth:`close`.
    :param broker: the broker to use; a new private ``memory://`` one by default
        (closed by :meth:`close`).
    :param clock: the clock; the broker's if it is a ManualClock, else a new one.
    :param group: the dispatcher's consumer group; the app's by default.
    :raises InvalidArgument: for a broker whose clock is not a ManualClock.
    """

    def __init__(
        self,
        app: Scheduler,
        *,
        broker: MemoryBroker | None = None,
        clock: ManualClock | None = None,
        group: str | None = None,
    ) -> None:
        self._own_broker = broker is None
        if broker is None:
            broker = MemoryBroker(clock=clock or ManualClock())
        if clock is None:
            if not isinstance(broker.clock, ManualClock):
                raise InvalidArgument(
                    "ChronoqKit needs a broker on a ManualClock: MemoryBroker(clock=ManualClock())"
                )
            clock = broker.clock
        self.app, self.broker, self.clock = app, broker, clock
        self._group = group
        self._recorder = RunRecorder()
        self._dispatcher: Dispatcher | None = None
        self._topics: set[str] = set()
        self._binding = contextlib.ExitStack()
        self._binding.enter_context(app.use_broker(broker, clock=clock))

    # -- running --------------------------------------------------------------------------

    def _dispatcher_for_now(self) -> Dispatcher:
        """The dispatcher, made anew when jobs on new topics were registered since."""
        topics = self.app.topics()
        if self._dispatcher is None or topics != self._topics:
            if self._dispatcher is not None:
                self._dispatcher.close()
            self._dispatcher = Dispatcher(
                self.app, group=self._group, hooks=[self._recorder], drain_timeout_s=5.0
            )
            self._topics = topics
            self.app.planner.arm_all()
        return self._dispatcher

    def run_until_idle(self, timeout_s: float = 10.0) -> int:
        """Run every job due by the clock (and what they schedule for now) until
        nothing is ready or running; returns the messages processed. Returns at
        ``timeout_s`` of real time even if jobs still run (a job stuck in a loop)."""
        return self._dispatcher_for_now().run_until_idle(timeout_s, idle_ms=5)

    def advance(
        self, seconds: float | timedelta = 0, *, minutes: float = 0, hours: float = 0
    ) -> int:
        """Move the clock forward and run what falls due, stepping through each due
        time on the way (retries and follow-up jobs due within the span run too);
        returns the messages processed.

        :raises InvalidArgument: for a negative span.
        """
        span = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        ms = round((span + 60 * minutes + 3600 * hours) * 1000)
        if ms < 0:
            raise InvalidArgument(f"advance() moves time forward only, got {ms} ms")
        target = self.clock.now_ms() + ms
        done = self.run_until_idle()
        while views := self.broker.pending(end_ms=target + 1, limit=1):
            self.clock.set(max(views[0].deliver_at_ms, self.clock.now_ms()))
            done += self.run_until_idle()
        self.clock.set(target)
        return done + self.run_until_idle()

    async def advance_async(
        self, seconds: float | timedelta = 0, *, minutes: float = 0, hours: float = 0
    ) -> int:
        """:meth:`advance` on a thread, for ``async def`` tests: the test's event loop
        keeps turning while jobs run."""
        return await asyncio.to_thread(self.advance, seconds, minutes=minutes, hours=hours)

    async def run_until_idle_async(self, timeout_s: float = 10.0) -> int:
        """:meth:`run_until_idle` on a thread, for ``async def`` tests."""
        return await asyncio.to_thread(self.run_until_idle, timeout_s)

    # -- looking ---------------------------------------------------------------------------

    @property
    def runs(self) -> list[JobRun]:
        """Every job attempt so far, failed or not, in the order they finished."""
        return self._recorder.runs()

    @property
    def ran(self) -> list[JobRun]:
        """The attempts that returned without an error."""
        return [r for r in self._recorder.runs() if r.ok]

    @property
    def failed(self) -> list[JobRun]:
        """The attempts that raised (each retry is one more)."""
        return [r for r in self._recorder.runs() if not r.ok]

    def pending(self, job: str | Any | None = None, *, limit: int = 10_000) -> list[MessageView]:
        """Messages not yet due, in due order; only those of ``job`` (a name or a job
        handle) if given. Retries waiting for their backoff count."""
        name = _job_name(job)
        views = self.broker.pending(limit=limit)
        if name is None:
            return views
        return [v for v in views if self._job_of(v.msg_id) == name]

    def dead_letters(self, job: str | Any | None = None) -> list[MessageView]:
        """The messages the dispatcher sent to the dead-letter topic (attempts used
        up, unknown job...), oldest first; only those of ``job`` if given."""
        name = _job_name(job)
        out = []
        for msg_id, dead_job in self._recorder.dead():
            view = self.broker.query(msg_id)
            if view is not None and (name is None or dead_job == name):
                out.append(view)
        return out

    def _job_of(self, msg_id: str) -> str | None:
        body = self.broker.body(msg_id)
        try:
            return None if body is None else JobCall.decode(body).name
        except DecodeError:
            return None

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the dispatcher, give the app its broker and clock back, and close the
        broker if the kit made it. Closing twice is harmless."""
        if self._dispatcher is not None:
            self._dispatcher.close()
            self._dispatcher = None
        self._binding.close()
        if self._own_broker:
            self.broker.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["ChronoqKit", "JobRun", "RunRecorder"]
