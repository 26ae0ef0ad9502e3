"""The :class:`CronPlanner`: one pending message per schedule occurrence, armed ahead.

It plans both kinds of schedule alike, through a :class:`~scheduler.plan.Plan`
(the message format is described there): the ``@app.cron``/``@app.every`` jobs of
the registry, and the stored schedules of ``app.schedules``
(:mod:`scheduler.schedules`), whose definitions live in the broker
(:mod:`scheduler.schedule_store`). Triggers are cron expressions or intervals
(:data:`~scheduler.interval.Trigger`).

Why arming is idempotent: the broker stores at most one pending message per key
(``cron:<name>:<fire_ms>``), and also refuses a key whose last message already
fired at the very same due millisecond. So arming an occurrence twice, from two
:class:`Scheduler` objects, two processes sharing a broker, or a restarted
process, stores it once and fires it once.

The life of a schedule:

1. :meth:`CronPlanner.arm_all` at start-up (and every ``arm_interval_s`` in
   ``chronoq run``) arms each schedule's next occurrence after now, except the
   paused ones: it reads the stored state (one listing of the records), so a
   paused decorator cron stays paused across restarts.
2. When an occurrence is delivered, the dispatcher calls :meth:`CronPlanner.fire`
   *before* running the job (and acks after). The planner checks the occurrence
   against the schedule as stored now (see below), arms the next occurrence
   after now and applies the misfire policy
   (:func:`~scheduler.misfire.resolve_misfires`) to the occurrences from the
   delivered one up to now. It returns what to run (usually ``[fire_ms]``).
3. Because the next occurrence is armed before the job runs, a crash mid-run
   loses no future occurrence; the unacked message is delivered again (at least
   once), and the repeated ``fire`` arms nothing new. A redelivery runs only its
   own occurrence: what it would catch up after it goes to messages of their own
   (:class:`~scheduler.catch_up.CatchUp`), since another process may have run those
   already.

Checks at fire time (one ``query`` point lookup of the schedule's record per
occurrence; the record is read and parsed again only when it changed):

* a paused schedule's occurrence runs nothing and arms nothing;
* a stored schedule's occurrence runs only if it stands for one of the current
  definition's occurrences (same topic, a fire time of the current trigger
  within its window); otherwise it was armed from an earlier version and is
  dropped, and the current version's next occurrence is armed (idempotent). One
  that does stand for a current occurrence but carries an earlier version's
  arguments runs with the current ones: its key is that occurrence's, so the
  current version could not arm its own message for that time;
* a removed schedule's occurrence (the message says it belongs to a stored
  schedule) runs nothing.

Hence the guarantees of ``app.schedules`` (see :mod:`scheduler.schedules`): a
change takes effect from the next occurrence, with no dispatcher restart; an
occurrence already being run when the change is made finishes as it was.

With ``jitter``, lateness is measured from the latest possible jittered time:
the grace is extended by the jitter, so a jittered run is never a misfire.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_adapter.errors import UnknownTopic
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, SendResult, SendStatus
from scheduler.armed import ArmedOccurrences
from scheduler.catch_up import LEFT_TO_OWN_MESSAGES, MISFIRE_SKIPPED, CatchUp
from scheduler.errors import JobNotFound
from scheduler.jobcall import JobCall
from scheduler.plan import Plan, jitter_ms
from scheduler.schedule_def import ScheduleDef
from scheduler.schedule_store import ScheduleStore
from scheduler.spec import CronSpec, JobSpec, cron_key, parse_cron_key

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

_log = logging.getLogger("chronoq.scheduler.CronPlanner")

#: Occurrences armed per ``send_batch`` (big batches stall the broker's wheel).
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Firing:
    """What :meth:`CronPlanner.fire` decided for one delivered occurrence.

    :param spec: the schedule to run (``None``: run nothing).
    :param run: the occurrence times to run now (epoch ms, ascending).
    :param reason: why nothing runs (``""`` when something does).
    :param dead: whether the message should go to the dead-letter topic (its job
        is unknown here) rather than be dropped quietly.
    :param call: the call to run instead of the message's body (an occurrence
        armed by an earlier version of a stored schedule, at a time the current
        version has too: it runs with the current arguments).
    """

    spec: CronSpec | None
    run: tuple[int, ...] = ()
    reason: str = ""
    dead: bool = False
    call: JobCall | None = None


class CronPlanner:
    """Arms the occurrences of an app's schedules and decides what a delivery runs.

    Safe to use from several threads, and from several processes or
    :class:`~scheduler.scheduler.Scheduler` objects on one broker.

    :param app: the scheduler whose registry, settings, clock and broker it uses.
    """

    def __init__(self, app: Scheduler) -> None:
        self._app = app
        #: Occurrences this planner armed (or found armed), per plan series.
        self.armed = ArmedOccurrences()
        self._catch_up = CatchUp(self.armed, self._send)
        self._cron_plans: dict[str, tuple[CronSpec, Plan]] = {}
        self._def_plans: dict[str, tuple[ScheduleDef, Plan]] = {}
        self._def_specs: dict[str, tuple[Plan, JobSpec, CronSpec]] = {}
        #: The stored schedules (and decorator schedules' paused state).
        self.store = ScheduleStore(lambda: app.broker, lambda: app.clock.now_ms())

    # -- plans and messages -------------------------------------------------------------

    def plan_of_cron(self, spec: CronSpec) -> Plan:
        """The plan of a ``@app.cron``/``@app.every`` job (cached)."""
        topic = spec.job.topic_or(self._app.settings.topic)
        cached = self._cron_plans.get(spec.name)
        if cached is not None and cached[0] is spec and cached[1].topic == topic:
            return cached[1]
        plan = Plan.of_cron(spec, topic)
        self._cron_plans[spec.name] = (spec, plan)
        return plan

    def plan_of_def(self, d: ScheduleDef) -> Plan:
        """The plan of a stored schedule (cached per definition).

        :raises InvalidSchedule: for a definition that no longer parses.
        """
        cached = self._def_plans.get(d.name)
        if cached is not None and (cached[0] is d or cached[0] == d):
            return cached[1]
        plan = Plan.of_def(d)
        self._def_plans[d.name] = (d, plan)
        self.armed.forget(d.name)  # what other versions armed
        return plan

    def message(self, spec: CronSpec, fire_ms: int) -> Message:
        """The message of cron job ``spec``'s occurrence at ``fire_ms``."""
        return self.plan_of_cron(spec).message(fire_ms)

    def parse(self, key: str | None) -> tuple[str, int] | None:
        """``(name, fire_ms)`` when ``key`` is an occurrence key of a cron job
        registered here, else ``None`` (a plain job's message)."""
        if not key:
            return None
        parsed = parse_cron_key(key)
        if parsed is None or self._app.registry.find_cron(parsed[0]) is None:
            return None
        return parsed

    # -- arming -------------------------------------------------------------------------

    def _send(self, occurrences: list[tuple[Plan, int]]) -> list[SendResult]:
        """Arm ``occurrences`` in batches and remember them; returns the results."""
        results: list[SendResult] = []
        broker = self._app.broker
        for i in range(0, len(occurrences), _CHUNK):
            chunk = occurrences[i : i + _CHUNK]
            sent = broker.send_batch([plan.message(t) for plan, t in chunk])
            results.extend(sent)
            for (plan, fire_ms), result in zip(chunk, sent, strict=True):
                self.armed.add(plan.series, fire_ms)
                if _log.isEnabledFor(logging.DEBUG):
                    _log.debug(
                        "%s %s at %s (msg %s)",
                        "armed" if result.status is SendStatus.OK else "already armed",
                        plan.key(fire_ms),
                        plan.trigger.local(fire_ms).isoformat(),
                        result.msg_id,
                    )
        return results

    def arm(self, plan: Plan, now_ms: int | None = None) -> int | None:
        """Arm ``plan``'s next occurrence after ``now_ms`` (idempotent); returns its
        fire time, or ``None`` when the schedule has ended."""
        now = self._app.clock.now_ms() if now_ms is None else now_ms
        nxt = plan.next_after(now)
        if nxt is not None:
            self._send([(plan, nxt)])
        return nxt

    def disarm(self, name: str, topic: str) -> int:
        """Abort every pending occurrence of schedule ``name`` on ``topic`` (only keys
        of exactly that name: ``cron:a:`` is also a prefix of schedule ``a:b``'s keys);
        returns how many were aborted."""
        broker = self._app.broker
        prefix = cron_key(name, 0)[:-1]
        keys: list[str] = []
        cursor: str | None = None
        try:
            while True:
                page = broker.find_pending(topic, key_prefix=prefix, limit=500, cursor=cursor)
                for view in page.messages:
                    parsed = parse_cron_key(view.key or "")
                    if parsed is not None and parsed[0] == name:
                        keys.append(view.key or "")
                cursor = page.cursor
                if cursor is None:
                    break
        except UnknownTopic:
            return 0
        aborted = sum(broker.abort(key=k, topic=topic).status is AbortStatus.ABORTED for k in keys)
        self.armed.forget(name)
        return aborted

    def arm_all(self, now_ms: int | None = None) -> int:
        """Make sure every schedule's next occurrence after ``now_ms`` is armed: the
        registry's cron jobs (but the paused ones) and the stored schedules that
        are not paused. Reads the stored records once (and keeps them from ever
        falling due); arms in batches what this planner has not armed itself.
        Idempotent: an occurrence already armed (by this or any other scheduler on
        the broker) is not armed again.

        :param now_ms: epoch ms; the app's clock by default.
        :returns: how many occurrences were newly armed.
        """
        now = self._app.clock.now_ms() if now_ms is None else now_ms
        stored = self.store.read_all()
        records = {s.definition.name: s.definition for s in stored}
        plans: list[Plan] = []
        for spec in self._app.registry.crons():
            record = records.pop(spec.name, None)
            if record is None or record.source != "decorator" or not record.paused:
                plans.append(self.plan_of_cron(spec))
        for d in records.values():
            if d.source == "data" and not d.paused:
                plans.append(self.plan_of_def(d))
        if stored:
            self.store.keep_alive(stored)
        # Only what this planner has not armed itself: the broker would answer
        # DUPLICATE anyway, but with thousands of schedules the sends add up.
        occurrences = [
            (p, t)
            for p in plans
            if (t := p.next_after(self._floor(p, now))) is not None
            and not self.armed.knows(p.series, t)
        ]
        return sum(r.status is SendStatus.OK for r in self._send(occurrences))

    def _floor(self, plan: Plan, now_ms: int) -> int:
        """Where :meth:`arm_all` looks for ``plan``'s next occurrence: after ``now_ms``,
        but not before the latest occurrence this planner armed. After the clock stepped
        back, the occurrences in between already ran (or came before the schedule ran at
        all); arming one would run it at once, early."""
        latest = self.armed.latest(plan.series)
        return now_ms if latest is None else max(now_ms, latest - 1)

    # -- firing -------------------------------------------------------------------------

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
        """The occurrence ``fire_ms`` of schedule ``name`` was delivered at ``now_ms``:
        check it against the schedule as stored now, arm the next occurrence and say
        what to run (see the module docstring). Call it before running the job
        (and ack after), once per delivery; calling it again arms nothing new.

        :param topic: the message's topic.
        :param body: the message's body.
        :param stored: whether the message says it is a stored schedule's occurrence
            (:data:`~scheduler.plan.SCHEDULE_PROPERTY`).
        :param redelivery: whether this is not the message's first delivery: then the
            occurrences after its own that it would catch up go to messages of their
            own (see :class:`~scheduler.catch_up.CatchUp`).
        :returns: ``None`` when ``name`` is no schedule and the message is no stored
            schedule's occurrence (a plain job's message with a ``cron:`` key).
        """
        cron = self._app.registry.find_cron(name)
        if cron is not None:
            record = self.store.current(name)
            if record is not None and record.source == "decorator" and record.paused:
                return Firing(None, reason="paused")
            run, why = self._fire_plan(self.plan_of_cron(cron), fire_ms, now_ms, redelivery)
            return Firing(cron, run, why)
        if not stored:
            return None
        d = self.store.current(name)
        if d is None or d.source != "data":
            self._forget(name)
            return Firing(None, reason="its schedule was removed")
        if d.paused:
            return Firing(None, reason=f"paused (version {d.version})")
        plan = self.plan_of_def(d)
        if not plan.owns(fire_ms, topic):
            self.arm(plan, max(now_ms, fire_ms))
            return Firing(None, reason=f"armed by an earlier version (now version {d.version})")
        run, why = self._fire_plan(plan, fire_ms, now_ms, redelivery)
        job = self._app.registry.find(d.job)
        if job is None:
            unknown = f"unknown job: {JobNotFound(d.job, self._app.registry.names())}"
            return Firing(None, reason=unknown, dead=True)
        call = None if body == plan.body else d.call()
        return Firing(self._spec_of(d, plan, job), run, why, call=call)

    def _forget(self, name: str) -> None:
        """Drop what is cached of a stored schedule that is gone."""
        self._def_plans.pop(name, None)
        self._def_specs.pop(name, None)
        self.armed.forget(name)

    def _spec_of(self, d: ScheduleDef, plan: Plan, job: JobSpec) -> CronSpec:
        cached = self._def_specs.get(d.name)
        if cached is not None and cached[0] is plan and cached[1] is job:
            return cached[2]
        spec = CronSpec(job, plan.trigger, d.misfire(), d.max_running, d.jitter_s, d.name)
        self._def_specs[d.name] = (plan, job, spec)
        return spec

    def on_fired(
        self, name: str, fire_ms: int, now_ms: int, *, redelivery: bool = False
    ) -> list[int]:
        """The occurrence ``fire_ms`` of cron job ``name`` (``@app.cron``/``@app.every``)
        was delivered at ``now_ms``: arm the next occurrence and say which
        occurrences to run now (:meth:`fire` for a cron job, as a list).

        :returns: occurrence times (epoch ms, ascending) to run now: ``[fire_ms]``
            when on time; after a gap, what the misfire policy keeps of the
            occurrences from ``fire_ms`` up to ``now_ms`` (an occurrence this
            planner knows has its own message is left to that message); empty when
            all of them are beyond grace (logged as skipped), or when it is paused.
        :raises JobNotFound: when no cron job has that name.
        """
        cron = self._app.registry.find_cron(name)
        if cron is None:
            raise JobNotFound(name, [c.name for c in self._app.registry.crons()])
        plan = self.plan_of_cron(cron)
        firing = self.fire(
            name,
            fire_ms,
            now_ms,
            topic=plan.topic,
            body=plan.body,
            stored=False,
            redelivery=redelivery,
        )
        return [] if firing is None else list(firing.run)

    def _fire_plan(
        self, plan: Plan, fire_ms: int, now_ms: int, redelivery: bool
    ) -> tuple[tuple[int, ...], str]:
        """Arm ``plan``'s next occurrence and apply its misfire policy
        (:meth:`CatchUp.decide <scheduler.catch_up.CatchUp.decide>`): returns what to
        run here, and why nothing runs when nothing does."""
        now = max(now_ms, fire_ms)
        nxt = plan.next_after(now)
        if nxt is not None:
            self._send([(plan, nxt)])
        return self._catch_up.decide(plan, fire_ms, now, redelivery)


__all__ = ["LEFT_TO_OWN_MESSAGES", "MISFIRE_SKIPPED", "CronPlanner", "Firing", "jitter_ms"]
