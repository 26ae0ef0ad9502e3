"""Day of month and day of week together: Vixie cron's rule (issue 15 §4).

Both restricted: a day matching either fires. A field starting with ``*`` (``*/2``
too) is unrestricted, and then a day must match both. The expected fire times in
:data:`TABLE` were worked out by hand from the calendar (2024: January 1st is a
Monday, March 1st a Friday, June 1st a Saturday, September 1st a Sunday, October
1st a Tuesday; Europe/Berlin springs forward on Sunday 31 March at 02:00 and falls
back on Sunday 27 October at 03:00), not by running croniter.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.triggers import CronTrigger

BERLIN = "Europe/Berlin"


def _after(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def _fires(expr: str, tz: str, after: str, n: int) -> list[str]:
    """The first ``n`` fire times after ``after``, as local ``"Mon 2024-01-15 00:00"``."""
    trigger = CronTrigger(expr, tz)
    out: list[str] = []
    for ms in trigger.iter_fire_ms(_after(after)):
        local = trigger.local(ms)
        out.append(local.strftime("%a %Y-%m-%d %H:%M" + (":%S" if local.second else "")))
        if len(out) == n:
            return out
    raise AssertionError("unreachable")  # pragma: no cover


JAN_1 = "2024-01-01T00:00:00+00:00"

#: (expression, zone, fire times after, expected), each worked out by hand.
TABLE: list[tuple[str, str, str, list[str]]] = [
    # dom starts with "*": unrestricted, so Mondays that are odd days (Jan 1 is not
    # *after* midnight Jan 1; Feb's Mondays 5, 12, 19, 26; Mar's 4, 11, 18, 25).
    (
        "0 0 */2 * 1",
        "UTC",
        JAN_1,
        [
            "Mon 2024-01-15 00:00",
            "Mon 2024-01-29 00:00",
            "Mon 2024-02-05 00:00",
            "Mon 2024-02-19 00:00",
            "Mon 2024-03-11 00:00",
            "Mon 2024-03-25 00:00",
        ],
    ),
    # The same days without the leading "*": both restricted, so every odd day or Monday.
    (
        "0 0 1-31/2 * 1",
        "UTC",
        JAN_1,
        [
            "Wed 2024-01-03 00:00",
            "Fri 2024-01-05 00:00",
            "Sun 2024-01-07 00:00",
            "Mon 2024-01-08 00:00",
            "Tue 2024-01-09 00:00",
            "Thu 2024-01-11 00:00",
        ],
    ),
    # dow "*/2" is Sun, Tue, Thu, Sat and unrestricted: the 15th on one of those days.
    (
        "0 0 15 * */2",
        "UTC",
        JAN_1,
        [
            "Thu 2024-02-15 00:00",
            "Sat 2024-06-15 00:00",
            "Thu 2024-08-15 00:00",
            "Sun 2024-09-15 00:00",
            "Tue 2024-10-15 00:00",
        ],
    ),
    # Both start with "*": odd days that are Sun, Tue, Thu or Sat.
    (
        "0 0 */2 * */2",
        "UTC",
        JAN_1,
        [
            "Sun 2024-01-07 00:00",
            "Tue 2024-01-09 00:00",
            "Thu 2024-01-11 00:00",
            "Sat 2024-01-13 00:00",
            "Sun 2024-01-21 00:00",
            "Tue 2024-01-23 00:00",
        ],
    ),
    # Both restricted: the 13th or a Friday.
    (
        "0 0 13 * 5",
        "UTC",
        JAN_1,
        [
            "Fri 2024-01-05 00:00",
            "Fri 2024-01-12 00:00",
            "Sat 2024-01-13 00:00",
            "Fri 2024-01-19 00:00",
            "Fri 2024-01-26 00:00",
            "Fri 2024-02-02 00:00",
        ],
    ),
    # Both restricted: the 1st, the 15th, or Monday to Friday (Jan 6 and 7 are a weekend).
    (
        "0 0 1,15 * 1-5",
        "UTC",
        JAN_1,
        [
            "Tue 2024-01-02 00:00",
            "Wed 2024-01-03 00:00",
            "Thu 2024-01-04 00:00",
            "Fri 2024-01-05 00:00",
            "Mon 2024-01-08 00:00",
            "Tue 2024-01-09 00:00",
        ],
    ),
    # "*" forms: Mondays; the 13th; every day.
    ("0 0 * * 1", "UTC", JAN_1, ["Mon 2024-01-08 00:00", "Mon 2024-01-15 00:00"]),
    ("0 0 13 * *", "UTC", JAN_1, ["Sat 2024-01-13 00:00", "Tue 2024-02-13 00:00"]),
    ("0 0 * * *", "UTC", JAN_1, ["Tue 2024-01-02 00:00", "Wed 2024-01-03 00:00"]),
    # Only the first character counts: "*,15" is unrestricted (Mondays) ...
    ("0 0 *,15 * 1", "UTC", JAN_1, ["Mon 2024-01-08 00:00", "Mon 2024-01-15 00:00"]),
    # ... "15,*" is restricted and covers every day, so with a Monday: every day.
    (
        "0 0 15,* * 1",
        "UTC",
        JAN_1,
        ["Tue 2024-01-02 00:00", "Wed 2024-01-03 00:00", "Thu 2024-01-04 00:00"],
    ),
    # "L" (last day) is restricted: the last day of the month or a Friday.
    (
        "0 0 L * 5",
        "UTC",
        JAN_1,
        [
            "Fri 2024-01-05 00:00",
            "Fri 2024-01-12 00:00",
            "Fri 2024-01-19 00:00",
            "Fri 2024-01-26 00:00",
            "Wed 2024-01-31 00:00",
            "Fri 2024-02-02 00:00",
        ],
    ),
    # The last Friday of a month that falls on an odd day (Jan 26, Apr 26 are even).
    (
        "0 0 */2 * L5",
        "UTC",
        JAN_1,
        ["Fri 2024-02-23 00:00", "Fri 2024-03-29 00:00", "Fri 2024-05-31 00:00"],
    ),
    # The third Friday; then only when it is an odd day (Feb 16 is even).
    (
        "0 0 * * 5#3",
        "UTC",
        JAN_1,
        ["Fri 2024-01-19 00:00", "Fri 2024-02-16 00:00", "Fri 2024-03-15 00:00"],
    ),
    (
        "0 0 */2 * 5#3",
        "UTC",
        JAN_1,
        [
            "Fri 2024-01-19 00:00",
            "Fri 2024-03-15 00:00",
            "Fri 2024-04-19 00:00",
            "Fri 2024-05-17 00:00",
            "Fri 2024-06-21 00:00",
        ],
    ),
    # Six fields (seconds first): the same rule on the day fields; Jan 1 00:00:30 is
    # after midnight and an odd Monday.
    (
        "30 0 0 */2 * 1",
        "UTC",
        JAN_1,
        ["Mon 2024-01-01 00:00:30", "Mon 2024-01-15 00:00:30", "Mon 2024-01-29 00:00:30"],
    ),
    # Berlin, odd Sundays at 02:30: Mar 3 and 17 (CET), then Mar 31, the spring-forward
    # day, has no 02:30, so this fixed-time job runs at the jump (03:00 CEST); Apr 7.
    (
        "30 2 */2 * 0",
        BERLIN,
        "2024-03-01T00:00:00+00:00",
        [
            "Sun 2024-03-03 02:30",
            "Sun 2024-03-17 02:30",
            "Sun 2024-03-31 03:00",
            "Sun 2024-04-07 02:30",
        ],
    ),
    # Autumn: Oct 27 (odd Sunday) shows 02:30 twice; it runs at the first only.
    (
        "30 2 */2 * 0",
        BERLIN,
        "2024-10-01T00:00:00+00:00",
        ["Sun 2024-10-13 02:30", "Sun 2024-10-27 02:30", "Sun 2024-11-03 02:30"],
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_fire_times_follow_vixie_cron(expr: str, tz: str, after: str, expected: list[str]) -> None:
    assert _fires(expr, tz, after, len(expected)) == expected


def test_the_table_is_large_enough() -> None:
    assert len({t[0] for t in TABLE}) >= 12


def test_the_berlin_fall_back_fire_is_the_first_0230_in_utc() -> None:
    trigger = CronTrigger("30 2 */2 * 0", BERLIN)
    fire = trigger.next_fire_ms(_after("2024-10-20T00:00:00+00:00"))
    # 02:30 CEST (+02:00), not 02:30 CET an hour later.
    assert datetime.fromtimestamp(fire / 1000, UTC) == datetime(2024, 10, 27, 0, 30, tzinfo=UTC)


def test_an_hourly_job_on_odd_sundays_has_23_runs_on_the_spring_forward_day() -> None:
    trigger = CronTrigger("0 * */2 * 0", BERLIN)
    day = trigger.fire_times_between(
        _after("2024-03-30T23:00:00+00:00") - 1, _after("2024-03-31T22:00:00+00:00") - 1
    )
    assert len(day) == 23
    # ... and none on the even Sunday before it, nor on the odd Saturday.
    assert (
        trigger.fire_times_between(
            _after("2024-03-23T00:00:00+00:00"), _after("2024-03-24T23:00:00+00:00")
        )
        == []
    )


def test_a_star_inside_a_list_is_spelled_as_the_full_range() -> None:
    assert CronTrigger("0 0 15,* * 1").expr == "0 0 15,1-31 * 1"
    assert CronTrigger("0 0 1 * mon,*/2").expr == "0 0 1 * mon,0-6/2"
    assert CronTrigger("0 0 */2 * 1").expr == "0 0 */2 * 1"
