"""Dispatcher: one member of a consumer group that runs due jobs.

The dispatcher thread pulls fired messages of the app's topics (long poll),
decodes each :class:`~scheduler.jobcall.JobCall`, looks up its
:class:`~scheduler.spec.JobSpec` and hands it to the job's executor. The outcome
is settled in the thread that finishes the job (a done callback), so the pull
loop does nothing per message but decode and submit:

* success: ``ack``;
* an exception in ``spec.retry.retry_on``, before ``spec.max_attempts``: ``nack``
  with ``spec.retry.backoff_ms(attempt)`` and the error as the reason;
* any other exception, or the last attempt: ``dead_letter`` with the error
  (``"ValueError: boom (attempt 3 of 3)"``), shown by ``broker.query(msg_id).error``;
* an unknown job or an undecodable body: ``dead_letter`` with that reason;
* :class:`~workers.executors.base.JobNotStarted` (the executor could not start
  the job, e.g. its Celery broker is down): ``release`` with the backoff,
  whatever ``retry_on`` says: back after the delay, not counted as an attempt
  (so never dead-lettered for it); the reason is in the job's log line;
* over ``spec.timeout`` (counted from the body's start): failed as above with
  :class:`~workers.context.JobTimeout`, and the job's cancel event is set (see
  :mod:`workers.context`; threads cannot be killed, so a stuck job keeps its
  pool thread until it returns, and keeps counting against the in-flight bound).

Cron messages (key ``cron:<name>:<fire_ms>``) go to ``app.planner.on_fired``,
which arms the next occurrence and says which occurrences to run now; they run
one after the other, at most ``CronSpec.max_running`` messages of one cron job at
a time (a fire while that many still run is skipped with a log line). Cron runs
are not retried (the next occurrence is the retry): a failed one is
dead-lettered with its error, so it stays visible.

Flow control: at most ``prefetch + max_workers`` jobs are held at once (pulled,
queued or running). A job handed to a system that runs it on its own (a
:class:`~workers.executors.base.Handoff`, e.g. published to Celery) frees its
slot at once; its message stays in flight until the outcome settles it, and at
most ``max_awaiting`` such outcomes are awaited at once (pulls wait beyond that).
The consumer is opened with ``max_inflight`` = slots + ``max_awaiting``. From
the moment a job starts until its message is settled, the message stays
invisible (:mod:`workers.invisibility`), so a live dispatcher's message never
comes back while its job waits or runs, however long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, Self

from broker_adapter.base import DEFAULT_INVISIBLE_MS, Consumer
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import ChronoqError, DecodeError
from broker_adapter.results import ReceivedMessage
from scheduler.errors import JobNotFound
from scheduler.jobcall import JobCall
from scheduler.spec import CRON_KEY_PREFIX, parse_cron_key
from workers.context import JobContext, JobTimeout, reset_current, set_current
from workers.executors.base import Executor, Handoff, JobNotStarted, registered_executors
from workers.executors.local import LocalExecutor
from workers.invisibility import InvisibilityKeeper
from workers.outcomes import Settler, describe_error, log_run
from workers.routing import skip_reason, topics_for
from workers.runs import App, CronGate, Run

if TYPE_CHECKING:
    from workers.trace import DeliveryTrace


#: Default bound on handed-off jobs whose outcome a dispatcher awaits.
DEFAULT_MAX_AWAITING = 10_000


def _wall_ms() -> float:
    return time.time() * 1000.0


class Dispatcher:
    """A consumer-group member that runs the app's due jobs.

    :param app: the :class:`scheduler.Scheduler` (or anything shaped like :class:`App`).
    :param group: the consumer group; ``app.settings.group`` by default.
    :param executors: executor name to :class:`Executor`; by default ``{"local":
        LocalExecutor(app.settings.max_workers)}`` plus those registered for the app
        (:func:`~workers.executors.base.register_executor`, e.g. ``"celery"``), owned
        (and shut down) by the dispatcher.
    :param prefetch: messages held beyond the workers; ``app.settings.prefetch`` by default.
    :param clock: the clock for lateness and cron; ``app.clock`` by default.
    :param invisible_ms: how long a pulled message stays invisible to the group;
        by default 60 s, or twice the longest job timeout plus 10 s if more.
    :param drain_timeout_s: on stop, how long running jobs may take to finish
        before their messages are released for redelivery.
    :param trace: where to record each delivery (:mod:`workers.trace`); ``None``: off.
        Which topics it joins and which jobs it leaves to another group follow
        :mod:`workers.routing` (Spark jobs run in their own dispatcher).
    :param max_awaiting: most handed-off jobs (:class:`~workers.executors.base.Handoff`)
        whose outcome is awaited at once; each keeps its message in flight, so
        their outcome should come within the invisible time.
    """

    def __init__(
        self,
        app: App,
        *,
        group: str | None = None,
        executors: Mapping[str, Executor] | None = None,
        prefetch: int | None = None,
        clock: Clock | None = None,
        invisible_ms: int | None = None,
        drain_timeout_s: float = 30.0,
        trace: DeliveryTrace | None = None,
        max_awaiting: int = DEFAULT_MAX_AWAITING,
    ) -> None:
        settings = app.settings
        self.app = app
        self.registry = app.registry
        self.group = group or settings.group
        self.prefetch = settings.prefetch if prefetch is None else prefetch
        self._own_executors = executors is None
        self.executors: dict[str, Executor] = (
            {"local": LocalExecutor(settings.max_workers), **registered_executors(app)}
            if executors is None
            else dict(executors)
        )
        self.capacity = self.prefetch + settings.max_workers
        self.max_awaiting = max(1, max_awaiting)
        self.clock = clock or app.clock
        self._clock_ms = _wall_ms if isinstance(self.clock, SystemClock) else self.clock.now_ms
        self.invisible_ms = invisible_ms
        self.drain_timeout_s = drain_timeout_s
        self._trace = trace
        self._log = logging.getLogger("chronoq.workers.Dispatcher")
        self._consumer: Consumer | None = None
        self._topics: list[str] = []
        self._settler: Settler | None = None
        self._cv = threading.Condition(threading.Lock())
        self._threads = 0  # job bodies submitted and not yet returned (or handed off)
        self._awaiting = 0  # handed-off jobs whose outcome has not come yet
        self._runs: set[Run] = set()  # runs whose message is not settled yet
        self._timed: set[Run] = set()  # ... of those, the ones with a timeout
        self._keeper = InvisibilityKeeper(self._log)  # started runs' messages stay invisible
        self._crons = CronGate(app.registry)
        self._stop = threading.Event()
        self._hurry = False
        self._closed = False
        #: Messages settled so far (acked, retried, dead-lettered, released or skipped).
        self.processed = 0

    # -- life cycle -----------------------------------------------------------------------

    def open(self) -> Consumer:
        """Join the consumer group (done by the run methods; idempotent)."""
        if self._consumer is None:
            specs = list(self.registry)
            self._topics = topics_for(self.registry, self.app.settings.topic, self.executors)
            longest = max((s.timeout or 0.0 for s in specs), default=0.0)
            invisible = self.invisible_ms or max(DEFAULT_INVISIBLE_MS, int(longest * 2000) + 10_000)
            self._consumer = self.app.broker.consumer(
                self.group,
                self._topics,
                invisible_ms=invisible,
                max_attempts=max((s.max_attempts for s in specs), default=16),
                max_inflight=self.capacity + self.max_awaiting,
            )
            self._settler = Settler(self._consumer, self._log)
            self._keeper.open(self._consumer, invisible)
            for executor in self.executors.values():
                warm_up = getattr(executor, "warm_up", None)  # optional: see Executor
                if callable(warm_up):
                    warm_up()
            self._log.info(
                "dispatcher joined group %s on %s (capacity %d, invisible %d ms)",
                self.group,
                ", ".join(self._topics),
                self.capacity,
                invisible,
            )
        return self._consumer

    def stop(self) -> None:
        """Ask :meth:`run_forever` to stop pulling, drain and return (any thread)."""
        self._stop.set()

    def run_forever(
        self,
        *,
        stop_event: threading.Event | None = None,
        exit_when_idle: bool = False,
        poll_ms: int = 200,
    ) -> int:
        """Pull and run jobs until :meth:`stop` (or ``stop_event``), then drain.

        :param exit_when_idle: also return once nothing is ready, running or
            pending on the app's topics (cron occurrences aside).
        :param poll_ms: the longest a pull waits; bounds how soon a stop is seen.
        :returns: messages processed.
        """
        self.open()
        stop = self._stop
        try:
            while not stop.is_set() and not (stop_event is not None and stop_event.is_set()):
                if not self._step(poll_ms) and exit_when_idle and self._idle(any_pending=True):
                    break
        finally:
            self.drain()
        return self.processed

    def run_until_idle(self, timeout_s: float = 10.0, *, idle_ms: int = 50) -> int:
        """Process until nothing is ready, in flight, or due by ``clock``; for tests.

        Messages due later (by a ``ManualClock``) do not count: advance the
        clock and call again. Returns early at ``timeout_s`` (not an error).

        :returns: messages processed during this call.
        """
        self.open()
        start = self.processed
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if self._step(max(1, min(idle_ms, int(remaining * 1000)))):
                continue
            if self._idle(any_pending=False):
                break
        return self.processed - start

    def drain(self, timeout_s: float | None = None) -> None:
        """Stop pulling, let running jobs finish for up to ``timeout_s`` (default
        ``drain_timeout_s``), release the rest for redelivery, leave the group."""
        self._stop.set()
        if self._closed:
            return
        self._closed = True
        with self._cv:
            queued = [r.future for r in self._runs if r.future is not None]
        for fut in queued:
            fut.cancel()  # not started yet: released at once by its done callback
        limit = self.drain_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with self._cv:
            while self._runs and not self._hurry and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            stuck = [r for r in list(self._runs) if self._claim(r)]
        for run in stuck:
            if _handed_off(run):  # runs elsewhere: the next dispatcher looks its outcome up
                self._settle(
                    run, "release", f"released: outcome still awaited after the {limit:g} s drain"
                )
                continue
            if run.job is not None:
                run.job.cancel("the dispatcher is shutting down")
            self._settle(run, "abandon", f"released: still running after the {limit:g} s drain")
        if self._consumer is not None:
            try:
                self._consumer.close()
            except ChronoqError as e:  # broker already closed: it redelivers anyway
                self._log.warning("leaving group %s: %s", self.group, e)
        if self._own_executors:
            for executor in self.executors.values():
                executor.shutdown(wait=False)
        self._log.info("dispatcher stopped: %d processed, %d released", self.processed, len(stuck))

    def hurry(self) -> None:
        """Cut a drain short: release what still runs now (e.g. on a second Ctrl-C)."""
        self._stop.set()
        with self._cv:
            self._hurry = True
            self._cv.notify_all()

    def close(self) -> None:
        """Drain (see :meth:`drain`) and leave the group. Closing twice is harmless."""
        self.drain()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pull loop --------------------------------------------------------------------

    def _step(self, wait_ms: int) -> int:
        """One pull (waiting up to ``wait_ms``) and dispatch; returns messages pulled, or
        -1 when all slots were taken (it waited for one instead: busy, not idle)."""
        if self._timed:
            wait_ms = min(wait_ms, self._check_timeouts())
        if self._keeper:
            wait_ms = min(wait_ms, self._keeper.tick())
        with self._cv:
            room = self.capacity - self._threads
            if room <= 0 or self._awaiting >= self.max_awaiting:
                self._cv.wait(wait_ms / 1000)
                return -1
        assert self._consumer is not None
        msgs = self._consumer.pull(room, wait_ms)
        if self._trace is not None and msgs:
            self._trace.received(msgs, self._clock_ms())
        for m in msgs:
            self._dispatch(m)
        return len(msgs)

    def _idle(self, *, any_pending: bool) -> bool:
        """No unsettled run, and nothing due now (or, with ``any_pending``, at all)."""
        with self._cv:
            if self._runs:
                return False
        broker = self.app.broker
        end = None if any_pending else self.clock.now_ms() + 1
        for topic in self._topics:
            for view in broker.pending(topic=topic, end_ms=end, limit=1000):
                if not any_pending or not (view.key or "").startswith(CRON_KEY_PREFIX):
                    return False
        return True

    def _dispatch(self, m: ReceivedMessage) -> None:
        key = m.key
        if key is not None and key.startswith(CRON_KEY_PREFIX):
            parsed = parse_cron_key(key)
            cron = None if parsed is None else self._crons.find(parsed[0])
            if parsed is not None and cron is not None:
                if not self._skipped(m, cron.job.executor, cron.name):
                    self._dispatch_cron(m, *parsed)
                return
        try:
            call = JobCall.decode(m.body)
        except DecodeError as e:
            self._dead_now(m, f"undecodable job call: {e}")
            return
        spec = self.registry.find(call.name)
        if spec is None:
            self._dead_now(m, f"unknown job: {JobNotFound(call.name, self.registry.names())}")
            return
        if self._skipped(m, spec.executor, spec.name):
            return
        run = Run(m, spec, call)
        with self._cv:
            self._runs.add(run)
        self._start(run, None)

    def _dispatch_cron(self, m: ReceivedMessage, name: str, fire_ms: int) -> None:
        cron = self._crons.find(name)
        assert cron is not None
        try:
            call = JobCall.decode(m.body) if m.body else JobCall(name)
        except DecodeError as e:
            self._dead_now(m, f"undecodable cron call: {e}")
            return
        try:
            due = list(self.app.planner.on_fired(name, fire_ms, self.clock.now_ms()))
        except Exception as e:  # noqa: BLE001 - retry the message soon; on_fired is idempotent
            self._log.exception("cron %s msg=%s: planner failed", name, m.msg_id)
            assert self._settler is not None
            self._settler.nack(m, 1000, f"planner failed: {describe_error(e)}")
            self._count()
            return
        skip = self._crons.admit(cron) if due else "misfire policy skipped it"
        if skip:
            assert self._settler is not None
            self._settler.ack(m)
            self._count()
            self._log.info(
                "cron %s msg=%s occurrence %d skipped: %s", name, m.msg_id, fire_ms, skip
            )
            return
        run = Run(m, cron.job, call, cron, due)
        with self._cv:
            self._runs.add(run)
        self._start(run, due[0])

    def _start(self, run: Run, fire_ms: int | None) -> None:
        spec = run.spec
        job = JobContext(spec, run.call, run.message, fire_ms, self._clock_ms)
        run.job = job
        with self._cv:
            self._threads += 1
            if spec.timeout is not None:
                self._timed.add(run)
        self._keeper.keep(run)
        executor = self.executors.get(spec.executor)
        if self._trace is not None:
            self._trace.dispatched(run.message, self._clock_ms())
        token = set_current(job)
        try:
            if executor is None:
                raise LookupError(
                    f"no {spec.executor!r} executor in this dispatcher (it has "
                    f"{', '.join(self.executors) or 'none'})"
                )
            fut = executor.submit(spec, run.call, run.message)
        except Exception as e:  # noqa: BLE001 - shut down, or no such executor: a failed attempt
            fut = Future()
            fut.set_exception(e)
        finally:
            reset_current(token)
        run.future = fut
        fut.add_done_callback(partial(self._done, run, job))

    # -- outcomes (in the thread that finished the job) ------------------------------------

    def _claim(self, run: Run) -> bool:
        """Take the right to settle ``run``'s message (``_cv`` held); ``False`` if taken."""
        if run.settled:
            return False
        run.settled = True
        self._runs.discard(run)
        self._timed.discard(run)
        self._keeper.drop(run)
        self.processed += 1
        self._cv.notify_all()
        return True

    def _done(self, run: Run, job: JobContext, fut: Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            handoff = fut.result()
            if isinstance(handoff, Handoff):  # runs elsewhere now: free the slot, await
                with self._cv:
                    self._threads -= 1
                    self._awaiting += 1
                    if not run.settled:
                        self._keeper.keep(run)  # extended from the handoff on
                    self._cv.notify_all()
                handoff.outcome.add_done_callback(partial(self._finish, run, job, False))
                return
        self._finish(run, job, True, fut)

    def _finish(self, run: Run, job: JobContext, slot: bool, fut: Future[Any]) -> None:
        """Settle ``run`` from ``fut`` (the executor's future, ``slot``: it still holds
        a slot; or a handoff's outcome)."""
        cancelled = fut.cancelled()
        exc = None if cancelled else fut.exception()
        nxt: int | None = None
        with self._cv:
            if slot:
                self._threads -= 1
            else:
                self._awaiting -= 1
                self._keeper.drop(run)
            self._cv.notify_all()
            occ = run.occurrences
            if not run.settled and exc is None and not cancelled and occ and job.fire_ms != occ[-1]:
                nxt = occ[occ.index(job.fire_ms or 0) + 1]
                self._timed.discard(run)
                mine = False
            else:
                mine = self._claim(run)
                if run.cron is not None:
                    self._crons.finished(run.cron.name)
        if nxt is not None:
            log_run(self._log, job, "ok", time.monotonic())
            self._start(run, nxt)
            return
        if not mine:
            return  # already settled: timed out or released; its late end changes nothing
        if cancelled:
            outcome = self._settle(run, "release", "released: stopped before the job started")
        elif exc is None:
            outcome = self._settle(run, "ack", "")
        else:
            outcome = self._fail(run, exc)
            if isinstance(exc, JobNotStarted):
                exc = None  # the executor logged why; no traceback per message
        log_run(self._log, job, outcome, time.monotonic(), exc)

    def _fail(self, run: Run, exc: BaseException) -> str:
        m, spec = run.message, run.spec
        reason = describe_error(exc)
        if isinstance(exc, JobNotStarted):  # never ran (e.g. Celery broker down): retry
            return self._not_started(run, reason, spec.retry.backoff_ms(m.attempts))
        if run.cron is not None:
            return self._settle(run, "dead", f"{reason} (cron runs are not retried)")
        if not isinstance(exc, spec.retry.retry_on):
            return self._settle(run, "dead", f"{reason} (not retried: not in retry_on)")
        if m.attempts >= spec.max_attempts:
            return self._settle(
                run, "dead", f"{reason} (attempt {m.attempts} of {spec.max_attempts})"
            )
        return self._settle(run, "retry", reason, spec.retry.backoff_ms(m.attempts))

    def _settle(self, run: Run, how: str, reason: str, delay_ms: int = 0) -> str:
        assert self._settler is not None
        if self._trace is not None:
            started = None if run.job is None else run.job.started_ms
            self._trace.finished(
                run.message, run.spec.name, self.group, how, reason, started, self._clock_ms()
            )
        return self._settler.settle(run.message, how, reason, delay_ms)

    def _not_started(self, run: Run, reason: str, delay_ms: int) -> str:
        """Give ``run``'s message back for ``delay_ms`` without counting an attempt."""
        assert self._consumer is not None
        m = run.message
        if self._trace is not None:
            self._trace.finished(m, run.spec.name, self.group, "release", reason, None,
                                 self._clock_ms())  # fmt: skip
        outcome = f"not started ({reason}); released, retry in {delay_ms} ms"
        try:
            if not self._consumer.release(m, delay_ms):
                outcome += " (the message was no longer in flight here: redelivered meanwhile)"
        except ChronoqError as e:
            outcome = f"release failed ({e}); the message will be redelivered"
        return outcome

    def _skipped(self, m: ReceivedMessage, executor: str, name: str) -> bool:
        """Ack (in this group) a job that another dispatcher runs; see :mod:`workers.routing`."""
        why = skip_reason(executor, self.executors)
        if why is None:
            return False
        assert self._settler is not None
        if self._trace is not None:
            self._trace.finished(m, name, self.group, "skip", why, None, self._clock_ms())
        self._settler.ack(m)
        self._count()
        self._log.debug("job %s msg=%s skipped in group %s: %s", name, m.msg_id, self.group, why)
        return True

    def _dead_now(self, m: ReceivedMessage, reason: str) -> None:
        assert self._settler is not None
        if self._trace is not None:
            self._trace.finished(m, None, self.group, "dead", reason, None, self._clock_ms())
        self._settler.settle(m, "dead", reason, 0)
        self._count()
        self._log.error("msg=%s dead-lettered: %s", m.msg_id, reason)

    def _count(self) -> None:
        with self._cv:
            self.processed += 1
            self._cv.notify_all()

    def _check_timeouts(self) -> int:
        """Fail the runs over their timeout; ms until the next may expire (capped at 1 s)."""
        now = time.monotonic()
        expired: list[Run] = []
        wait = 1.0
        with self._cv:
            for run in self._timed:
                job, timeout = run.job, run.spec.timeout or 0.0
                started = None if job is None else job.started_mono
                left = timeout if started is None else started + timeout - now
                if left <= 0:
                    expired.append(run)
                else:
                    wait = min(wait, left)
            expired = [r for r in expired if self._claim(r)]
        for run in expired:
            assert run.job is not None
            run.job.cancel("timeout")
            err = JobTimeout(run.spec.name, run.spec.timeout or 0.0)
            log_run(self._log, run.job, self._fail(run, err), now, err)
        return max(1, int(wait * 1000))


__all__ = ["DEFAULT_MAX_AWAITING", "App", "Dispatcher"]


def _handed_off(run: Run) -> bool:
    """Whether ``run``'s job was handed to a system that runs it on its own."""
    fut = run.future
    return (
        fut is not None
        and fut.done()
        and not fut.cancelled()
        and fut.exception() is None
        and isinstance(fut.result(), Handoff)
    )
