"""Misfire handling: which missed occurrences to run when the scheduler catches up.

A schedule (cron or interval, see :data:`~scheduler.interval.Trigger`) keeps one
pending message per occurrence. When nothing was running at
an occurrence's time (the process was down, or the broker fired late), the
planner asks :func:`resolve_misfires` what to do, given the last occurrence that
did fire and the current time:

* an occurrence is *due* when ``last_fire_ms < t <= now_ms``;
* a due occurrence later than ``now_ms - grace`` is *within grace* (all of them
  when the grace is ``None``); the others are skipped;
* of those within grace, ``coalesce="latest"`` runs the latest, ``"earliest"`` the
  earliest, and ``"all"`` every one in order (at most ``max_catch_up``, the latest);
* the next occurrence to arm is the first after both ``now_ms`` and ``last_fire_ms``,
  so catching up never repeats an occurrence that already fired.

Pure functions: no clock, no broker, no logging.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from scheduler.interval import IntervalTrigger, Trigger
from scheduler.spec import MisfirePolicy

#: :attr:`MisfireDecision.skipped` counts up to this many; past it, it means "at least".
MAX_COUNTED = 1000
_FIRST_SPAN_MS = 1000


@dataclass(frozen=True, slots=True)
class MisfireDecision:
    """What the planner should do now.

    :param run: fire times (epoch ms, ascending) to run now, each within grace.
    :param skipped: due occurrences that will not run, either beyond grace or
        coalesced into a run; counted up to :data:`MAX_COUNTED`.
    :param next_fire_ms: the next occurrence to arm (after ``now_ms`` and after
        the last fired occurrence).
    """

    run: tuple[int, ...]
    skipped: int
    next_fire_ms: int


def latest_fire_times(trigger: Trigger, after_ms: int, until_ms: int, n: int) -> list[int]:
    """The latest ``n`` fire times ``t`` with ``after_ms < t <= until_ms``, ascending.

    For a cron trigger, searches backwards from ``until_ms`` in doubling windows,
    so a long gap costs about ``log(gap)`` searches, not one per occurrence; an
    interval trigger computes them directly.

    :raises ValueError: for ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if isinstance(trigger, IntervalTrigger):
        return trigger.latest_fire_times(after_ms, until_ms, n)
    found: list[int] = []
    hi = until_ms
    span = _FIRST_SPAN_MS
    while hi > after_ms:
        lo = max(after_ms, hi - span)
        part: deque[int] = deque(maxlen=n - len(found))
        for t in trigger.iter_fire_ms(lo):
            if t > hi:
                break
            part.append(t)
        found = [*part, *found]
        if len(found) >= n:
            break
        hi = lo
        span *= 2
    return found


def resolve_misfires(
    trigger: Trigger,
    last_fire_ms: int | None,
    now_ms: int,
    policy: MisfirePolicy,
) -> MisfireDecision:
    """Decide which missed occurrences of ``trigger`` to run at ``now_ms``.

    :param trigger: the schedule's fire times.
    :param last_fire_ms: the last occurrence that fired (or was run); ``None`` for a
        job that never ran, which has nothing to catch up and starts after ``now_ms``.
    :param now_ms: the current time, epoch ms.
    :param policy: grace and coalescing.
    """
    floor = now_ms if last_fire_ms is None else max(now_ms, last_fire_ms)
    next_fire = trigger.next_fire_ms(floor)
    if last_fire_ms is None or last_fire_ms >= now_ms:
        return MisfireDecision(run=(), skipped=0, next_fire_ms=next_fire)
    grace = policy.grace_ms
    after = last_fire_ms if grace is None else max(last_fire_ms, now_ms - grace - 1)
    run: tuple[int, ...]
    if policy.coalesce == "earliest":
        first = trigger.next_fire_ms(after)
        run = (first,) if first <= now_ms else ()
    else:
        n = 1 if policy.coalesce == "latest" else policy.max_catch_up
        run = tuple(latest_fire_times(trigger, after, now_ms, n))
    due = len(trigger.fire_times_between(last_fire_ms, now_ms, limit=MAX_COUNTED))
    skipped = MAX_COUNTED if due >= MAX_COUNTED else due - len(run)
    return MisfireDecision(run=run, skipped=skipped, next_fire_ms=next_fire)
