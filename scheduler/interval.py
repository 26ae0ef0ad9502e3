"""Interval triggers: "every 90 seconds", anchored and drift-free.

:class:`IntervalTrigger` fires at ``anchor + n * every`` for every integer ``n``:
occurrence times are computed from the anchor, never from when the last run
started or ended, so they do not drift however late a run is, and every process
(and every restart) computes the same times. The default anchor is the Unix epoch
(1970-01-01T00:00:00Z): ``every=timedelta(minutes=7)`` fires at each multiple of
7 minutes since the epoch, across hour, day and DST boundaries alike (an interval
is a span of real time; the time zone only affects how times are shown).

It offers what the cron planner and the misfire rules use of a
:class:`~scheduler.triggers.CronTrigger` (``next_fire_ms``, ``iter_fire_ms``,
``fire_times_between``, ``local``), so both kinds are planned alike (see
:data:`Trigger`), plus :meth:`IntervalTrigger.is_fire_time`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.errors import InvalidSchedule
from scheduler.triggers import CronTrigger

#: Shortest interval: one second (a shorter one is a busy loop, not a schedule).
MIN_INTERVAL_MS = 1000


def _zone(tz: str | ZoneInfo) -> ZoneInfo:
    if isinstance(tz, ZoneInfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise InvalidSchedule(f"tz={tz!r}: give an IANA time zone name such as 'UTC'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"tz={tz!r}: unknown time zone; use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


def interval_ms(every: object) -> int:
    """``every`` (a :class:`~datetime.timedelta`, or seconds as int/float) in whole ms.

    :raises InvalidSchedule: for another type, or less than :data:`MIN_INTERVAL_MS`.
    """
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        seconds = float(every)
    else:
        raise InvalidSchedule(
            f"every={every!r}: give a timedelta (timedelta(seconds=90)) or seconds as a number"
        )
    if not seconds * 1000 >= MIN_INTERVAL_MS or seconds == float("inf"):
        raise InvalidSchedule(
            f"every={every!r}: an interval is at least {MIN_INTERVAL_MS // 1000} s and finite"
        )
    return round(seconds * 1000)


def anchor_ms(anchor: object) -> int:
    """``anchor`` (an aware :class:`~datetime.datetime`, epoch ms as int, or ``None``
    for the Unix epoch) as epoch ms.

    :raises InvalidSchedule: for a naive datetime or another type.
    """
    if anchor is None:
        return 0
    if isinstance(anchor, datetime):
        if anchor.tzinfo is None or anchor.utcoffset() is None:
            raise InvalidSchedule(
                f"anchor={anchor!r} is naive; give an aware datetime, e.g. "
                "datetime(2024, 1, 1, tzinfo=timezone.utc)"
            )
        delta = anchor - datetime(1970, 1, 1, tzinfo=UTC)
        return delta // timedelta(milliseconds=1)
    if isinstance(anchor, int) and not isinstance(anchor, bool):
        return anchor
    raise InvalidSchedule(f"anchor={anchor!r}: give an aware datetime or epoch milliseconds")


class IntervalTrigger:
    """Fire times ``anchor + n * every`` (immutable, thread-safe).

    :param every: the interval, a :class:`~datetime.timedelta` or seconds (at least 1 s;
        kept to the millisecond).
    :param anchor: an aware datetime (or epoch ms) that is one of the fire times;
        ``None`` for the Unix epoch. Times before the anchor fire too: the anchor
        fixes the phase, not a start (a schedule's ``start`` does that).
    :param tz: the zone fire times are shown in (:meth:`local`); it does not move them.
    :raises InvalidSchedule: for an interval under 1 s, a naive anchor or an unknown zone.
    """

    __slots__ = ("_anchor", "_every", "_tz")

    def __init__(
        self,
        every: timedelta | float,
        anchor: datetime | int | None = None,
        tz: str | ZoneInfo = "UTC",
    ) -> None:
        self._every = interval_ms(every)
        self._anchor = anchor_ms(anchor)
        self._tz = _zone(tz)

    @property
    def every_ms(self) -> int:
        """The interval, ms."""
        return self._every

    @property
    def anchor_ms(self) -> int:
        """The anchor as given (epoch ms); any ``anchor_ms + n * every_ms`` is equivalent."""
        return self._anchor

    @property
    def tz(self) -> ZoneInfo:
        """The zone fire times are shown in."""
        return self._tz

    def describe(self) -> str:
        """A short text such as ``every 90s`` or ``every 7m from 2024-01-01T00:00:00+00:00``."""
        text = f"every {format_span(self._every)}"
        if self._anchor:
            text += f" from {self.local(self._anchor).isoformat()}"
        return text

    def __repr__(self) -> str:
        return f"IntervalTrigger(every_ms={self._every}, anchor_ms={self._anchor}, tz={self._tz.key!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalTrigger):
            return NotImplemented
        return (self._every, self._anchor % self._every, self._tz.key) == (
            other._every,
            other._anchor % other._every,
            other._tz.key,
        )

    def __hash__(self) -> int:
        return hash((self._every, self._anchor % self._every, self._tz.key))

    # -- what the planner uses ---------------------------------------------------------

    def next_fire_ms(self, after_ms: int) -> int:
        """The first fire time strictly after ``after_ms``, epoch ms."""
        every = self._every
        return self._anchor + ((after_ms - self._anchor) // every + 1) * every

    def is_fire_time(self, t_ms: int) -> bool:
        """Whether ``t_ms`` is one of the fire times."""
        return (t_ms - self._anchor) % self._every == 0

    def iter_fire_ms(self, after_ms: int) -> Iterator[int]:
        """Fire times strictly after ``after_ms``, in order, without end."""
        t = self.next_fire_ms(after_ms)
        every = self._every
        while True:
            yield t
            t += every

    def fire_times_between(self, start_ms: int, end_ms: int, limit: int | None = None) -> list[int]:
        """Fire times ``t`` with ``start_ms < t <= end_ms``, in order.

        :param limit: return at most this many (the earliest ones).
        :raises ValueError: for a negative ``limit``.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        first = self.next_fire_ms(start_ms)
        if first > end_ms:
            return []
        count = (end_ms - first) // self._every + 1
        if limit is not None:
            count = min(count, limit)
        return list(range(first, first + count * self._every, self._every))

    def latest_fire_times(self, after_ms: int, until_ms: int, n: int) -> list[int]:
        """The latest ``n`` fire times ``t`` with ``after_ms < t <= until_ms``, ascending
        (constant time, whatever the gap)."""
        last = self.next_fire_ms(until_ms) - self._every
        first = max(self.next_fire_ms(after_ms), last - (n - 1) * self._every)
        return list(range(first, last + 1, self._every)) if first <= last else []

    def local(self, fire_ms: int) -> datetime:
        """``fire_ms`` as an aware datetime in the trigger's zone (for logs)."""
        return datetime.fromtimestamp(fire_ms / 1000, self._tz)


def format_span(ms: int) -> str:
    """``ms`` as a compact span: ``90s``, ``7m``, ``1h30m``, ``1d``, ``1500ms``."""
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts)


#: The fire times a schedule follows: a cron expression or an interval.
Trigger = CronTrigger | IntervalTrigger

__all__ = [
    "MIN_INTERVAL_MS",
    "IntervalTrigger",
    "Trigger",
    "anchor_ms",
    "format_span",
    "interval_ms",
]
