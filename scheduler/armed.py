""":class:`ArmedOccurrences`: which schedule occurrences a planner armed, per series.

The :class:`~scheduler.cron.CronPlanner` remembers the last few occurrences it
armed (or found armed) of each plan series: a periodic ``arm_all`` then sends
only the others, a clock stepped back does not re-arm occurrences that already
ran, and a catch-up stops at the first occurrence known to have a message of
its own. It remembers only its own arming; other processes' is the broker's.
"""

from __future__ import annotations

import bisect
import threading

#: Armed occurrences remembered per series (to bound catch-up; see ``CronPlanner``).
REMEMBERED = 16


class ArmedOccurrences:
    """The occurrences armed per plan series (epoch ms, ascending, the last
    :data:`REMEMBERED` of each). Safe to use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_series: dict[str, list[int]] = {}

    def add(self, series: str, fire_ms: int) -> None:
        """Remember that ``series``' occurrence ``fire_ms`` is armed."""
        with self._lock:
            armed = self._by_series.setdefault(series, [])
            i = bisect.bisect_left(armed, fire_ms)
            if i == len(armed) or armed[i] != fire_ms:
                armed.insert(i, fire_ms)
                del armed[:-REMEMBERED]

    def latest(self, series: str) -> int | None:
        """The latest occurrence of ``series`` remembered, if any."""
        with self._lock:
            armed = self._by_series.get(series)
            return armed[-1] if armed else None

    def knows(self, series: str, fire_ms: int) -> bool:
        """Whether ``series``' occurrence ``fire_ms`` is remembered as armed."""
        with self._lock:
            armed = self._by_series.get(series)
            if not armed:
                return False
            i = bisect.bisect_left(armed, fire_ms)
            return i < len(armed) and armed[i] == fire_ms

    def first_after(self, series: str, fire_ms: int) -> int | None:
        """The first occurrence of ``series`` after ``fire_ms`` remembered as armed."""
        with self._lock:
            armed = self._by_series.get(series, [])
            i = bisect.bisect_right(armed, fire_ms)
            return armed[i] if i < len(armed) else None

    def forget(self, name: str) -> None:
        """Forget every series of schedule ``name`` (all its versions)."""
        with self._lock:
            for series in [s for s in self._by_series if s.partition("\x00")[0] == name]:
                del self._by_series[series]


__all__ = ["REMEMBERED", "ArmedOccurrences"]
