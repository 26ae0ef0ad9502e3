"""The shapes the dispatcher works with: the app it serves (:class:`App`, i.e. a
:class:`scheduler.Scheduler`), its schedule planner, and one message's :class:`Run`."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import Clock
from broker_adapter.results import ReceivedMessage
from scheduler.cron import Firing
from scheduler.jobcall import JobCall
from scheduler.registry import JobRegistry
from scheduler.settings import Settings
from scheduler.spec import CronSpec, JobSpec
from workers.context import JobContext
from workers.executors.base import Handoff
from workers.executors.local import QueuedCall


class CronPlanner(Protocol):
    """What the dispatcher and runner need of ``app.planner``
    (:class:`scheduler.cron.CronPlanner`)."""

    def fire(
        self,
        name: str,
        fire_ms: int,
        now_ms: int,
        *,
        topic: str,
        body: bytes,
        stored: bool,
        redelivery: bool = False,
    ) -> Firing | None:
        """Check a delivered occurrence, arm the next one, say what to run."""
        ...

    def arm_all(self, now_ms: int | None = None) -> int:
        """Arm every schedule's next occurrence; how many were newly armed."""
        ...


class ScheduleBook(Protocol):
    """What the runner needs of ``app.schedules`` (:class:`scheduler.schedules.Schedules`)."""

    def publish_decorators(self) -> int:
        """Store a record for each cron job that has none; how many were written."""
        ...


class App(Protocol):
    """What the dispatcher needs of a :class:`scheduler.Scheduler`."""

    @property
    def registry(self) -> JobRegistry: ...
    @property
    def broker(self) -> BrokerAdapter: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def planner(self) -> CronPlanner: ...
    @property
    def schedules(self) -> ScheduleBook: ...
    def topics(self) -> set[str]: ...


class Run:
    """The processing of one message: one job run, or a schedule occurrence's runs
    (the occurrences the misfire policy keeps, one after the other, each with its
    own :class:`JobContext`).

    :param message: the pulled message.
    :param spec: the job's spec.
    :param call: the decoded call.
    :param job: the context of its first (or only) job.
    :param cron: for a schedule's occurrence, the schedule (``cron.name``: its name).
    :param occurrences: for a schedule's occurrence, the occurrences to run (epoch ms,
        in order).
    """

    __slots__ = (
        "_claim",
        "call",
        "cron",
        "future",
        "job",
        "message",
        "occurrences",
        "queued",
        "settled",
        "spec",
    )

    def __init__(
        self,
        message: ReceivedMessage,
        spec: JobSpec,
        call: JobCall,
        job: JobContext,
        cron: CronSpec | None = None,
        occurrences: Sequence[int] = (),
    ) -> None:
        self.message = message
        self.spec = spec
        self.call = call
        self.cron = cron
        self.occurrences = occurrences
        #: Whether its message is settled (set once, by whoever claims it).
        self.settled = False
        self._claim = [True]  # popped by the one claimer (see take_claim)
        #: The context of the job that runs (or ran last).
        self.job = job
        #: The executor's future of the current job, once submitted.
        self.future: Future[Any] | None = None
        #: Or, on an executor that runs it without a future
        #: (:meth:`~workers.executors.local.LocalExecutor.start_job`), its queued call.
        self.queued: QueuedCall | None = None

    def take_claim(self) -> bool:
        """Take the one right to settle this run's message: ``True`` for the first
        caller only, from any thread and without a lock (``list.pop`` is atomic in
        CPython), so a job's end claims its run without a lock round trip; then
        :attr:`settled` is set."""
        if self.settled:
            return False
        try:
            self._claim.pop()
        except IndexError:
            return False
        self.settled = True
        return True

    def next_fire_ms(self) -> int | None:
        """The occurrence after the current job's, or ``None`` when it was the last."""
        occurrences, fire_ms = self.occurrences, self.job.fire_ms
        if not occurrences or fire_ms == occurrences[-1]:
            return None
        return occurrences[occurrences.index(fire_ms or 0) + 1]

    def handed_off(self) -> bool:
        """Whether its job was handed to a system that runs it on its own (a
        :class:`~workers.executors.base.Handoff`)."""
        fut = self.future
        return (
            fut is not None
            and fut.done()
            and not fut.cancelled()
            and fut.exception() is None
            and isinstance(fut.result(), Handoff)
        )


__all__ = ["App", "CronPlanner", "Run", "ScheduleBook"]
