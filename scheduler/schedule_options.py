"""The options of ``app.schedules.add``/``update`` as a :class:`ScheduleDef`:
:func:`def_from_options` checks and converts them (timedeltas to ms or seconds,
datetimes to epoch ms, a job handle to its name and topic)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from scheduler.errors import InvalidSchedule
from scheduler.interval import anchor_ms, interval_ms
from scheduler.schedule_def import ScheduleDef
from scheduler.spec import seconds
from scheduler.timing import datetime_to_ms


def _ms(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return datetime_to_ms(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidSchedule(f"{name}={value!r}: give an aware datetime or epoch ms")


def _seconds(name: str, value: object) -> float | None:
    if value is None:
        return None
    try:
        return seconds(name, value, allow_zero=True)
    except ValueError as e:
        raise InvalidSchedule(str(e)) from None


#: ``add``/``update`` options and the definition fields they set.
OPTIONS = {
    "job": "job",
    "cron": "cron",
    "every": "every_ms",
    "anchor": "anchor_ms",
    "args": "args",
    "kwargs": "kwargs",
    "tz": "tz",
    "start": "start_ms",
    "end": "end_ms",
    "misfire_grace_time": "misfire_grace_s",
    "coalesce": "coalesce",
    "max_catch_up": "max_catch_up",
    "jitter": "jitter_s",
    "max_running": "max_running",
}


def def_from_options(
    base: ScheduleDef | None,
    name: str,
    options: Mapping[str, Any],
    job_topic: Callable[[str], tuple[str, str]],
) -> ScheduleDef:
    """A definition from ``add``/``update`` options, over ``base`` (``None``: new).

    :param job_topic: a job's name to ``(name, topic)``; raises for an unknown job.
    :raises InvalidSchedule: for an unknown option or a value that cannot work.
    """
    if options.get("cron") is not None and options.get("every") is not None:
        raise InvalidSchedule(f"schedule {name!r}: give exactly one of cron= or every=, not both")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidSchedule(f"unknown option(s) {unknown}; use {sorted(OPTIONS)}")
    fields: dict[str, Any] = {}
    for option, value in options.items():
        if option == "job":
            job_name = value if isinstance(value, str) else getattr(value, "name", value)
            if not isinstance(job_name, str):
                raise InvalidSchedule(f"job={value!r}: give a job handle or a job name")
            fields["job"], fields["topic"] = job_topic(job_name)
        elif option == "every":
            fields["every_ms"] = None if value is None else interval_ms(value)
            if value is not None:
                fields["cron"] = None
        elif option == "cron":
            fields["cron"] = value
            if value is not None:
                fields["every_ms"], fields["anchor_ms"] = None, 0
        elif option == "anchor":
            fields["anchor_ms"] = anchor_ms(value)
        elif option in ("start", "end"):
            fields[OPTIONS[option]] = _ms(option, value)
        elif option in ("misfire_grace_time", "jitter"):
            fields[OPTIONS[option]] = _seconds(option, value)
        elif option == "kwargs":
            fields["kwargs"] = {} if value is None else value
        else:
            fields[OPTIONS[option]] = value
    if base is None:
        return ScheduleDef(name=name, **fields)
    return base.changed(**fields)


__all__ = ["OPTIONS", "def_from_options"]
