"""InFlight: the runs a dispatcher holds, its flow-control bounds, and who settles.

Flow control: at most ``capacity`` jobs hold a slot at once (pulled, queued or
running in an executor of this process). A job handed to a system that runs it
on its own (a :class:`~workers.executors.base.Handoff`) frees its slot at once and
is *awaited* instead; at most ``max_awaiting`` are, and pulls wait beyond that.

Exactly one thread settles a run's message: the one that :meth:`InFlight.claim`\\ s
it first (the job's end, its timeout, or the drain). The run stays held, and
uncounted, until that thread reports the settle done (:meth:`InFlight.settled`):
an idle check or a drain that saw it gone could otherwise close the consumer
before its ack or nack went out. All of it is under one condition variable,
which also wakes the pull loop and the drain.
"""

from __future__ import annotations

import enum
import threading
import time
from concurrent.futures import Future
from typing import Any

from workers.context import JobContext
from workers.executors.local import QueuedCall
from workers.runs import Run


class JobEnd(enum.Enum):
    """What follows the end of one job of a run (see :meth:`InFlight.end_job`)."""

    #: Its next occurrence starts (a cron run); nothing is settled.
    NEXT = "next"
    #: The caller claimed the run: it settles the message.
    SETTLE = "settle"
    #: The run was settled already (a timeout, the drain): nothing to do.
    SETTLED = "settled"


class InFlight:
    """The unsettled runs of one dispatcher, its slots and awaited handoffs; thread-safe.

    :param capacity: jobs that may hold a slot at once.
    :param max_awaiting: handed-off jobs whose outcome may be awaited at once (>= 1).
    """

    def __init__(self, capacity: int, max_awaiting: int) -> None:
        self.capacity = capacity
        self.max_awaiting = max_awaiting
        self._cv = threading.Condition(threading.Lock())
        self._runs: set[Run] = set()
        self._slots = 0  # jobs submitted and not yet returned (or handed off)
        self._awaiting = 0  # handed-off jobs whose outcome has not come yet
        self._hurry = False
        self._waiters = 0  # threads in a wait on the condition: no notify when none
        #: Messages settled so far (acked, retried, dead-lettered, released or skipped).
        self.processed = 0

    @property
    def slots_taken(self) -> int:
        """Jobs submitted to an executor here and not yet returned or handed off."""
        return self._slots

    @property
    def awaiting(self) -> int:
        """Handed-off jobs whose outcome is awaited."""
        return self._awaiting

    def __len__(self) -> int:
        """Runs whose message is not settled yet."""
        return len(self._runs)

    def room(self, wait_ms: int) -> int:
        """How many more jobs may be pulled now; when none, first wait up to ``wait_ms``
        for a slot to free (and return 0)."""
        with self._cv:
            room = self.capacity - self._slots
            if room <= 0 or self._awaiting >= self.max_awaiting:
                self._wait(wait_ms / 1000)
                return 0
            return room

    def add(self, run: Run) -> None:
        """Hold ``run`` until it is claimed; its first job takes a slot."""
        with self._cv:
            self._runs.add(run)
            self._slots += 1

    def take_slot(self) -> None:
        """The next job of a held run takes a slot."""
        with self._cv:
            self._slots += 1

    def hand_off(self) -> None:
        """A job was handed off: its slot is free, its outcome awaited."""
        with self._cv:
            self._slots -= 1
            self._awaiting += 1
            self._wake()

    def end_job(self, run: Run, *, slot: bool, next_job: JobContext | None) -> JobEnd:
        """One job of ``run`` ended: free its slot (``slot``) or its awaited handoff.

        With ``next_job`` (the run's next occurrence, after a success), the run goes
        on with it unless it was settled meanwhile: ``run.job`` becomes ``next_job``
        here, so a late timeout of the ended job cannot claim the next one.
        """
        with self._cv:
            if slot:
                self._slots -= 1
            else:
                self._awaiting -= 1
            self._wake()
            if next_job is not None and not run.settled:
                run.job = next_job
                return JobEnd.NEXT
            return JobEnd.SETTLE if run.take_claim() else JobEnd.SETTLED

    def claim_ended(self, run: Run) -> bool:
        """The job of ``run`` that held a slot ended, and no job follows it: take the
        right to settle its message without the lock (:meth:`Run.take_claim`). Its
        slot stays taken until the claimer reports :meth:`settled` with ``slot``
        (one lock round trip per job instead of two). ``False`` when another thread
        claimed it first: then call :meth:`end_job`, which frees the slot."""
        return run.take_claim()

    def claim(self, run: Run, job: JobContext) -> bool:
        """Take the right to settle ``run``'s message while ``job`` is its current job;
        ``False`` when another thread has it, or the run went on to its next job."""
        with self._cv:
            return run.job is job and run.take_claim()

    def settled(self, run: Run, *, slot: bool = False) -> None:
        """The claimer of ``run`` settled its message (or gave up): let it go, count it.

        :param slot: also free the slot of its ended job (claimed with :meth:`claim_ended`).
        """
        with self._cv:
            if slot:
                self._slots -= 1
            self._runs.discard(run)
            self.processed += 1
            self._wake()

    def count(self) -> None:
        """A message settled without a run (skipped, dead-lettered at once) counts too."""
        with self._cv:
            self.processed += 1
            self._wake()

    def queued_calls(self) -> list[Future[Any] | QueuedCall]:
        """The executor futures (or queued calls) of the held runs, for the drain to
        cancel those not started."""
        with self._cv:
            out: list[Future[Any] | QueuedCall] = []
            for r in self._runs:
                handle = r.future or r.queued
                if handle is not None:
                    out.append(handle)
            return out

    def wait_and_claim_rest(self, timeout_s: float) -> list[Run]:
        """Wait up to ``timeout_s`` (or until :meth:`hurry`) for the held runs to
        settle; claim and return those still held and unclaimed (their claimer
        reports :meth:`settled` as usual)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._runs and not self._hurry and (left := deadline - time.monotonic()) > 0:
                self._wait(left)
            return [r for r in list(self._runs) if r.take_claim()]

    def _wait(self, timeout_s: float) -> None:
        """Wait on the condition (held) for up to ``timeout_s``, counted as a waiter."""
        self._waiters += 1
        try:
            self._cv.wait(timeout_s)
        finally:
            self._waiters -= 1

    def _wake(self) -> None:
        """Wake the waiters, if any (condition held): most calls find none, and a
        notify is a few Python-level calls."""
        if self._waiters:
            self._cv.notify_all()

    def hurry(self) -> None:
        """Cut :meth:`wait_and_claim_rest` short (any thread)."""
        with self._cv:
            self._hurry = True
            self._cv.notify_all()


__all__ = ["InFlight", "JobEnd"]
