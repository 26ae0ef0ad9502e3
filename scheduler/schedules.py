"""Schedules as data: ``app.schedules`` adds, changes, pauses and removes schedules
while the app runs.

::

    app.schedules.add("tenant-42", sync_tenant, every=timedelta(minutes=1), args=(42,))
    app.schedules.add("report", nightly, cron="0 5 * * *", tz="Asia/Shanghai")
    app.schedules.update("tenant-42", every=timedelta(minutes=5))
    app.schedules.pause("tenant-42"); app.schedules.resume("tenant-42")
    app.schedules.run_now("report")       # one extra run now; the regular ones stay
    for s in app.schedules.list(): print(s.name, s.paused, s.next_fire_times)
    app.schedules.remove("tenant-42")

Definitions are stored in the broker (:mod:`scheduler.schedule_store`), so every
process of the app sees the same schedules and they survive restarts; the
dispatchers pick a change up at the next occurrence (:mod:`scheduler.cron`). The
``@app.cron``/``@app.every`` jobs are listed too and can be paused and resumed
(their paused state is stored the same way, so it holds across restarts until
resumed); their timing is the code's, so ``update`` and ``remove`` refuse them.

Guarantees (``memory://`` is not durable; everything else holds on every broker):

* **add** is atomic: the record is created with a keyed send, so two processes
  adding one name get one schedule and one :class:`DuplicateSchedule`. Its first
  occurrence is armed at once.
* **update** replaces the record in one step (``reschedule`` with the new body),
  then aborts the pending occurrences and arms the new version's next one. An
  occurrence already delivered (being run) when the update lands runs as it was;
  one armed from the old version afterwards (by a dispatcher that was arming it
  at that moment) is checked at its fire time against the record: at a time the
  new version has too, it runs with the new arguments; otherwise it is dropped
  and the new version's next occurrence armed. So from the next occurrence on,
  every run follows the new definition. Two concurrent updates of one schedule:
  the last write wins (no merge).
* **pause** stores ``paused`` then aborts the pending occurrences: nothing is
  armed or run for it afterwards (an occurrence already being run finishes).
  **resume** stores it un-paused and arms the next occurrence after now; the
  occurrences due while paused are not caught up.
* **remove** deletes the record, then aborts the pending occurrences; a
  straggler is dropped at its fire time (its message says it belongs to a
  stored schedule, and there is none).
* Two dispatchers (or two processes arming) never fire one occurrence twice:
  occurrence keys are idempotent (:mod:`scheduler.plan`).
* ``run_now`` sends one plain run of the job now (not an occurrence: the misfire
  policy and ``max_running`` do not apply to it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from broker_adapter.message import Message
from broker_adapter.results import SendResult
from scheduler.errors import DuplicateSchedule, InvalidSchedule, ScheduleNotFound
from scheduler.plan import Plan
from scheduler.schedule_def import ScheduleDef
from scheduler.schedule_info import NEXT_TIMES, ScheduleInfo, def_of_cron
from scheduler.schedule_options import def_from_options
from scheduler.schedule_runs import LastRun, RunBook
from scheduler.schedule_store import StoredSchedule
from scheduler.spec import DEFAULT_MAX_CATCH_UP, Coalesce, CronSpec

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler


class Schedules:
    """``app.schedules``: schedules stored in the broker; see the module docstring.

    Works on an app without the jobs' code too (as ``chronoq schedules`` does with
    a bare :class:`~scheduler.Scheduler`): everything but ``add`` and ``update``
    needs only the stored records.

    :param app: the app whose broker, clock, registry and planner it uses.
    """

    def __init__(self, app: Scheduler) -> None:
        self._app = app
        self._planner = app.planner
        self._store = app.planner.store
        self._runs = RunBook(lambda: app.broker, lambda: app.clock.now_ms())

    def _job_topic(self, job: str) -> tuple[str, str]:
        spec = self._app.registry.get(job)  # raises JobNotFound
        return spec.name, spec.topic_or(self._app.settings.topic)

    def _now(self) -> int:
        return self._app.clock.now_ms()

    def _topic(self, spec: CronSpec) -> str:
        return spec.job.topic_or(self._app.settings.topic)

    def _info(
        self, d: ScheduleDef, plan: Plan | None = None, last: LastRun | None = None
    ) -> ScheduleInfo:
        times: list[int] = []
        if not d.paused:
            plan = plan or self._planner.plan_of_def(d)
            t: int | None = self._now()
            while len(times) < NEXT_TIMES and t is not None:
                t = plan.next_after(t)
                if t is not None:
                    times.append(t)
        return ScheduleInfo(d, tuple(times), last)

    def _info_of(
        self, name: str, stored: StoredSchedule | None, last: LastRun | None = None
    ) -> ScheduleInfo:
        cron = self._app.registry.find_cron(name)
        if cron is not None:
            plan = self._planner.plan_of_cron(cron)
            d = stored.definition if stored is not None else None
            if d is None or d.source != "decorator":
                return self._info(def_of_cron(cron, plan.topic, version=0), plan, last)
            return self._info(d, plan, last)
        if stored is None:
            raise ScheduleNotFound(name, [c.name for c in self._app.registry.crons()])
        return self._info(stored.definition, None, last)

    # -- reading ------------------------------------------------------------------------

    def get(self, name: str) -> ScheduleInfo:
        """Schedule ``name``: a stored one, or a cron job of this app.

        :raises ScheduleNotFound: when there is none.
        """
        return self._info_of(name, self._store.read(name), self._runs.read().get(name))

    def list(self) -> list[ScheduleInfo]:
        """Every schedule, sorted by name: the stored ones and this app's cron jobs
        (one listing of the records, one of the last runs)."""
        stored = {s.definition.name: s for s in self._store.read_all()}
        runs = self._runs.read()
        names = set(stored) | {c.name for c in self._app.registry.crons()}
        return [self._info_of(n, stored.get(n), runs.get(n)) for n in sorted(names)]

    # -- adding and changing ------------------------------------------------------------

    def add(
        self,
        name: str,
        job: Any,
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        anchor: datetime | int | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        tz: str = "UTC",
        start: datetime | int | None = None,
        end: datetime | int | None = None,
        misfire_grace_time: float | timedelta | None = None,
        coalesce: Coalesce = "latest",
        max_catch_up: int = DEFAULT_MAX_CATCH_UP,
        jitter: float | timedelta | None = None,
        max_running: int = 1,
        paused: bool = False,
    ) -> ScheduleInfo:
        """Add schedule ``name`` running ``job`` on a cron expression or an interval,
        and arm its first occurrence.

        :param name: unique among the app's schedules and cron jobs (no whitespace).
        :param job: a job handle of this app, or a registered job's name.
        :param cron: a cron expression (see :class:`~scheduler.triggers.CronTrigger`) ...
        :param every: ... or an interval (timedelta or seconds, at least 1 s).
        :param anchor: an interval's anchor (aware datetime or epoch ms; the Unix epoch
            by default): it fires at ``anchor + n * every``.
        :param args: positional arguments of each run (JSON data).
        :param kwargs: keyword arguments of each run (JSON data).
        :param tz: the cron expression's zone (an interval's display zone).
        :param start: no occurrence before this (aware datetime or epoch ms).
        :param end: no occurrence after this.
        :param misfire_grace_time: see ``@app.cron``.
        :param coalesce: see ``@app.cron``.
        :param max_catch_up: see ``@app.cron``.
        :param jitter: see ``@app.cron``.
        :param max_running: how many runs of it may overlap (per dispatcher, as for cron).
        :param paused: add it paused (nothing armed until :meth:`resume`).
        :raises DuplicateSchedule: when the name is taken (nothing changed).
        :raises JobNotFound: when ``job`` is not registered in this app.
        :raises InvalidSchedule: for options that cannot work (nothing stored).
        :raises InvalidCron: for a bad cron expression or zone.
        :raises UnserializableArgument: for an argument JSON cannot carry.
        """
        if self._app.registry.find_cron(name) is not None:
            raise DuplicateSchedule(name, "a cron job of this app")
        options: dict[str, Any] = {
            "job": job,
            "args": args,
            "kwargs": kwargs,
            "tz": tz,
            "start": start,
            "end": end,
            "misfire_grace_time": misfire_grace_time,
            "coalesce": coalesce,
            "max_catch_up": max_catch_up,
            "jitter": jitter,
            "max_running": max_running,
        }
        if cron is not None:
            options["cron"] = cron
        if every is not None:
            options["every"] = every
        if anchor is not None:
            if cron is not None:
                raise InvalidSchedule("anchor= goes with every=, not with cron=")
            options["anchor"] = anchor
        now = self._now()
        d = def_from_options(None, name, options, self._job_topic)
        d = dataclasses.replace(d, paused=bool(paused), created_ms=now, updated_ms=now)
        if not self._store.create(d):
            raise DuplicateSchedule(name, "a stored schedule")
        plan = self._planner.plan_of_def(d)
        if not d.paused:
            self._planner.arm(plan, now)
        return self._info(d, plan)

    def _stored(self, name: str) -> StoredSchedule:
        stored = self._store.read(name)
        if stored is None:
            raise ScheduleNotFound(name, [c.name for c in self._app.registry.crons()])
        return stored

    def update(self, name: str, **changes: Any) -> ScheduleInfo:
        """Change schedule ``name``: any of ``add``'s options but ``paused`` (use
        :meth:`pause`/:meth:`resume`). Takes effect from its next occurrence.

        :raises ScheduleNotFound: when there is no stored schedule of that name.
        :raises InvalidSchedule: for a cron job (its timing is in the code), an
            unknown option, or a value that cannot work (nothing changed).
        """
        stored = self._stored(name)
        old = stored.definition
        if old.source != "data":
            raise InvalidSchedule(
                f"{name!r} is an @app.cron/@app.every job: change it in the code (pause and "
                "resume work at runtime)"
            )
        if "anchor" in changes and changes.get("cron") is not None:
            raise InvalidSchedule("anchor= goes with every=, not with cron=")
        new = def_from_options(old, name, changes, self._job_topic)
        new = dataclasses.replace(new, version=old.version + 1, updated_ms=self._now())
        plan = self._planner.plan_of_def(new)  # raises before anything is stored
        if not self._store.write(new, stored):
            raise ScheduleNotFound(name)
        self._planner.disarm(name, old.topic)
        if new.topic != old.topic:
            self._planner.disarm(name, new.topic)
        if not new.paused:
            self._planner.arm(plan)
        return self._info(new, plan)

    # -- pausing ------------------------------------------------------------------------

    def _set_paused(self, name: str, paused: bool) -> ScheduleInfo:
        now = self._now()
        cron = self._app.registry.find_cron(name)
        for _ in range(3):  # a create racing another process's: read again
            stored = self._store.read(name)
            if stored is None:
                if cron is None:
                    raise ScheduleNotFound(name, [c.name for c in self._app.registry.crons()])
                d = def_of_cron(cron, self._topic(cron), paused=paused, created_ms=now)
                d = dataclasses.replace(d, updated_ms=now)
                if not paused:
                    break  # never paused: nothing to store
                if self._store.create(d):
                    break
                continue
            d = stored.definition
            if d.paused != paused:
                d = dataclasses.replace(d, paused=paused, version=d.version + 1, updated_ms=now)
                if not self._store.write(d, stored):
                    continue
            break
        else:
            raise ScheduleNotFound(name)
        plan = self._planner.plan_of_cron(cron) if cron is not None else Plan.of_def(d)
        if paused:
            self._planner.disarm(name, plan.topic)
        else:
            self._planner.arm(plan, now)
        return self._info(d, plan)

    def pause(self, name: str) -> ScheduleInfo:
        """Pause schedule ``name`` (a stored one or a cron job of this app): abort its
        pending occurrence, arm nothing until :meth:`resume`. Pausing a paused
        schedule changes nothing.

        :raises ScheduleNotFound: when there is none.
        """
        return self._set_paused(name, True)

    def resume(self, name: str) -> ScheduleInfo:
        """Resume schedule ``name``: arm its next occurrence after now (the ones due
        while paused are not caught up). Resuming a running schedule only makes
        sure its next occurrence is armed.

        :raises ScheduleNotFound: when there is none.
        """
        return self._set_paused(name, False)

    # -- removing and running -----------------------------------------------------------

    def remove(self, name: str) -> ScheduleInfo:
        """Remove stored schedule ``name`` and abort its pending occurrences; returns
        what it was.

        :raises ScheduleNotFound: when there is none.
        :raises InvalidSchedule: for a cron job of this app (remove it from the code,
            or pause it).
        """
        if self._app.registry.find_cron(name) is not None:
            raise InvalidSchedule(
                f"{name!r} is an @app.cron/@app.every job of this app: remove it from the "
                "code, or pause it"
            )
        stored = self._stored(name)
        self._store.delete(name)
        if stored.definition.source == "data":  # a cron job's occurrences are the code's
            self._planner.disarm(name, stored.definition.topic)
        return ScheduleInfo(stored.definition, ())

    def run_now(self, name: str) -> SendResult:
        """Send one extra run of schedule ``name``'s job, with its arguments, due now
        (its regular occurrences are unchanged; it runs even when paused).

        :raises ScheduleNotFound: when there is none.
        """
        d = self.get(name).definition
        body = Plan.of_def(d).body
        return self._app.broker.send(Message(d.topic, body, None, d.job))

    def publish_decorators(self) -> int:
        """Store a record for each cron job of this app that has none (so ``chronoq
        schedules list`` shows it from the broker alone), and refresh the copy of
        the trigger in the records that differ from the code (keeping their paused
        state). Returns how many records were written. ``chronoq run`` calls it at start.
        """
        stored = {s.definition.name: s for s in self._store.read_all()}
        now = self._now()
        written = 0
        for cron in self._app.registry.crons():
            s = stored.get(cron.name)
            want = def_of_cron(cron, self._topic(cron), created_ms=now, updated_ms=now)
            if s is None:
                written += self._store.create(want)
                continue
            old = s.definition
            if old.source != "decorator":
                continue  # a stored schedule of that name: the code's cron wins at dispatch
            same = dataclasses.replace(
                want,
                paused=old.paused,
                version=old.version,
                created_ms=old.created_ms,
                updated_ms=old.updated_ms,
            )
            if same != old:
                written += self._store.write(dataclasses.replace(same, updated_ms=now), s)
        return written


__all__ = ["ScheduleInfo", "Schedules"]
