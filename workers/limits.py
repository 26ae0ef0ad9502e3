"""JobLimits: ``JobSpec.max_running`` and ``JobSpec.rate_limit`` as a dispatch hook.

Both limits hold across every dispatcher of the app because the broker keeps them
(:meth:`~broker_adapter.base.BrokerAdapter.acquire_slot` and
:meth:`~broker_adapter.base.BrokerAdapter.acquire_rate`, named ``job:<name>``).
A run over a limit waits: its message is released for later
(:attr:`~workers.settlement.Settlement.DEFER`: no attempt counted, never
dead-lettered); it never fails for it.

* ``max_running``: an admitted run holds one slot of ``job:<name>`` (its holder
  names the delivery) from its admission until it starts no more jobs, i.e. until
  its body returned, even when a timeout settled its message earlier (a stuck body
  still runs; as :class:`~workers.cron_gate.CronGate` counts). The slot's lease
  (the job's timeout, at least :data:`MIN_LEASE_MS`, else the consumer's invisible
  time) is renewed from :meth:`JobLimits.tick` once half of it passed, so the slot
  of a dispatcher killed with -9 frees itself one lease later.
* ``rate_limit``: an admitted run takes one permit of bucket ``job:<name>`` (one
  per message: a cron message that catches up several occurrences takes one).

No busy loop: a refused run comes back after what the broker said to wait (or a
slot's expected turn), and this dispatcher spaces the runs of one job it refuses
by the limit's interval (``period / limit``, or the job's held time / ``max_running``)
plus jitter, so it re-delivers about one waiting message per interval however long
the backlog is. Once the broker said "wait", the job's other messages are refused
here without asking it again until then (slots: for the rest of that pull). A job
at its limit blocks no other job: each message is admitted or released on its own.

A job without limits costs nothing: :func:`job_limits` returns no hook when no
registered job has one, and the hook asks the broker only for jobs that do.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker_adapter.base import DEFAULT_INVISIBLE_MS, BrokerAdapter
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import ChronoqError
from broker_adapter.results import ReceivedMessage
from scheduler.spec import JobSpec
from workers.hooks import DispatchHook, Session
from workers.runs import Run
from workers.settlement import Decision, Settlement

#: Prefix of the broker's rate buckets and semaphores of per-job limits.
LIMIT_PREFIX = "job:"
#: The shortest slot lease, ms (a job with a shorter timeout still gets this).
MIN_LEASE_MS = 1_000
#: Bounds on the spacing of one job's refused runs in one dispatcher, ms.
MIN_SPACING_MS, MAX_SPACING_MS = 5, 1_000
#: Spacing of a ``max_running`` job's refused runs before any of its runs ended here, ms.
DEFAULT_SLOT_SPACING_MS = 50
#: How soon a run refused because the broker failed comes back, ms.
BROKER_TROUBLE_MS = 1_000
#: Weight of the newest held time in a job's average (slot spacing).
_EWMA = 0.2


def has_limits(spec: JobSpec) -> bool:
    """Whether ``spec`` has a ``max_running`` or a ``rate_limit``."""
    return spec.max_running is not None or spec.rate_limit is not None


def job_limits(
    broker: BrokerAdapter,
    specs: Iterable[JobSpec],
    clock: Clock | None = None,
    log: logging.Logger | None = None,
) -> JobLimits | None:
    """The hook for ``specs``' limits, or ``None`` when none of them has one (then
    no job pays anything for the feature).

    :param broker: the app's broker (where the limits are kept).
    :param specs: the app's registered jobs.
    :param clock: the dispatcher's clock (see :class:`JobLimits`).
    :param log: where waits (DEBUG) and broker trouble (WARNING) go.
    """
    if not any(has_limits(s) for s in specs):
        return None
    return JobLimits(broker, clock=clock, log=log)


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


@dataclass(slots=True)
class _Held:
    """A slot held by one admitted run."""

    name: str
    limit: int
    holder: str
    lease_ms: int
    renew_at: float  # ms (the hook's clock)
    since: float  # ms, its admission


@dataclass(slots=True)
class _Pace:
    """One job's waiting, as this dispatcher sees it."""

    next_back_ms: float = 0.0  # the next free return time of a refused run
    rate_until_ms: float = 0.0  # the broker said the bucket is empty until then
    full_pull: int = -1  # the pull in which the broker said every slot is held
    held_ms: float | None = None  # average time a run held its slot here


