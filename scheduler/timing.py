"""The timing arguments of ``job.schedule(...)``, checked and turned into message fields.

``schedule()`` takes at most one of ``delay=`` (a :class:`~datetime.timedelta` or
seconds), ``at=`` (an *aware* :class:`~datetime.datetime`) or ``delay_level=``
(RocketMQ's 1..18); none means now. :func:`resolve_timing` checks them before
anything is sent and returns the matching :class:`~broker_adapter.message.Message`
timing field. Relative delays stay relative, so the broker's clock decides the
due time.

An ``at`` in the past is accepted (and runs at once) when it is at most
``past_tolerance_ms`` old (``CHRONOQ_PAST_TOLERANCE_MS``, default 1 s), which
absorbs the time spent computing it; anything older is almost surely a bug (a
wrong zone or date) and is refused.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from broker_adapter.checks import is_int
from broker_adapter.message import MAX_DELAY_LEVEL
from scheduler.errors import InvalidSchedule

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


class TimingFields(TypedDict, total=False):
    """Keyword arguments for :class:`~broker_adapter.message.Message`: at most one key."""

    delay_ms: int
    deliver_at_ms: int
    delay_level: int


def datetime_to_ms(at: datetime) -> int:
    """An aware datetime as epoch milliseconds (exact; sub-millisecond rounds down).

    :raises InvalidSchedule: for a naive datetime or a non-datetime.
    """
    if not isinstance(at, datetime):
        raise InvalidSchedule(
            f"at= takes a datetime, got {type(at).__name__} {at!r}; for a relative time use delay="
        )
    if at.tzinfo is None or at.utcoffset() is None:
        raise InvalidSchedule(
            f"at={at!r} is a naive datetime, which names no instant; attach a zone, e.g. "
            "datetime(..., tzinfo=ZoneInfo('Europe/Berlin')) or datetime.now(UTC) + delta"
        )
    return (at - _EPOCH) // _ONE_MS


def delay_to_ms(delay: object) -> int:
    """``delay`` (timedelta, or seconds as int/float) as whole milliseconds.

    :raises InvalidSchedule: for another type, or a negative or non-finite value.
    """
    if isinstance(delay, timedelta):
        ms = delay // _ONE_MS
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        if not math.isfinite(delay):
            raise InvalidSchedule(f"delay={delay!r} is not a finite number of seconds")
        ms = round(delay * 1000)
    else:
        raise InvalidSchedule(
            f"delay= takes a timedelta or seconds (int or float), got {type(delay).__name__} "
            f"{delay!r}; for an absolute time use at="
        )
    if ms < 0:
        raise InvalidSchedule(f"delay={delay!r} is negative; give a delay >= 0 (0 means now)")
    return ms


def resolve_timing(
    *,
    now_ms: int,
    past_tolerance_ms: int,
    delay: timedelta | float | None = None,
    at: datetime | None = None,
    delay_level: int | None = None,
) -> TimingFields:
    """Check ``schedule()``'s timing arguments; return the message's timing field.

    :param now_ms: the caller's clock, epoch ms (only used to judge a past ``at``).
    :param past_tolerance_ms: how far in the past ``at`` may be and still run at once.
    :param delay: a timedelta or seconds from now, >= 0.
    :param at: an aware datetime.
    :param delay_level: RocketMQ delay level, 1 (1 s) to 18 (2 h).
    :returns: ``{"delay_ms": n}``, ``{"deliver_at_ms": n}``, ``{"delay_level": n}``
        or ``{}`` (now).
    :raises InvalidSchedule: for more than one of them, a naive or too-old ``at``,
        a negative delay, or a level outside 1..18.
    """
    given = [
        n for n, v in (("delay", delay), ("at", at), ("delay_level", delay_level)) if v is not None
    ]
    if len(given) > 1:
        raise InvalidSchedule(
            f"give at most one of delay=, at= and delay_level=, got {' and '.join(given)}"
        )
    if delay is not None:
        return {"delay_ms": delay_to_ms(delay)}
    if at is not None:
        at_ms = datetime_to_ms(at)
        late = now_ms - at_ms
        if late > past_tolerance_ms:
            raise InvalidSchedule(
                f"at={at.isoformat()} is {late} ms in the past, beyond the tolerance of "
                f"{past_tolerance_ms} ms (CHRONOQ_PAST_TOLERANCE_MS); check its date and "
                "zone, or leave out at= to run now"
            )
        return {"deliver_at_ms": max(at_ms, 0)}
    if delay_level is not None:
        if not is_int(delay_level, 1, MAX_DELAY_LEVEL):
            raise InvalidSchedule(
                f"delay_level={delay_level!r}: levels are ints from 1 (1 s) to "
                f"{MAX_DELAY_LEVEL} (2 h); use delay= for other delays"
            )
        return {"delay_level": delay_level}
    return {}
