"""Cron triggers: when a cron job fires, in a time zone, across DST changes.

:class:`CronTrigger` parses a cron expression with ``croniter`` and maps its
wall-clock matches to instants with ``zoneinfo``. croniter is asked only about the
wall clock (it runs on a zone without DST); the DST rules are ours, because
croniter 7 fires a fixed-time job twice when clocks fall back (``30 1 * * *`` in
America/New_York runs at 01:30 EDT *and* 01:30 EST), which cron does not do.

DST semantics (those of ISC/Vixie ``cron(8)``)
----------------------------------------------

A job is an **interval job** when its minute or hour field starts with ``*``
(``*/15 * * * *``, ``0 * * * *``, ``*/20 2 * * *``), like cron's ``MIN_STAR`` /
``HR_STAR`` flags; every other job (``30 2 * * *``, ``0 9-17 * * 1-5``,
``@daily``) is a **fixed-time job**. Write ``*`` rather than ``0-23`` to get an
interval job.

* **Clocks jump forward** (spring; e.g. 02:00 -> 03:00): wall times in the gap
  never appear. A fixed-time job due in the gap runs once, at the instant of the
  jump (``30 2 * * *`` runs at 03:00 local on that day). An interval job skips
  the gap (``0 * * * *`` has 23 runs that day).
* **Clocks fall back** (autumn; e.g. 02:00 -> 01:00): wall times in the repeated
  span appear twice. A fixed-time job runs at the first of them only
  (``30 1 * * *`` runs once, at 01:30 before the change). An interval job runs at
  both, since they are distinct real times (``0 * * * *`` has 25 runs that day,
  an hour apart), and each has its own fire instant, hence its own cron key.

Put plainly: a fixed-time job fires when the wall clock first reaches or passes
its time; an interval job fires whenever the wall clock shows one of its times.
This holds for any offset change (30-minute DST as on Lord Howe, "negative DST"
as in Europe/Dublin, or a zone changing its standard offset).

Day of month and day of week (Vixie/ISC ``cron(8)``, as in ``crontab(5)``)
--------------------------------------------------------------------------

When **both** fields are restricted the job fires on a day that matches
**either** (``0 0 1,15 * 1`` runs on the 1st, the 15th and every Monday). A field
whose text **starts with** ``*`` counts as unrestricted, even with a step
(``*/2``), and then a day must match **both** fields:

* ``0 0 */2 * 1`` fires on Mondays that are odd days of the month (not on every
  odd day or Monday); ``0 0 1-31/2 * 1`` (no leading ``*``) fires on every odd
  day and on every Monday;
* ``0 0 15 * */2`` fires on the 15th when it is a Sunday, Tuesday, Thursday or
  Saturday;
* ``0 0 * * 1`` fires on Mondays, ``0 0 13 * *`` on the 13th, as usual.

Only the first character decides: ``15,*`` is restricted (so, with a restricted
weekday, every day matches), ``*,15`` is not. croniter's extensions combine by
the same rule: ``L`` (last day) in the day of month, ``L5`` (last Friday) and
``5#3`` (third Friday) in the day of week.

Fire times are whole seconds, returned as epoch milliseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from scheduler.errors import InvalidCron

#: ``@`` aliases and the five-field expressions they stand for.
ALIASES: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: How finely the time line is sampled for offset changes (zones change at most
#: a few times a year; none twice within this step).
_SCAN_STEP_S = 6 * 3600
#: How far back to look for the offset change that opened the current span; longer
#: than any repeated (fall-back) span.
_LOOKBACK_S = 86400
_MAX_SPANS = 1000


def _load_zone(expr: str, tz: str | ZoneInfo) -> ZoneInfo:
    if isinstance(tz, ZoneInfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise InvalidCron(expr, tz, "tz must be an IANA time zone name such as 'Europe/Berlin'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidCron(
            expr,
            tz,
            "unknown time zone; use an IANA name such as 'UTC', 'America/New_York' or "
            "'Asia/Shanghai' (zoneinfo.available_timezones() lists them)",
        ) from None


def _collapse_ranges(field: str) -> str:
    """Rewrite one-value ranges (``5-5``, ``mon-mon/2``) as the value: croniter 7
    reads them as ``*``, i.e. every minute instead of minute 5."""
    parts = []
    for part in field.split(","):
        base = part.partition("/")[0]
        low, dash, high = base.partition("-")
        parts.append(low if dash and low and low.lower() == high.lower() else part)
    return ",".join(parts)


#: The full range of the day-of-month and day-of-week fields (for :func:`_star_items`).
_FULL_RANGE = {"dom": "1-31", "dow": "0-6"}


def _star_items(field: str, full: str) -> str:
    """Write a ``*`` that is not the field's first character as the full range.

    Only the first character makes a day field unrestricted (Vixie cron's
    ``DOM_STAR``/``DOW_STAR``), but croniter folds ``15,*`` into ``*``; spelled
    ``15,1-31`` it stays restricted, as cron reads it.
    """
    head, *rest = field.split(",")
    return ",".join([head, *(full + p[1:] if p.startswith("*") else p for p in rest)])


def _normalize(expr: object, tz: object) -> tuple[str, list[str]]:
    if not isinstance(expr, str):
        raise InvalidCron(expr, tz, "a cron expression is a str such as '0 5 * * *'")
    text = " ".join(expr.split())
    if text.startswith("@"):
        alias = ALIASES.get(text.lower())
        if alias is None:
            raise InvalidCron(
                expr, tz, f"unknown alias; use one of {', '.join(ALIASES)} or five fields"
            )
        text = alias
    fields = [_collapse_ranges(f) for f in text.split(" ")] if text else []
    if len(fields) not in (5, 6):
        raise InvalidCron(
            expr,
            tz,
            f"has {len(fields)} fields; write five (minute hour day month weekday) or six, "
            "with seconds first (second minute hour day month weekday)",
        )
    fields[-3] = _star_items(fields[-3], _FULL_RANGE["dom"])
    fields[-1] = _star_items(fields[-1], _FULL_RANGE["dow"])
    return " ".join(fields), fields


class CronTrigger:
    """The fire times of a cron expression in a time zone (immutable, thread-safe).

    See the module docstring for the DST rules.

    :param expr: five fields ``minute hour day-of-month month day-of-week``, or six
        with seconds first; names (``mon``, ``jan``), ranges, steps, lists, ``L``,
        ``#`` and ``W`` as croniter reads them, or an alias from :data:`ALIASES`.
        When the day of month and the day of week are both restricted a day
        matching either fires, but a field starting with ``*`` (``*/2`` too) is
        unrestricted, so ``0 0 */2 * 1`` fires on Mondays that are odd days
        (Vixie cron's rule; see the module docstring).
    :param tz: an IANA time zone name or a :class:`~zoneinfo.ZoneInfo`.
    :raises InvalidCron: for a malformed expression, one that never fires (``0 0 30 2 *``),
        or an unknown time zone.
    """

    __slots__ = ("_croniter", "_expr", "_fields", "_interval", "_lock", "_tz")

    def __init__(self, expr: str, tz: str | ZoneInfo = "UTC") -> None:
        text, fields = _normalize(expr, tz)
        zone = _load_zone(text, tz)
        try:
            # implement_cron_bug: croniter's name for Vixie cron's day rule (a day
            # field starting with "*" is unrestricted, so the two fields are ANDed);
            # see the module docstring.
            cron = croniter(
                text,
                datetime(2000, 1, 1, tzinfo=UTC),
                second_at_beginning=len(fields) == 6,
                implement_cron_bug=True,
            )
            cron.get_next(float)
        except CroniterBadDateError:
            raise InvalidCron(expr, tz, "matches no date at all (e.g. February 30)") from None
        except (CroniterError, TypeError) as e:
            raise InvalidCron(expr, tz, f"does not parse ({e})") from None
        minute, hour = (fields[1], fields[2]) if len(fields) == 6 else (fields[0], fields[1])
        self._expr = text
        self._fields = tuple(fields)
        self._tz = zone
        self._interval = minute.startswith("*") or hour.startswith("*")
        self._croniter = cron
        self._lock = threading.Lock()

    @property
    def expr(self) -> str:
        """The expression, whitespace normalised and aliases expanded."""
        return self._expr

    @property
    def tz(self) -> ZoneInfo:
        """The time zone."""
        return self._tz

    @property
    def has_seconds(self) -> bool:
        """Whether the expression has a seconds field (six fields)."""
        return len(self._fields) == 6

    @property
    def is_interval(self) -> bool:
        """``True`` for an interval job (minute or hour field starts with ``*``),
        ``False`` for a fixed-time job; see the DST rules in the module docstring."""
        return self._interval

    def __repr__(self) -> str:
        return f"CronTrigger({self._expr!r}, tz={self._tz.key!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronTrigger):
            return NotImplemented
        return (self._expr, self._tz.key) == (other._expr, other._tz.key)

    def __hash__(self) -> int:
        return hash((self._expr, self._tz.key))

    # -- public API -------------------------------------------------------------------

    def next_fire_ms(self, after_ms: int) -> int:
        """The first fire time strictly after ``after_ms``, epoch ms.

        :param after_ms: epoch milliseconds.
        :raises InvalidCron: if no fire time follows within croniter's search horizon
            (only near the end of the calendar).
        """
        return self._next_s(after_ms // 1000 + 1) * 1000

    def iter_fire_ms(self, after_ms: int) -> Iterator[int]:
        """Fire times strictly after ``after_ms``, in order, without end."""
        t = after_ms
        while True:
            t = self.next_fire_ms(t)
            yield t

    def fire_times_between(self, start_ms: int, end_ms: int, limit: int | None = None) -> list[int]:
        """Fire times ``t`` with ``start_ms < t <= end_ms``, in order.

        :param limit: return at most this many (the earliest ones).
        :raises ValueError: for a negative ``limit``.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        out: list[int] = []
        if limit == 0:
            return out
        for t in self.iter_fire_ms(start_ms):
            if t > end_ms:
                break
            out.append(t)
            if limit is not None and len(out) >= limit:
                break
        return out

    def local(self, fire_ms: int) -> datetime:
        """``fire_ms`` as an aware datetime in the trigger's time zone (for logs)."""
        return datetime.fromtimestamp(fire_ms / 1000, self._tz)

    # -- the mapping from wall clock to instants -------------------------------------

    def _offset(self, t: int) -> int:
        """UTC offset in seconds at instant ``t`` (epoch seconds)."""
        off = datetime.fromtimestamp(t, self._tz).utcoffset()
        assert off is not None
        return int(off.total_seconds())

    def _match_from(self, wall: int) -> int:
        """The first wall time (seconds, as if UTC) at or after ``wall`` the expression matches."""
        start = datetime.fromtimestamp(wall - 1, UTC)
        try:
            with self._lock:
                found = self._croniter.get_next(datetime, start_time=start)
        except CroniterBadDateError:
            raise InvalidCron(self._expr, self._tz.key, "no fire time after this date") from None
        assert isinstance(found, datetime)
        return int(found.timestamp())

    def _next_change(self, t: int, until: int) -> int | None:
        """The first instant in ``(t, until]`` whose offset differs from ``t``'s, or None."""
        offset = self._offset(t)
        lo = t
        while lo < until:
            hi = min(lo + _SCAN_STEP_S, until)
            if self._offset(hi) != offset:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._offset(mid) != offset:
                        hi = mid
                    else:
                        lo = mid
                return hi
            lo = hi
        return None

    def _last_change(self, t: int) -> tuple[int, int] | None:
        """``(instant, offset before it)`` of the last offset change in
        ``(t - _LOOKBACK_S, t]``, or None."""
        offset = self._offset(t)
        hi = t
        floor = t - _LOOKBACK_S
        while hi > floor:
            lo = max(hi - _SCAN_STEP_S, floor)
            before = self._offset(lo)
            if before != offset:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._offset(mid) == offset:
                        hi = mid
                    else:
                        lo = mid
                return hi, self._offset(hi - 1)
            hi = lo
        return None

    def _next_s(self, t: int) -> int:
        """The first fire time at or after ``t`` (epoch seconds).

        Walks the spans of constant UTC offset from ``t``: within a span, wall
        time ``w`` is instant ``w - offset``. ``change`` is the offset change that
        opened the current span, if recent enough to matter.
        """
        change = self._last_change(t)
        for _ in range(_MAX_SPANS):
            offset = self._offset(t)
            low_wall = t + offset
            if change is not None and not self._interval:
                at, before = change
                if before > offset:
                    # Fell back at `at`: walls up to at + before were already shown once.
                    low_wall = max(low_wall, at + before)
                elif before < offset and t == at and self._match_from(at + before) < at + offset:
                    # Jumped forward at `at`: a time among the skipped walls fires now.
                    return at
            candidate = self._match_from(low_wall) - offset
            change_at = self._next_change(t, candidate)
            if change_at is None:
                return candidate
            change = (change_at, offset)
            t = change_at
        raise InvalidCron(self._expr, self._tz.key, "too many offset changes before next fire")
