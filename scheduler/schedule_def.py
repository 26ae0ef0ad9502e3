"""A schedule's stored definition: :class:`ScheduleDef` and its JSON form.

One definition per schedule name, stored in the broker (see
:mod:`scheduler.schedule_store`), so every process of an app reads the same one.
It holds everything needed to arm and show the schedule without the app's code:
the job's name and topic, the trigger (a cron expression or an interval), the
arguments, the time window, the misfire options, ``paused`` and a ``version``
that each change increments. The JSON body::

    {"f": 1, "name": "tenant-42", "job": "shop.sync", "topic": "chronoq",
     "cron": null, "every_ms": 60000, "anchor_ms": 0, "tz": "UTC",
     "args": [42], "kwargs": {}, "start_ms": null, "end_ms": null,
     "misfire_grace_s": null, "coalesce": "latest", "max_catch_up": 100,
     "jitter_s": null, "max_running": 1, "paused": false, "version": 3,
     "source": "data", "created_ms": 1700000000000, "updated_ms": 1700000100000}

``source`` is ``"data"`` for a schedule added with ``app.schedules.add`` and
``"decorator"`` for the record of an ``@app.cron``/``@app.every`` job, which the
code defines: its record only carries the paused state (and a copy of the
trigger, for listing from the broker alone).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from broker_adapter.errors import DecodeError
from scheduler.errors import InvalidSchedule, SchedulerError
from scheduler.interval import IntervalTrigger, Trigger, format_span
from scheduler.jobcall import JobCall
from scheduler.spec import (
    DEFAULT_MAX_CATCH_UP,
    Coalesce,
    MisfirePolicy,
    check_job_name,
)
from scheduler.triggers import CronTrigger

#: Version of the stored JSON; readers refuse others.
FORMAT = 1
Source = Literal["data", "decorator"]
SOURCES: tuple[str, ...] = ("data", "decorator")


def check_schedule_name(name: object) -> str:
    """Return ``name`` if it can name a schedule (as a job name: non-empty, at most
    256 printable characters, no whitespace), else raise :class:`InvalidSchedule`."""
    try:
        return check_job_name(name)
    except SchedulerError as e:
        raise InvalidSchedule(f"schedule name {name!r}: {e}".replace("job name", "name")) from None


def _int_or_none(field_name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidSchedule(f"{field_name}={value!r}: give epoch ms (an int >= 0) or None")
    return value


@dataclass(frozen=True, slots=True)
class ScheduleDef:
    """One schedule as stored; validated at construction (not hashable: args are data).

    :param name: the schedule's name (unique per app).
    :param job: the job it runs.
    :param topic: the topic its occurrences go to (the job's topic when added).
    :param cron: a cron expression, or ``None`` for an interval.
    :param every_ms: the interval in ms, or ``None`` for a cron expression.
    :param anchor_ms: the interval's anchor (epoch ms).
    :param tz: the cron expression's time zone (for an interval: how times are shown).
    :param args: positional arguments of each run (JSON data).
    :param kwargs: keyword arguments of each run (JSON data).
    :param start_ms: no occurrence before this time (epoch ms), or ``None``.
    :param end_ms: no occurrence after this time (epoch ms), or ``None``.
    :param misfire_grace_s: see :class:`~scheduler.spec.MisfirePolicy`.
    :param coalesce: see :class:`~scheduler.spec.MisfirePolicy`.
    :param max_catch_up: see :class:`~scheduler.spec.MisfirePolicy`.
    :param jitter_s: up to this many seconds of deterministic delay per occurrence.
    :param max_running: how many runs of it may overlap in one dispatcher.
    :param paused: whether it is paused (no occurrence is armed or run).
    :param version: incremented by each change.
    :param source: ``"data"`` (``app.schedules.add``) or ``"decorator"``.
    :param created_ms: when it was added (epoch ms).
    :param updated_ms: when it last changed (epoch ms).
    :raises InvalidSchedule: for a field that cannot work (the message says which).
    :raises UnserializableArgument: for an argument JSON cannot carry.
    """

    name: str
    job: str
    topic: str
    cron: str | None = None
    every_ms: int | None = None
    anchor_ms: int = 0
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    start_ms: int | None = None
    end_ms: int | None = None
    misfire_grace_s: float | None = None
    coalesce: Coalesce = "latest"
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    jitter_s: float | None = None
    max_running: int = 1
    paused: bool = False
    version: int = 1
    source: Source = "data"
    created_ms: int = 0
    updated_ms: int = 0

    def __post_init__(self) -> None:
        check_schedule_name(self.name)
        if (self.cron is None) == (self.every_ms is None):
            raise InvalidSchedule(
                f"schedule {self.name!r}: give exactly one of cron='...' or every=timedelta(...)"
            )
        call = JobCall(self.job, tuple(self.args), dict(self.kwargs))  # checks name and args
        object.__setattr__(self, "args", call.args)
        object.__setattr__(self, "kwargs", dict(call.kwargs))
        self.trigger()  # raises InvalidCron / InvalidSchedule
        start, end = _int_or_none("start", self.start_ms), _int_or_none("end", self.end_ms)
        if start is not None and end is not None and end < start:
            raise InvalidSchedule(f"schedule {self.name!r}: end is before start")
        try:
            self.misfire()
        except SchedulerError as e:
            raise InvalidSchedule(f"schedule {self.name!r}: {e}") from None
        if self.jitter_s is not None and (
            isinstance(self.jitter_s, bool)
            or not isinstance(self.jitter_s, int | float)
            or not 0 <= self.jitter_s < 86400
        ):
            raise InvalidSchedule(f"jitter={self.jitter_s!r}: give seconds from 0 to one day")
        if isinstance(self.max_running, bool) or not isinstance(self.max_running, int):
            raise InvalidSchedule(f"max_running={self.max_running!r}: give an int >= 1")
        if self.max_running < 1:
            raise InvalidSchedule(f"max_running={self.max_running!r}: give an int >= 1")
        if self.source not in SOURCES:
            raise InvalidSchedule(f"source={self.source!r}: one of {SOURCES}")
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            raise InvalidSchedule(f"version={self.version!r}: an int")

    # -- derived ----------------------------------------------------------------------

    def trigger(self) -> Trigger:
        """The fire times (built anew on each call; the planner caches them).

        :raises InvalidCron: for a bad cron expression or zone.
        :raises InvalidSchedule: for a bad interval, anchor or zone.
        """
        if self.cron is not None:
            return CronTrigger(self.cron, self.tz)
        if isinstance(self.every_ms, bool) or not isinstance(self.every_ms, int):
            raise InvalidSchedule(f"every_ms={self.every_ms!r}: an int of ms")
        return IntervalTrigger(timedelta(milliseconds=self.every_ms), self.anchor_ms, self.tz)

    def misfire(self) -> MisfirePolicy:
        """The misfire policy.

        :raises InvalidJobSpec: for a bad grace, mode or ``max_catch_up``.
        """
        return MisfirePolicy(self.misfire_grace_s, self.coalesce, self.max_catch_up)

    def call(self) -> JobCall:
        """The call each occurrence runs."""
        return JobCall(self.job, self.args, self.kwargs)

    def describe(self) -> str:
        """``cron '0 5 * * *' (Asia/Shanghai)`` or ``every 1m30s``, for listings."""
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.tz})"
        assert self.every_ms is not None
        text = f"every {format_span(self.every_ms)}"
        return text + (f" from {self.anchor_ms} ms" if self.anchor_ms else "")

    def changed(self, **changes: Any) -> ScheduleDef:
        """A copy with ``changes`` applied (validated; the version is not touched).

        :raises InvalidSchedule: for an unknown field or a value that cannot work.
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise InvalidSchedule(f"unknown schedule field(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    # -- JSON ---------------------------------------------------------------------------

    def to_json(self) -> bytes:
        """The stored body: compact UTF-8 JSON (see the module docstring)."""
        doc: dict[str, Any] = {"f": FORMAT}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            doc[f.name] = list(value) if f.name == "args" else value
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, body: bytes) -> ScheduleDef:
        """The definition a stored body holds.

        :raises DecodeError: for a body that is not a definition of this format.
        """
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DecodeError(f"stored schedule is not UTF-8 JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("f") != FORMAT:
            raise DecodeError(f"stored schedule has format {doc!r:.80}, not {FORMAT}")
        doc.pop("f")
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in doc.items() if k in names})
        except (TypeError, ValueError) as e:
            raise DecodeError(f"stored schedule does not validate: {e}") from e


__all__ = ["FORMAT", "SOURCES", "ScheduleDef", "Source", "check_schedule_name"]
