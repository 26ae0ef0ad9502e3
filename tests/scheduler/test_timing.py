"""resolve_timing: schedule()'s delay=/at=/delay_level= checked before anything is sent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from broker_adapter.message import Message
from scheduler.errors import InvalidSchedule
from scheduler.timing import datetime_to_ms, resolve_timing

NOW = 1_700_000_000_000


def resolve(**kwargs: Any) -> dict[str, Any]:
    return dict(resolve_timing(now_ms=NOW, past_tolerance_ms=1000, **kwargs))


def test_no_timing_means_now() -> None:
    assert resolve() == {}


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (timedelta(minutes=30), 1_800_000),
        (0, 0),
        (1.5, 1500),
        (0.0004, 0),
        (timedelta(microseconds=1500), 1),
    ],
)
def test_delay_becomes_relative_ms(delay: Any, expected: int) -> None:
    fields = resolve(delay=delay)
    assert fields == {"delay_ms": expected}
    assert Message("t", b"", **fields).relative_delay_ms() == expected


def test_at_becomes_absolute_ms_in_any_zone() -> None:
    at = datetime(2023, 11, 14, 23, 13, 20, 5000, tzinfo=ZoneInfo("Europe/Berlin"))
    assert resolve(at=at) == {"deliver_at_ms": datetime_to_ms(at)}
    assert datetime_to_ms(datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone(timedelta(hours=1)))) == (
        -3_599_000
    )
    future = datetime.fromtimestamp(NOW / 1000 + 60, UTC)
    assert resolve(at=future) == {"deliver_at_ms": NOW + 60_000}


def test_past_at_within_tolerance_runs_now_beyond_is_refused() -> None:
    recent = datetime.fromtimestamp((NOW - 1000) / 1000, UTC)
    assert resolve(at=recent) == {"deliver_at_ms": NOW - 1000}
    old = datetime.fromtimestamp((NOW - 1001) / 1000, UTC)
    with pytest.raises(InvalidSchedule, match="1001 ms in the past.*CHRONOQ_PAST_TOLERANCE_MS"):
        resolve(at=old)


def test_delay_level_passes_through() -> None:
    assert resolve(delay_level=1) == {"delay_level": 1}
    assert resolve(delay_level=18) == {"delay_level": 18}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"delay": 1, "at": datetime.now(UTC)}, "delay and at"),
        ({"delay": 1, "delay_level": 3}, "delay and delay_level"),
        ({"at": datetime(2030, 1, 1)}, "naive datetime"),
        ({"at": "2030-01-01T00:00:00Z"}, "takes a datetime"),
        ({"at": 1_900_000_000_000}, "takes a datetime"),
        ({"delay": -1}, "negative"),
        ({"delay": timedelta(seconds=-1)}, "negative"),
        ({"delay": float("nan")}, "finite"),
        ({"delay": "10"}, "timedelta or seconds"),
        ({"delay": True}, "timedelta or seconds"),
        ({"delay_level": 0}, "from 1"),
        ({"delay_level": 19}, "from 1"),
        ({"delay_level": 2.0}, "from 1"),
        ({"delay_level": True}, "from 1"),
    ],
)
def test_bad_timing(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidSchedule, match=fragment):
        resolve(**kwargs)
