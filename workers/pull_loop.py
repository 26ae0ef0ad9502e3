"""PullLoop: a dispatcher's work once it joined its group; pull, route, submit, settle.

:meth:`Dispatcher.open <workers.dispatcher.Dispatcher.open>` builds one; it is
complete from then on (consumer, hooks, run ends). Per pull it asks the hooks'
``tick``, waits for room (:class:`~workers.inflight.InFlight`), pulls, and per
message decodes the :class:`~scheduler.jobcall.JobCall`, finds its spec, routes
it (left to another dispatcher, a schedule's occurrence, or a job), asks the hooks to
admit it and submits it to its executor. The outcome is settled in the thread
that finishes the job, by :class:`~workers.run_ends.RunEnds` (the done callback).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial

from broker_adapter.base import Consumer
from broker_adapter.clock import Clock
from broker_adapter.errors import ChronoqError, DecodeError
from broker_adapter.results import ReceivedMessage
from scheduler.errors import JobNotFound
from scheduler.jobcall import JobCall
from scheduler.plan import SCHEDULE_PROPERTY
from scheduler.spec import CRON_KEY_PREFIX, CronSpec, JobSpec, parse_cron_key
from workers.context import JobContext, reset_current, set_current
from workers.cron_gate import CronGate
from workers.executors.base import Executor
from workers.executors.local import Done, LocalExecutor, QueuedCall
from workers.hooks import DispatchHook, HookCalls
from workers.inflight import InFlight
from workers.invisibility import InvisibilityKeeper
from workers.outcomes import describe_error
from workers.run_ends import RunEnds
from workers.runs import App, Run
from workers.settlement import Decision, Settlement
from workers.timeout_watch import TimeoutWatch
from workers.trace_hook import TraceHook, TraceSink

#: How soon a cron message whose planner failed comes back, ms.
PLANNER_RETRY_MS = 1000


class PullLoop:
    """The joined half of a dispatcher: what it does per pull and per message.

    :param app: the app (registry, planner).
    :param consumer: the joined consumer; closed by :meth:`close`.
    :param group: its consumer group.
    :param topics: the topics it pulls.
    :param invisible_ms: the consumer's invisible time.
    :param executors: executor name to executor.
    :param flow: the dispatcher's runs and bounds.
    :param clock: the dispatcher's clock (cron planning).
    :param clock_ms: the same clock, read as epoch ms for job start times.
    :param leaves: why this dispatcher leaves a job of an executor to another
        dispatcher, or ``None`` when it handles it (see :mod:`workers.routing`).
    :param log: the dispatcher's logger.
    :param trace: where to record each delivery, or ``None``.
    :param hooks: more hooks, called after the built-in ones.
    """

    def __init__(
        self,
        app: App,
        consumer: Consumer,
        *,
        group: str,
        topics: list[str],
        invisible_ms: int,
        executors: Mapping[str, Executor],
        flow: InFlight,
        clock: Clock,
        clock_ms: Callable[[], float],
        leaves: Callable[[str], str | None],
        log: logging.Logger,
        trace: TraceSink | None = None,
        hooks: Iterable[DispatchHook] = (),
    ) -> None:
        self.consumer = consumer
        self.group = group
        self.topics = topics
        self.invisible_ms = invisible_ms
        self._registry = app.registry
        self._planner = app.planner
        self._executors = executors
        self._flow = flow
        self._clock = clock
        self._clock_ms = clock_ms
        self._leaves = leaves
        self._left: dict[str, str | None] = {}  # executor -> self._leaves(executor), once
        # Executors that run a job without a future (LocalExecutor.start_job, issue 16);
        # by exact type, so a subclass that overrides submit keeps getting its calls.
        local = {name: ex for name, ex in executors.items() if type(ex) is LocalExecutor}
        self._direct: dict[str, Callable[[JobSpec, JobCall, ReceivedMessage, Done], QueuedCall]] = {
            name: ex.start_job for name, ex in local.items()
        }
        # Running a pull's local jobs in the pulling thread (workers.inline_runs): how, and
        # the most slots held then (the executor's threads, so no more jobs run at once).
        self._local = local
        self._inline_now = False  # the message being dispatched may run inline
        self._inline: list[tuple[QueuedCall, str, LocalExecutor]] = []
        #: Jobs not run inline any more: one ran longer than an inline run should.
        self.long_jobs: set[str] = set()
        self._log = log
        self._crons = CronGate(app.registry)
        # The one place the hook list is built: the built-in ones, then the caller's.
        builtin: list[DispatchHook] = [
            InvisibilityKeeper(consumer, invisible_ms, log),
            TimeoutWatch(self._expire),
            self._crons,
        ]
        if trace is not None:
            builtin.append(TraceHook(trace, group, clock_ms))
        self.calls = HookCalls([*builtin, *hooks])
        ends = RunEnds(
            consumer, flow=flow, calls=self.calls, start=self._start, clock_ms=clock_ms, log=log
        )
        self._ends = ends
        # Bound once: they run per job or per message.
        self._ended, self._done, self._settle_alone = ends.ended, ends.done, ends.settle_alone
        for on_open in self.calls.on_open:
            on_open(self)

    # -- per pull -------------------------------------------------------------------------

    def step(self, wait_ms: int, *, inline: bool = False) -> int:
        """One pull (waiting up to ``wait_ms``) and dispatch; returns messages pulled, or
        -1 when all slots were taken (it waited for one instead: busy, not idle).

        :param inline: the pull's local jobs are not queued but kept for the caller
            to run (:meth:`take_inline`) while few enough slots are held.
        """
        for tick in self.calls.tick:
            wish = tick()
            if wish is not None and wish < wait_ms:
                wait_ms = wish
        room = self._flow.room(wait_ms)
        if room <= 0:
            return -1
        msgs = self.consumer.pull(room, wait_ms)
        if msgs:
            for on_pulled in self.calls.on_pulled:
                on_pulled(msgs)
            self._inline_now = inline
            for m in msgs:
                self._dispatch(m)
            self._inline_now = False
        return len(msgs)

    def take_inline(self) -> list[tuple[QueuedCall, str, LocalExecutor]]:
        """The jobs :meth:`step` kept for its caller to run, in order, with their
        names and executors; once."""
        kept = self._inline
        if kept:
            self._inline = []
        return kept

    def _dispatch(self, m: ReceivedMessage) -> None:
        key = m.key
        if key is not None and key.startswith(CRON_KEY_PREFIX):
            parsed = parse_cron_key(key)
            if parsed is not None and self._dispatch_occurrence(m, *parsed):
                return
        try:
            call = JobCall.decode(m.body)
        except DecodeError as e:
            self._dead_now(m, f"undecodable job call: {e}")
            return
        spec = self._registry.find(call.name)
        if spec is None:
            self._dead_now(m, f"unknown job: {JobNotFound(call.name, self._registry.names())}")
            return
        if self._left_to_others(m, spec.executor, spec.name):
            return
        run = Run(m, spec, call, JobContext(spec, call, m, None, self._clock_ms))
        refused = self._admit(run)
        if refused is not None:
            if refused.settlement is Settlement.SKIP:  # a wait is logged by its hook
                self._log.info("job %s msg=%s skipped: %s", spec.name, m.msg_id, refused.reason)
            return
        self._flow.add(run)
        self._start(run, run.job)

    def _dispatch_occurrence(self, m: ReceivedMessage, name: str, fire_ms: int) -> bool:
        """Handle an occurrence of schedule ``name`` (a cron/interval job, or a stored
        schedule: see :meth:`CronPlanner.fire <scheduler.cron.CronPlanner.fire>`);
        ``False`` when the message is no schedule's (it is then a plain job's)."""
        cron = self._crons.find(name)
        stored = SCHEDULE_PROPERTY in m.properties
        if cron is None and not stored:
            return False
        try:
            call = JobCall.decode(m.body) if m.body else JobCall(name)
        except DecodeError as e:
            self._dead_now(m, f"undecodable schedule call: {e}")
            return True
        job = cron.job if cron is not None else self._registry.find(call.name)
        if job is not None and self._left_to_others(m, job.executor, name):
            return True
        try:
            firing = self._planner.fire(
                name,
                fire_ms,
                self._clock.now_ms(),
                topic=m.topic,
                body=m.body,
                stored=stored,
                redelivery=m.attempts > 1,
            )
        except Exception as e:  # noqa: BLE001 - retry the message soon; fire is idempotent
            self._log.exception("schedule %s msg=%s: planner failed", name, m.msg_id)
            reason = f"planner failed: {describe_error(e)}"
            self._settle_alone(m, name, Decision(Settlement.RETRY, reason, PLANNER_RETRY_MS))
            return True
        if firing is None:
            return False
        if firing.spec is None or not firing.run:
            why = firing.reason
            settlement = Settlement.DEAD if firing.dead else Settlement.SKIP
            self._settle_alone(m, name, Decision(settlement, why))
            log = self._log.error if firing.dead else self._log.info
            log("schedule %s msg=%s occurrence %d not run: %s", name, m.msg_id, fire_ms, why)
            return True
        self._run_occurrences(m, firing.spec, firing.call or call, firing.run)
        return True

    def _run_occurrences(
        self, m: ReceivedMessage, cron: CronSpec, call: JobCall, due: Sequence[int]
    ) -> None:
        job = JobContext(cron.job, call, m, due[0], self._clock_ms)
        run = Run(m, cron.job, call, job, cron, due)
        refused = self._admit(run)
        if refused is not None:
            if refused.settlement is Settlement.SKIP:
                why = refused.reason
                self._log.info(
                    "schedule %s msg=%s occurrence %d skipped: %s", cron.name, m.msg_id, due[0], why
                )
            return
        self._flow.add(run)
        self._start(run, job)

    def _admit(self, run: Run) -> Decision | None:
        """``None`` when the hooks let ``run`` start; else how it was settled instead:
        skipped with the refusing hook's reason, or as the hook's decision says."""
        for admit in self.calls.admit:
            why = admit(run)
            if why:
                for after_run in self.calls.after_run:
                    after_run(run)
                d = why if isinstance(why, Decision) else Decision(Settlement.SKIP, why)
                self._settle_alone(run.message, run.spec.name, d)
                return d
        return None

    def _left_to_others(self, m: ReceivedMessage, executor: str, name: str) -> bool:
        """Ack (in this group) a job that another dispatcher runs; see :mod:`workers.routing`."""
        try:
            why = self._left[executor]
        except KeyError:
            why = self._left[executor] = self._leaves(executor)
        if why is None:
            return False
        self._settle_alone(m, name, Decision(Settlement.SKIP, why))
        self._log.debug("job %s msg=%s skipped in group %s: %s", name, m.msg_id, self.group, why)
        return True

    def _dead_now(self, m: ReceivedMessage, reason: str) -> None:
        self._settle_alone(m, None, Decision(Settlement.DEAD, reason))
        self._log.error("msg=%s dead-lettered: %s", m.msg_id, reason)

    def _expire(self, run: Run, job: JobContext) -> None:
        # TimeoutWatch is built before the hook calls that RunEnds needs: called late.
        self._ends.expire(run, job)

    def _start(self, run: Run, job: JobContext) -> None:
        """Submit ``job`` (``run``'s current job, holding a slot) to its executor."""
        for before_start in self.calls.before_start:
            before_start(run, job)
        spec = run.spec
        token = set_current(job)
        try:
            direct = self._direct.get(spec.executor)
            if direct is not None:
                done = partial(self._ended, run, job)
                if self._inline_now and spec.name not in self.long_jobs:
                    local = self._local[spec.executor]
                    if self._flow.slots_taken <= local.max_workers:  # this one included
                        run.queued = local.prepare_job(spec, run.call, run.message, done)
                        self._inline.append((run.queued, spec.name, local))
                        return
                run.queued = direct(spec, run.call, run.message, done)
                return
            executor = self._executors.get(spec.executor)
            if executor is None:
                raise LookupError(
                    f"no {spec.executor!r} executor in this dispatcher (it has "
                    f"{', '.join(self._executors) or 'none'})"
                )
            fut = executor.submit(spec, run.call, run.message)
        except Exception as e:  # noqa: BLE001 - shut down, or no such executor: a failed attempt
            fut = Future()
            fut.set_exception(e)
        finally:
            reset_current(token)
        run.future = fut
        fut.add_done_callback(partial(self._done, run, job))

    # -- the end ---------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> int:
        """Cancel the queued jobs, let the running ones finish for up to ``timeout_s``,
        release the rest for redelivery; returns how many were released."""
        for queued in self._flow.queued_calls():
            queued.cancel()  # not started yet: released at once by its done callback
        stuck = self._flow.wait_and_claim_rest(timeout_s)
        for run in stuck:
            if run.handed_off():  # runs elsewhere: the next dispatcher looks its outcome up
                why = f"released: outcome still awaited after the {timeout_s:g} s drain"
                self._ends.settle_run(run, Decision(Settlement.RELEASE, why))
                continue
            run.job.cancel("the dispatcher is shutting down")
            why = f"released: still running after the {timeout_s:g} s drain"
            self._ends.settle_run(run, Decision(Settlement.ABANDON, why))
        return len(stuck)

    def close(self) -> None:
        """Leave the group, then tell the hooks."""
        try:
            self.consumer.close()
        except ChronoqError as e:  # broker already closed: it redelivers anyway
            self._log.warning("leaving group %s: %s", self.group, e)
        for on_close in self.calls.on_close:
            on_close()


__all__ = ["PLANNER_RETRY_MS", "PullLoop"]
