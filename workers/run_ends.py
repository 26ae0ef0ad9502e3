"""RunEnds: a pull loop's runs as their jobs end; the next occurrence, or the settle.

:class:`~workers.pull_loop.PullLoop` submits each job with :meth:`RunEnds.ended`
(a local job run without a future) or :meth:`RunEnds.done` (an executor's future)
as its callback, so all of this runs in the thread that finished the job. A job
that handed off (:class:`~workers.executors.base.Handoff`) frees its slot and
waits for its outcome; a job that succeeded while its run has another occurrence
due starts that one; else the run is settled: success acks, a failure is settled
as :class:`~workers.retry_decision.RetryDecider` decides, a job cancelled before
it started is released. :meth:`RunEnds.expire` fails a job over its timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Any

from broker_adapter.base import Consumer
from broker_adapter.results import ReceivedMessage
from workers.context import JobContext, JobTimeout
from workers.executors.base import Handoff
from workers.hooks import HookCalls
from workers.inflight import InFlight, JobEnd
from workers.outcomes import Settler, log_run
from workers.retry_decision import RetryDecider
from workers.runs import Run
from workers.settlement import Decision, Settlement

_ACK = Decision(Settlement.ACK, "")
_NEVER_STARTED = Decision(Settlement.RELEASE, "released: stopped before the job started")


class RunEnds:
    """Ends the runs of one pull loop: settles each, or starts its next occurrence.

    :param consumer: the loop's consumer; its messages are settled through a
        :class:`~workers.outcomes.Settler`.
    :param flow: the loop's runs and bounds.
    :param calls: the loop's hook calls.
    :param start: starts a run's next job (given a slot already taken for it).
    :param clock_ms: the dispatcher's clock, read as epoch ms for job start times.
    :param log: the dispatcher's logger.
    """

    def __init__(
        self,
        consumer: Consumer,
        *,
        flow: InFlight,
        calls: HookCalls,
        start: Callable[[Run, JobContext], None],
        clock_ms: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self._flow = flow
        self._calls = calls
        self._start = start
        self._clock_ms = clock_ms
        self._log = log
        self._settler = Settler(consumer, log)
        self._decider = RetryDecider()

    def done(self, run: Run, job: JobContext, fut: Future[Any]) -> None:
        """An executor's future completed.

        :param run: the run whose current job ``job`` is.
        :param fut: the future the executor returned for ``job``.
        """
        if fut.cancelled():
            self.ended(run, job, False, None, None)
        else:
            error = fut.exception()
            self.ended(run, job, True, None if error is not None else fut.result(), error)

    def ended(
        self, run: Run, job: JobContext, started: bool, result: Any, error: BaseException | None
    ) -> None:
        """A job ended (``started`` false: cancelled before it started); see
        :data:`~workers.executors.local.Done`.

        :param run: the run whose current job ``job`` is.
        :param result: what the job returned (a :class:`~workers.executors.base.Handoff`:
            it runs elsewhere now).
        :param error: what it raised, or ``None``.
        """
        if started and error is None and isinstance(result, Handoff):
            # Runs elsewhere now: free the slot, await the outcome.
            self._flow.hand_off()
            for after_handoff in self._calls.after_handoff:
                after_handoff(run)
            result.outcome.add_done_callback(partial(self._outcome, run, job))
            return
        self._finish(run, job, True, not started, error)

    def _outcome(self, run: Run, job: JobContext, fut: Future[Any]) -> None:
        """A handed-off job's outcome came."""
        cancelled = fut.cancelled()
        self._finish(run, job, False, cancelled, None if cancelled else fut.exception())

    def _finish(
        self, run: Run, job: JobContext, slot: bool, cancelled: bool, error: BaseException | None
    ) -> None:
        """Settle ``run`` after ``job`` ended (``slot``: it still holds a slot; else its
        handoff's outcome came), or start its next occurrence."""
        for after_job in self._calls.after_job:
            after_job(run, job, CancelledError() if cancelled else error)
        nxt = None
        if error is None and not cancelled and (fire_ms := run.next_fire_ms()) is not None:
            nxt = JobContext(run.spec, run.call, run.message, fire_ms, self._clock_ms)
        # The common end claims lock-free; its slot goes with the settle (claim_ended).
        held = slot and nxt is None and self._flow.claim_ended(run)
        end = JobEnd.SETTLE if held else self._flow.end_job(run, slot=slot, next_job=nxt)
        if end is JobEnd.NEXT and nxt is not None:
            log_run(self._log, job, "ok", time.monotonic())
            self._flow.take_slot()
            self._start(run, nxt)
            return
        for after_run in self._calls.after_run:
            after_run(run)
        if end is JobEnd.SETTLED:
            return  # already settled: timed out or released; its late end changes nothing
        if cancelled:
            outcome = self.settle_run(run, _NEVER_STARTED, slot=held)
        elif error is None:
            outcome = self.settle_run(run, _ACK, slot=held)
        else:
            decision = self._decide(run, error)
            outcome = self.settle_run(run, decision, slot=held)
            if decision.settlement is Settlement.DEFER:
                error = None  # the executor logged why; no traceback per message
        log_run(self._log, job, outcome, time.monotonic(), error)

    def expire(self, run: Run, job: JobContext) -> None:
        """``job`` ran over its timeout (see :class:`~workers.timeout_watch.TimeoutWatch`):
        unless its run was claimed already, cancel it and settle the run as failed.

        :param run: the run whose current job ``job`` is.
        """
        if not self._flow.claim(run, job):
            return
        job.cancel("timeout")
        error = JobTimeout(run.spec.name, run.spec.timeout or 0.0)
        outcome = self.settle_run(run, self._decide(run, error))
        log_run(self._log, job, outcome, time.monotonic(), error)

    def _decide(self, run: Run, error: BaseException) -> Decision:
        return self._decider.decide(
            run.spec, run.message.attempts, error, cron=run.cron is not None
        )

    def settle_run(self, run: Run, d: Decision, *, slot: bool = False) -> str:
        """Settle a claimed run's message as ``d`` says; the words for its log line.

        :param slot: also free its ended job's slot (see :meth:`InFlight.claim_ended
            <workers.inflight.InFlight.claim_ended>`).
        """
        m = run.message
        try:
            for before_settle in self._calls.before_settle:
                before_settle(m, run.spec.name, run, d.settlement, d.reason)
            outcome = self._settler.settle(m, d.settlement, d.reason, d.delay_ms)
            for after_settle in self._calls.after_settle:
                after_settle(m, outcome)
        finally:  # only now may the run count as processed and leave the held set
            run.future = run.queued = None  # its done callback refers to it: no cycle kept
            self._flow.settled(run, slot=slot)
        return outcome

    def settle_alone(self, m: ReceivedMessage, job: str | None, d: Decision) -> None:
        """Settle a message that has no job log line (it never got a run, or never ran).

        :param job: the job's (or schedule's) name, or ``None`` when it is unknown.
        :param d: how to settle it.
        """
        for before_settle in self._calls.before_settle:
            before_settle(m, job, None, d.settlement, d.reason)
        outcome = self._settler.settle(m, d.settlement, d.reason, d.delay_ms, warn=True)
        for after_settle in self._calls.after_settle:
            after_settle(m, outcome)
        self._flow.count()


__all__ = ["RunEnds"]
