"""Time helpers for the scheduler tests."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo


def ms(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    tz: str = "UTC",
) -> int:
    """Epoch ms of a wall time in ``tz`` (fold=0 for ambiguous times)."""
    zone = UTC if tz == "UTC" else ZoneInfo(tz)
    return int(datetime(year, month, day, hour, minute, second, tzinfo=zone).timestamp()) * 1000


def utc(ms_value: int) -> str:
    """Epoch ms as ``YYYY-MM-DDTHH:MM:SSZ`` (readable assertion failures)."""
    return datetime.fromtimestamp(ms_value / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