class JobLimits(DispatchHook):
    """Admits a run only within its job's ``max_running`` and ``rate_limit``; else
    it waits (see the module docstring). Thread-safe.

    :param broker: the broker that keeps the limits.
    :param clock: the dispatcher's clock, for the waits and lease renewals (a
        :class:`~broker_adapter.clock.ManualClock` app waits in its own time, as its
        broker does); by default, or for a ``SystemClock``, monotonic time.
    :param lease_ms: the slot lease; by default the job's timeout (at least
        :data:`MIN_LEASE_MS`), else the consumer's invisible time.
    :param log: where waits (DEBUG) and broker trouble (WARNING) go.
    """

    def __init__(
        self,
        broker: BrokerAdapter,
        *,
        clock: Clock | None = None,
        lease_ms: int | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self._broker = broker
        self._now_ms: Callable[[], float] = (
            _monotonic_ms if clock is None or isinstance(clock, SystemClock) else clock.now_ms
        )
        self._lease_ms = lease_ms
        self._log = log or logging.getLogger("chronoq.workers.JobLimits")
        self._invisible_ms = DEFAULT_INVISIBLE_MS
        # Unique per dispatcher: a holder never collides with another process's.
        self._token = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._held: dict[Run, _Held] = {}
        self._paces: dict[str, _Pace] = {}
        self._pull = 0
        self._next_look = 0.0  # ms (the hook's clock): the next look at the leases
        self._rng = random.Random()

    def held(self) -> int:
        """Slots held by this dispatcher's runs now."""
        return len(self._held)

    # -- as a dispatch hook ---------------------------------------------------------------

    def on_open(self, session: Session) -> None:
        """Learn the consumer's invisible time (the default slot lease)."""
        self._invisible_ms = session.invisible_ms

    def on_pulled(self, messages: list[ReceivedMessage]) -> None:
        """A new pull: "every slot held" answers of the last one are stale."""
        self._pull += 1

    def admit(self, run: Run) -> str | Decision:
        """``""`` when ``run`` is within its job's limits (it then holds a slot or
        took a permit), else a :attr:`~workers.settlement.Settlement.DEFER` decision:
        release it for later."""
        spec = run.spec
        max_running, rate = spec.max_running, spec.rate_limit
        if max_running is None and rate is None:
            return ""
        name = LIMIT_PREFIX + spec.name
        now = self._now_ms()
        pace = self._paces.get(name)
        if pace is None:
            pace = self._paces[name] = _Pace()
        held = None
        if max_running is not None:
            spacing = self._slot_spacing(pace, max_running)
            if pace.full_pull == self._pull:
                return self._wait(run, pace, now, spacing, spacing, "max_running", max_running)
            m = run.message
            holder = f"{m.msg_id}/{m.attempts}@{self._token}"
            lease = self._lease_for(spec)
            try:
                taken = self._broker.acquire_slot(name, max_running, holder, lease)
            except ChronoqError as e:
                return self._trouble(run, "acquire_slot", e)
            if not taken:
                pace.full_pull = self._pull
                return self._wait(run, pace, now, spacing, spacing, "max_running", max_running)
            held = _Held(name, max_running, holder, lease, now + lease / 2, now)
        if rate is not None:
            interval = rate.interval_ms
            wait_ms = pace.rate_until_ms - now
            if wait_ms <= 0:
                try:
                    wait_ms = self._broker.acquire_rate(name, rate.limit, rate.period_ms)
                except ChronoqError as e:
                    self._give_back(held)
                    return self._trouble(run, "acquire_rate", e)
                if wait_ms > 0:
                    pace.rate_until_ms = now + wait_ms
            if wait_ms > 0:
                self._give_back(held)
                return self._wait(run, pace, now, wait_ms, interval, "rate_limit", rate)
        if held is not None:
            with self._lock:
                self._held[run] = held
                # The next look may have been planned for longer leases than this one.
                self._next_look = min(self._next_look, held.renew_at)
        return ""

    def after_run(self, run: Run) -> None:
        """``run`` starts no more jobs: give its slot back (if it holds one)."""
        if not self._held:
            return
        with self._lock:
            held = self._held.pop(run, None)
        if held is None:
            return
        pace = self._paces.get(held.name)
        if pace is not None:
            took = self._now_ms() - held.since
            pace.held_ms = (
                took if pace.held_ms is None else pace.held_ms + _EWMA * (took - pace.held_ms)
            )
            pace.full_pull = -1  # a slot just freed
        self._give_back(held)

    def tick(self) -> int | None:
        """Renew the leases due for it; ms until the next look, or ``None`` when no
        slot is held here."""
        if not self._held:
            return None
        now = self._now_ms()
        if now < self._next_look:
            return max(1, int(self._next_look - now))
        with self._lock:
            due = [h for h in self._held.values() if h.renew_at <= now]
            for h in due:
                h.renew_at = now + h.lease_ms / 2
            shortest = min(h.lease_ms for h in self._held.values()) if self._held else 4000
        for h in due:
            try:
                if not self._broker.acquire_slot(h.name, h.limit, h.holder, h.lease_ms):
                    self._log.warning(
                        "%s: the slot of %s expired and all %d are held now; its run goes on",
                        h.name,
                        h.holder,
                        h.limit,
                    )
            except ChronoqError as e:  # the lease may expire: the limit is then loose
                self._log.warning("%s: renewing the slot of %s failed (%s)", h.name, h.holder, e)
        # Look every quarter lease (at most every second): a renewal comes before
        # 3/4 of the lease passed (as the invisibility keeper extends messages).
        step = min(1000.0, shortest / 4)
        self._next_look = now + step
        return max(1, int(step))

    def on_close(self) -> None:
        """The dispatcher left: give back the slots still held (runs the drain gave
        up on), rather than let them block the job for a lease."""
        with self._lock:
            rest = list(self._held.values())
            self._held.clear()
        for held in rest:
            self._give_back(held)

    # -- helpers ----------------------------------------------------------------------------

    def _lease_for(self, spec: JobSpec) -> int:
        if self._lease_ms is not None:
            return self._lease_ms
        if spec.timeout is None:
            return self._invisible_ms
        return min(self._invisible_ms, max(MIN_LEASE_MS, int(spec.timeout * 1000)))

    @staticmethod
    def _slot_spacing(pace: _Pace, max_running: int) -> float:
        if pace.held_ms is None:
            return DEFAULT_SLOT_SPACING_MS
        return min(MAX_SPACING_MS, max(MIN_SPACING_MS, pace.held_ms / max_running))

    def _wait(
        self,
        run: Run,
        pace: _Pace,
        now_ms: float,
        base_ms: float,
        spacing_ms: float,
        what: str,
        limit: object,
    ) -> Decision:
        """Release ``run`` to come back after ``base_ms`` at the earliest, behind the
        job's runs refused here before (one per ``spacing_ms``), plus jitter."""
        spacing_ms = min(MAX_SPACING_MS, max(MIN_SPACING_MS, spacing_ms))
        back = max(now_ms + base_ms, pace.next_back_ms)
        pace.next_back_ms = back + spacing_ms
        delay = int(back - now_ms + self._rng.random() * spacing_ms) + 1
        reason = f"waits for {what}={limit}; back in {delay} ms, no attempt counted"
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("job %s msg=%s %s", run.spec.name, run.message.msg_id, reason)
        return Decision(Settlement.DEFER, reason, delay)

    def _trouble(self, run: Run, call: str, e: ChronoqError) -> Decision:
        """The broker failed: the limit cannot be checked, so the run waits."""
        self._log.warning(
            "job %s msg=%s: %s failed (%s)", run.spec.name, run.message.msg_id, call, e
        )
        return Decision(Settlement.DEFER, f"{call} failed ({e})", BROKER_TROUBLE_MS)

    def _give_back(self, held: _Held | None) -> None:
        if held is None:
            return
        try:
            self._broker.release_slot(held.name, held.holder)
        except ChronoqError as e:  # it frees itself when its lease expires
            self._log.warning("%s: releasing the slot of %s failed (%s)", held.name, held.holder, e)


__all__ = [
    "BROKER_TROUBLE_MS",
    "LIMIT_PREFIX",
    "MIN_LEASE_MS",
    "JobLimits",
    "has_limits",
    "job_limits",
]
