"""What ``app.schedules.list()`` and ``get()`` answer: :class:`ScheduleInfo`, and
the record of a ``@app.cron``/``@app.every`` job (:func:`def_of_cron`)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from scheduler.interval import IntervalTrigger
from scheduler.schedule_def import ScheduleDef
from scheduler.schedule_runs import LastRun
from scheduler.spec import CronSpec

#: How many next fire times a listing shows.
NEXT_TIMES = 3


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as listed: its definition, what comes next, where it is from.

    :param definition: the stored definition (for a cron job never paused, the
        code's, with version 0).
    :param next_fire_ms: its next fire times (epoch ms; empty when paused or ended).
    :param last_run: its last run as the dispatchers recorded it (a few seconds
        behind; see :mod:`scheduler.schedule_runs`), or ``None``.
    """

    definition: ScheduleDef
    next_fire_ms: tuple[int, ...]
    last_run: LastRun | None = None

    @property
    def name(self) -> str:
        """The schedule's name."""
        return self.definition.name

    @property
    def job(self) -> str:
        """The job it runs."""
        return self.definition.job

    @property
    def paused(self) -> bool:
        """Whether it is paused."""
        return self.definition.paused

    @property
    def source(self) -> str:
        """``"decorator"`` (``@app.cron``/``@app.every``) or ``"data"`` (``add``)."""
        return self.definition.source

    @property
    def version(self) -> int:
        """Incremented by each stored change (0: a cron job never changed at runtime)."""
        return self.definition.version

    @property
    def next_fire_times(self) -> tuple[datetime, ...]:
        """:attr:`next_fire_ms` as aware datetimes in the schedule's zone."""
        d = self.definition
        zone = ZoneInfo(d.tz)
        return tuple(datetime.fromtimestamp(t / 1000, zone) for t in self.next_fire_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (``chronoq schedules list --json``)."""
        d = self.definition
        doc = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)}
        doc["args"] = list(d.args)
        doc["trigger"] = d.describe()
        doc["next_fire_ms"] = list(self.next_fire_ms)
        doc["next_fire_times"] = [t.isoformat() for t in self.next_fire_times]
        last = self.last_run
        doc["last_run"] = None if last is None else dataclasses.asdict(last)
        return doc


def def_of_cron(spec: CronSpec, topic: str, **fields: Any) -> ScheduleDef:
    """The record of a ``@app.cron``/``@app.every`` job (``source="decorator"``)."""
    trigger = spec.trigger
    timing: dict[str, Any]
    if isinstance(trigger, IntervalTrigger):
        timing = {"every_ms": trigger.every_ms, "anchor_ms": trigger.anchor_ms}
    else:
        timing = {"cron": trigger.expr}
    return ScheduleDef(
        spec.name,
        spec.job.name,
        topic,
        tz=trigger.tz.key,
        misfire_grace_s=spec.misfire.grace_s,
        coalesce=spec.misfire.coalesce,
        max_catch_up=spec.misfire.max_catch_up,
        jitter_s=spec.jitter,
        max_running=spec.max_running,
        source="decorator",
        **timing,
        **fields,
    )


__all__ = ["NEXT_TIMES", "ScheduleInfo", "def_of_cron"]
