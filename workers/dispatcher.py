"""Dispatcher: one member of a consumer group that runs due jobs.

The dispatcher pulls fired messages of the app's topics (long poll), decodes
each :class:`~scheduler.jobcall.JobCall`, looks up its
:class:`~scheduler.spec.JobSpec` and hands it to the job's executor. The outcome
is settled in the thread that finishes the job (a done callback), so the pull
loop does nothing per message but decode and submit. How a message is settled
(:class:`~workers.settlement.Settlement`):

* success: ``ACK``;
* an exception: as :class:`~workers.retry_decision.RetryDecider` decides: ``RETRY``
  with ``spec.retry.backoff_ms(attempt)`` while ``retry_on`` and ``max_attempts``
  allow, else ``DEAD`` with the error (``"ValueError: boom (attempt 3 of 3)"``, shown
  by ``broker.query(msg_id).error``); cron runs are not retried (the next occurrence
  is the retry); :class:`~workers.executors.base.JobNotStarted` (the executor could
  not start the job, e.g. its Celery broker is down): ``DEFER``, back after the
  backoff, not counted as an attempt;
* an unknown job or an undecodable body: ``DEAD`` with that reason;
* over ``spec.timeout`` (counted from the body's start): failed as above with
  :class:`~workers.context.JobTimeout`, and the job's cancel event is set (see
  :mod:`workers.context`; threads cannot be killed, so a stuck job keeps its
  pool thread until it returns, and keeps counting against the in-flight bound).

Cron messages (key ``cron:<name>:<fire_ms>``) go to ``app.planner.on_fired``,
which arms the next occurrence and says which occurrences to run now; they run
one after the other, at most ``CronSpec.max_running`` messages of one cron job at
a time (a fire while that many still run is skipped with a log line).

Flow control (:mod:`workers.inflight`): at most ``prefetch + max_workers`` jobs
are held at once (pulled, queued or running). A job handed to a system that
runs it on its own (a :class:`~workers.executors.base.Handoff`, e.g. published to
Celery) frees its slot at once; its message stays in flight until the outcome
settles it, and at most ``max_awaiting`` such outcomes are awaited at once. The
consumer is opened with ``max_inflight`` = slots + ``max_awaiting``.

Around the loop, hooks (:mod:`workers.hooks`) do the rest: the invisibility keeper
(a held message never comes back while its job waits or runs), the timeout watch,
the cron gate, the delivery trace, per-job limits (:mod:`workers.limits`, when a
job has ``max_running`` or ``rate_limit``), and any the caller passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Self

from broker_adapter.base import DEFAULT_INVISIBLE_MS
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import ConnectionFailed
from scheduler.spec import CRON_KEY_PREFIX
from workers.broker_outage import BrokerOutage
from workers.executors.base import Executor
from workers.executors.factory import default_executors
from workers.hooks import DispatchHook
from workers.inflight import InFlight
from workers.inline_runs import InlineRuns
from workers.limits import job_limits
from workers.pull_loop import PullLoop
from workers.routing import skip_reason, topics_for
from workers.runs import App

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
    :param executors: executor name to :class:`Executor`; by default the app's
        executors (:func:`~workers.executors.factory.default_executors`), owned (and
        shut down) by the dispatcher.
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
    :param hooks: more :class:`~workers.hooks.DispatchHook`\\ s, called after the
        built-in ones, in this order.
    :param inline_jobs: in :meth:`run_forever`, the pulling thread runs the local
        jobs of a pull itself (:mod:`workers.inline_runs`); ``False``: every job
        goes to the executor's threads; ``None``: ``Settings.inline_jobs``
        (``CHRONOQ_INLINE_JOBS``, on by default).
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
        hooks: Iterable[DispatchHook] = (),
        inline_jobs: bool | None = None,
    ) -> None:
        settings = app.settings
        self.app = app
        self.registry = app.registry
        self.group = group or settings.group
        self.prefetch = settings.prefetch if prefetch is None else prefetch
        self._own_executors = executors is None
        self.executors: dict[str, Executor] = (
            default_executors(app) if executors is None else dict(executors)
        )
        self.capacity = self.prefetch + settings.max_workers
        self.max_awaiting = max(1, max_awaiting)
        self.clock = clock or app.clock
        self._clock_ms = _wall_ms if isinstance(self.clock, SystemClock) else self.clock.now_ms
        self.invisible_ms = invisible_ms
        self.drain_timeout_s = drain_timeout_s
        self._trace = trace
        self._hooks = tuple(hooks)
        self.inline_jobs = settings.inline_jobs if inline_jobs is None else inline_jobs
        self._log = logging.getLogger("chronoq.workers.Dispatcher")
        self._flow = InFlight(self.capacity, self.max_awaiting)
        self._loop: PullLoop | None = None  # once joined (open)
        self._stop = threading.Event()
        self._closed = False

    @property
    def processed(self) -> int:
        """Messages settled so far (acked, retried, dead-lettered, released or skipped)."""
        return self._flow.processed

    @property
    def slots_taken(self) -> int:
        """Jobs submitted to an executor here and not yet returned or handed off."""
        return self._flow.slots_taken

    @property
    def awaiting(self) -> int:
        """Handed-off jobs whose outcome is awaited."""
        return self._flow.awaiting

    # -- life cycle -----------------------------------------------------------------------

    def open(self) -> PullLoop:
        """Join the consumer group (done by the run methods; idempotent).

        :returns: the joined loop (its ``consumer``, ``topics``, hooks...).
        """
        if self._loop is None:
            specs = list(self.registry)
            topics = topics_for(self.registry, self.app.settings.topic, self.executors)
            longest = max((s.timeout or 0.0 for s in specs), default=0.0)
            invisible = self.invisible_ms or max(DEFAULT_INVISIBLE_MS, int(longest * 2000) + 10_000)
            consumer = self.app.broker.consumer(
                self.group,
                topics,
                invisible_ms=invisible,
                max_attempts=max((s.max_attempts for s in specs), default=16),
                max_inflight=self.capacity + self.max_awaiting,
            )
            # Per-job limits (max_running, rate_limit): a hook only if a job has one.
            limits = job_limits(self.app.broker, specs, self.clock, self._log)
            for executor in self.executors.values():
                warm_up = getattr(executor, "warm_up", None)  # optional: see Executor
                if callable(warm_up):
                    warm_up()
            self._loop = PullLoop(
                self.app,
                consumer,
                group=self.group,
                topics=topics,
                invisible_ms=invisible,
                executors=self.executors,
                flow=self._flow,
                clock=self.clock,
                clock_ms=self._clock_ms,
                leaves=self._leaves,
                log=self._log,
                trace=self._trace,
                hooks=self._hooks if limits is None else (limits, *self._hooks),
            )
            self._log.info(
                "dispatcher joined group %s on %s (capacity %d, invisible %d ms)",
                self.group,
                ", ".join(topics),
                self.capacity,
                invisible,
            )
        return self._loop

    def _leaves(self, executor: str) -> str | None:
        """Why a job of ``executor`` is left to another dispatcher (:mod:`workers.routing`)."""
        return skip_reason(executor, self.executors)

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

        While the broker cannot be reached (a pull raises
        :class:`~broker_adapter.errors.ConnectionFailed`) it keeps pulling with
        back-off (:mod:`workers.broker_outage`) instead of returning.

        :param exit_when_idle: also return once nothing is ready, running or
            pending on the app's topics (cron occurrences aside).
        :param poll_ms: the longest a pull waits; bounds how soon a stop is seen.
        :returns: messages processed.
        """
        loop = self.open()
        stop = self._stop

        def stopping() -> bool:
            return stop.is_set() or (stop_event is not None and stop_event.is_set())

        inline = InlineRuns(loop, stopping, self.drain, self._log) if self.inline_jobs else None
        step = loop.step if inline is None else inline.step
        outage = BrokerOutage(self._log, f"group {self.group}")
        try:
            while not stopping():
                try:
                    got = step(poll_ms)
                except ConnectionFailed as e:  # the broker restarts or is cut off: wait
                    stop.wait(outage.failed(e))
                    continue
                outage.succeeded()
                if not got and exit_when_idle and self._idle(loop, any_pending=True):
                    break
        finally:
            if inline is not None:
                inline.close()
            self.drain()
        return self.processed

    def run_until_idle(self, timeout_s: float = 10.0, *, idle_ms: int = 50) -> int:
        """Process until nothing is ready, in flight, or due by ``clock``; for tests.

        Messages due later (by a ``ManualClock``) do not count: advance the
        clock and call again. Returns early at ``timeout_s`` (not an error).

        :returns: messages processed during this call.
        """
        loop = self.open()
        start = self.processed
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if loop.step(max(1, min(idle_ms, int(remaining * 1000)))):
                continue
            if self._idle(loop, any_pending=False):
                break
        return self.processed - start

    def drain(self, timeout_s: float | None = None) -> None:
        """Stop pulling, let running jobs finish for up to ``timeout_s`` (default
        ``drain_timeout_s``), release the rest for redelivery, leave the group."""
        self._stop.set()
        if self._closed:
            return
        self._closed = True
        released = 0
        if self._loop is not None:
            released = self._loop.drain(self.drain_timeout_s if timeout_s is None else timeout_s)
            self._loop.close()
        if self._own_executors:
            for executor in self.executors.values():
                executor.shutdown(wait=False)
        self._log.info("dispatcher stopped: %d processed, %d released", self.processed, released)

    def hurry(self) -> None:
        """Cut a drain short: release what still runs now (e.g. on a second Ctrl-C)."""
        self._stop.set()
        self._flow.hurry()

    def close(self) -> None:
        """Drain (see :meth:`drain`) and leave the group. Closing twice is harmless."""
        self.drain()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _idle(self, loop: PullLoop, *, any_pending: bool) -> bool:
        """No unsettled run, and nothing due now (or, with ``any_pending``, at all)."""
        if len(self._flow):
            return False
        broker = self.app.broker
        end = None if any_pending else self.clock.now_ms() + 1
        for topic in loop.topics:
            for view in broker.pending(topic=topic, end_ms=end, limit=1000):
                if not any_pending or not (view.key or "").startswith(CRON_KEY_PREFIX):
                    return False
        return True


__all__ = ["DEFAULT_MAX_AWAITING", "App", "Dispatcher"]
