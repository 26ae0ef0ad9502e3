"""CronTrigger: parsing, next fire times, and DST semantics checked two ways.

1. Named cases across spring-forward and fall-back in America/New_York and
   Europe/Berlin (2024), plus odd zones (30-minute DST, negative DST, midnight
   transitions).
2. A property test against a brute-force "clock watcher" model that steps
   through real time and looks at the wall clock, sharing no code with the
   trigger: a fixed-time job fires when the wall clock first reaches or passes
   one of its times; an interval job fires whenever the wall clock shows one.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_time import ms, utc

from scheduler.errors import InvalidCron
from scheduler.triggers import ALIASES, CronTrigger

NY, BERLIN = "America/New_York", "Europe/Berlin"
H = 3_600_000
# 2024 transitions: NY 03-10 02:00 EST -> 03:00 EDT (07:00Z), 11-03 02:00 EDT -> 01:00 EST
# (06:00Z); Berlin 03-31 02:00 CET -> 03:00 CEST (01:00Z), 10-27 03:00 CEST -> 02:00 CET (01:00Z).


def fires_on_local_day(trigger: CronTrigger, y: int, m: int, d: int) -> list[int]:
    tz = trigger.tz.key
    start = ms(y, m, d, tz=tz)
    nxt = datetime(y, m, d) + timedelta(days=1)
    end = ms(nxt.year, nxt.month, nxt.day, tz=tz)
    return trigger.fire_times_between(start - 1, end - 1)


def local_str(trigger: CronTrigger, fire: int) -> str:
    return trigger.local(fire).strftime("%H:%M%z")


# -- parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "fragment"),
    [
        ("", "UTC", "has 0 fields"),
        ("* * *", "UTC", "has 3 fields"),
        ("* * * * * * *", "UTC", "has 7 fields"),
        ("61 * * * *", "UTC", "does not parse"),
        ("* 24 * * *", "UTC", "does not parse"),
        ("*/0 * * * *", "UTC", "does not parse"),
        ("a b c d e", "UTC", "does not parse"),
        ("H * * * *", "UTC", "does not parse"),
        ("0 0 30 2 *", "UTC", "matches no date"),
        ("0 0 31 4 *", "UTC", "matches no date"),
        ("@reboot", "UTC", "unknown alias"),
        ("@every 5m", "UTC", "unknown alias"),
        (None, "UTC", "is a str"),
        (5, "UTC", "is a str"),
        ("0 5 * * *", "Mars/Olympus_Mons", "unknown time zone"),
        ("0 5 * * *", "", "IANA time zone"),
        ("0 5 * * *", None, "IANA time zone"),
        ("0 5 * * *", "../etc/passwd", "unknown time zone"),
    ],
)
def test_invalid_expressions_and_zones(expr: Any, tz: Any, fragment: str) -> None:
    with pytest.raises(InvalidCron) as info:
        CronTrigger(expr, tz)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_normalisation_aliases_equality() -> None:
    assert CronTrigger("  0   5 * *   * ").expr == "0 5 * * *"
    assert CronTrigger("@daily") == CronTrigger("0 0 * * *")
    assert CronTrigger("@DAILY").expr == ALIASES["@daily"]
    assert CronTrigger("@daily") != CronTrigger("@daily", "Europe/Berlin")
    assert hash(CronTrigger("@hourly")) == hash(CronTrigger("0 * * * *"))
    assert CronTrigger("0 5 * * *", ZoneInfo(BERLIN)) == CronTrigger("0 5 * * *", BERLIN)
    assert repr(CronTrigger("0 5 * * *", BERLIN)) == "CronTrigger('0 5 * * *', tz='Europe/Berlin')"
    assert CronTrigger("0 5 * * *") != "0 5 * * *"


def test_one_value_ranges_mean_that_value_not_every_value() -> None:
    """croniter 7 reads ``5-5`` as ``*``; the trigger rewrites it to ``5``."""
    t = CronTrigger("5-5 0-0 * * *")
    assert t.expr == "5 0 * * *"
    start = ms(2024, 1, 1)
    assert t.fire_times_between(start, start + 24 * H) == [ms(2024, 1, 1, 0, 5)]
    assert CronTrigger("0 0 * * mon-MON").expr == "0 0 * * mon"
    assert CronTrigger("1-1/5,7 * * * *").expr == "1,7 * * * *"


@pytest.mark.parametrize(
    ("expr", "interval"),
    [
        ("0 * * * *", True),
        ("*/15 * * * *", True),
        ("*/20 2 * * *", True),
        ("30 2 * * *", False),
        ("0 9-17 * * 1-5", False),
        ("0 0-23 * * *", False),
        ("@daily", False),
        ("@hourly", True),
        ("*/10 30 2 * * *", False),
        ("0 0 * * * *", True),
    ],
)
def test_interval_classification(expr: str, interval: bool) -> None:
    assert CronTrigger(expr).is_interval is interval


# -- plain next fire times ---------------------------------------------------------------


def test_next_fire_is_strictly_after() -> None:
    t = CronTrigger("0 5 * * *")
    five = ms(2024, 1, 2, 5)
    assert t.next_fire_ms(five - 1) == five
    assert t.next_fire_ms(five) == five + 24 * H
    assert t.next_fire_ms(five - 999) == five


def test_zone_shifts_the_instant() -> None:
    t = CronTrigger("0 5 * * *", "Asia/Shanghai")
    assert utc(t.next_fire_ms(ms(2024, 1, 1))) == "2024-01-01T21:00:00Z"


def test_six_fields_have_seconds_first() -> None:
    t = CronTrigger("*/10 * * * * *")
    assert t.has_seconds
    start = ms(2024, 1, 1)
    assert t.fire_times_between(start, start + 30_000) == [
        start + 10_000,
        start + 20_000,
        start + 30_000,
    ]
    assert CronTrigger("30 0 12 * * *").next_fire_ms(start) == ms(2024, 1, 1, 12, 0, 30)


def test_calendar_features_from_croniter() -> None:
    last_day = CronTrigger("0 0 L * *")
    assert utc(last_day.next_fire_ms(ms(2024, 2, 1))) == "2024-02-29T00:00:00Z"
    weekdays = CronTrigger("0 9 * * mon-fri", NY)
    fires = weekdays.fire_times_between(ms(2024, 1, 6, tz=NY), ms(2024, 1, 13, tz=NY))
    assert [weekdays.local(f).strftime("%a %H:%M") for f in fires] == [
        "Mon 09:00",
        "Tue 09:00",
        "Wed 09:00",
        "Thu 09:00",
        "Fri 09:00",
    ]
    leap = CronTrigger("0 0 29 2 *")
    assert utc(leap.next_fire_ms(ms(2024, 3, 1))) == "2028-02-29T00:00:00Z"


def test_fire_times_between_bounds_and_limit() -> None:
    t = CronTrigger("*/15 * * * *")
    start = ms(2024, 1, 1)
    assert t.fire_times_between(start, start + H) == [start + k * 15 * 60_000 for k in (1, 2, 3, 4)]
    assert t.fire_times_between(start - 1, start) == [start]
    assert t.fire_times_between(start, start + H, limit=2) == [start + 900_000, start + 1_800_000]
    assert t.fire_times_between(start, start + H, limit=0) == []
    assert t.fire_times_between(start, start) == []
    with pytest.raises(ValueError, match="limit"):
        t.fire_times_between(start, start + H, limit=-1)


# -- DST: named cases --------------------------------------------------------------------


def test_spring_forward_fixed_job_in_gap_runs_once_at_the_jump() -> None:
    t = CronTrigger("30 2 * * *", NY)
    fires = fires_on_local_day(t, 2024, 3, 10)
    assert [utc(f) for f in fires] == ["2024-03-10T07:00:00Z"]
    assert [local_str(t, f) for f in fires] == ["03:00-0400"]
    assert [utc(f) for f in fires_on_local_day(t, 2024, 3, 9)] == ["2024-03-09T07:30:00Z"]
    assert [utc(f) for f in fires_on_local_day(t, 2024, 3, 11)] == ["2024-03-11T06:30:00Z"]
    berlin = CronTrigger("30 2 * * *", BERLIN)
    assert [utc(f) for f in fires_on_local_day(berlin, 2024, 3, 31)] == ["2024-03-31T01:00:00Z"]


def test_spring_forward_two_gap_times_and_the_jump_time_collapse_to_one_fire() -> None:
    t = CronTrigger("0,30 2,3 * * *", NY)
    assert [local_str(t, f) for f in fires_on_local_day(t, 2024, 3, 10)] == [
        "03:00-0400",
        "03:30-0400",
    ]


def test_spring_forward_interval_jobs_skip_the_gap() -> None:
    hourly = CronTrigger("0 * * * *", NY)
    fires = fires_on_local_day(hourly, 2024, 3, 10)
    assert len(fires) == 23
    assert "02:00-0500" not in [local_str(hourly, f) for f in fires]
    assert all(b - a == H for a, b in itertools.pairwise(fires))
    assert fires_on_local_day(CronTrigger("*/20 2 * * *", NY), 2024, 3, 10) == []
    assert len(fires_on_local_day(CronTrigger("0 * * * *", BERLIN), 2024, 3, 31)) == 23


def test_fall_back_fixed_job_runs_once_at_first_occurrence() -> None:
    t = CronTrigger("30 1 * * *", NY)
    fires = fires_on_local_day(t, 2024, 11, 3)
    assert [utc(f) for f in fires] == ["2024-11-03T05:30:00Z"]
    assert [local_str(t, f) for f in fires] == ["01:30-0400"]
    assert [utc(f) for f in fires_on_local_day(t, 2024, 11, 4)] == ["2024-11-04T06:30:00Z"]
    berlin = CronTrigger("30 2 * * *", BERLIN)
    assert [local_str(berlin, f) for f in fires_on_local_day(berlin, 2024, 10, 27)] == [
        "02:30+0200"
    ]


def test_fall_back_fixed_job_asked_from_inside_the_repeat_does_not_rerun() -> None:
    t = CronTrigger("30 1 * * *", NY)
    inside_second_pass = ms(2024, 11, 3, 6, 15)  # 01:15 EST, the repeated hour
    assert utc(t.next_fire_ms(inside_second_pass)) == "2024-11-04T06:30:00Z"
    after_first = ms(2024, 11, 3, 5, 30)
    assert utc(t.next_fire_ms(after_first)) == "2024-11-04T06:30:00Z"


def test_fall_back_interval_jobs_run_in_both_passes() -> None:
    hourly = CronTrigger("0 * * * *", NY)
    fires = fires_on_local_day(hourly, 2024, 11, 3)
    assert len(fires) == 25
    assert all(b - a == H for a, b in itertools.pairwise(fires))
    locals_ = [local_str(hourly, f) for f in fires]
    assert locals_[1:4] == ["01:00-0400", "01:00-0500", "02:00-0500"]
    quarter = CronTrigger("*/15 1 * * *", NY)
    assert len(fires_on_local_day(quarter, 2024, 11, 3)) == 8
    assert len(fires_on_local_day(CronTrigger("0 * * * *", BERLIN), 2024, 10, 27)) == 25


def test_croniter_alone_double_fires_a_fixed_job_which_we_correct() -> None:
    """Pins the upstream behaviour this module corrects (croniter 7)."""
    start = datetime(2024, 11, 3, 0, 0, tzinfo=ZoneInfo(NY))
    it = croniter("30 1 * * *", start)
    raw = [it.get_next(datetime).astimezone(UTC).strftime("%d %H:%M") for _ in range(2)]
    assert raw == ["03 05:30", "03 06:30"]  # 01:30 EDT and 01:30 EST on the same day
    ours = CronTrigger("30 1 * * *", NY)
    assert [
        utc(f) for f in ours.fire_times_between(int(start.timestamp()) * 1000, ms(2024, 11, 4, 12))
    ] == ["2024-11-03T05:30:00Z", "2024-11-04T06:30:00Z"]


def test_thirty_minute_dst_lord_howe() -> None:
    # 2024-04-07 02:00 +11 -> 01:30 +1030; 2024-10-06 02:00 +1030 -> 02:30 +11.
    t = CronTrigger("45 1 * * *", "Australia/Lord_Howe")
    assert [local_str(t, f) for f in fires_on_local_day(t, 2024, 4, 7)] == ["01:45+1100"]
    g = CronTrigger("15 2 * * *", "Australia/Lord_Howe")
    assert [local_str(g, f) for f in fires_on_local_day(g, 2024, 10, 6)] == ["02:30+1100"]
    half_hourly = CronTrigger("*/30 * * * *", "Australia/Lord_Howe")
    assert len(fires_on_local_day(half_hourly, 2024, 4, 7)) == 49


def test_negative_dst_dublin_uses_wall_clock_not_dst_flag() -> None:
    # Dublin's tzdata has winter as "negative DST"; the wall clock still falls back
    # 2024-10-27 02:00 IST -> 01:00 GMT.
    t = CronTrigger("30 1 * * *", "Europe/Dublin")
    assert [utc(f) for f in fires_on_local_day(t, 2024, 10, 27)] == ["2024-10-27T00:30:00Z"]


def test_midnight_that_does_not_exist_sao_paulo() -> None:
    # 2018-11-04 00:00 -03 -> 01:00 -02: midnight never happens that day.
    t = CronTrigger("0 0 * * *", "America/Sao_Paulo")
    fire = t.next_fire_ms(ms(2018, 11, 3, 12, tz="America/Sao_Paulo"))
    assert utc(fire) == "2018-11-04T03:00:00Z"
    assert t.local(fire).strftime("%d %H:%M%z") == "04 01:00-0200"


def test_zone_with_no_dst_is_plain() -> None:
    t = CronTrigger("30 2 * * *", "Asia/Kolkata")
    assert utc(t.next_fire_ms(ms(2024, 3, 10))) == "2024-03-10T21:00:00Z"


# -- DST: property test against a clock-watcher model ------------------------------------


def _field_values(text: str, low: int, high: int) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*":
            lo, hi = low, high
        elif "-" in base:
            lo, hi = (int(x) for x in base.split("-"))
        else:
            lo = hi = int(base)
        out.update(range(lo, hi + 1, step))
    return out


def model_fires(expr: str, tz: str, start_s: int, end_s: int, step: int) -> list[int]:
    """Fire instants in (start_s, end_s] by watching the wall clock every `step` seconds."""
    fields = expr.split()
    sec_f, min_f, hour_f = (
        (fields[0], fields[1], fields[2]) if len(fields) == 6 else ("0", fields[0], fields[1])
    )
    secs, mins, hours = (
        _field_values(sec_f, 0, 59),
        _field_values(min_f, 0, 59),
        _field_values(hour_f, 0, 23),
    )
    interval = min_f.startswith("*") or hour_f.startswith("*")
    zone = ZoneInfo(tz)

    def wall(t: int) -> datetime:
        return datetime.fromtimestamp(t, zone).replace(tzinfo=None)

    def matches(w: datetime) -> bool:
        return w.second in secs and w.minute in mins and w.hour in hours

    # The clock has shown everything up to the highest wall time of the last day.
    seen = max(wall(t) for t in range(start_s - 86400, start_s + 1, 60))
    fires = []
    for t in range(start_s + step, end_s + 1, step):
        w = wall(t)
        if interval:
            if matches(w):
                fires.append(t)
        elif w > seen:
            passed, x = False, w
            while x > seen:  # every wall time the clock passed since it last moved on
                passed = passed or matches(x)
                x -= timedelta(seconds=step)
            if passed:
                fires.append(t)
        seen = max(seen, w)
    return fires


def _transitions(tz: str, year: int) -> list[int]:
    zone = ZoneInfo(tz)
    t = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    found, prev = [], datetime.fromtimestamp(t, zone).utcoffset()
    for _ in range(366 * 24):
        t += 3600
        off = datetime.fromtimestamp(t, zone).utcoffset()
        if off != prev:
            found.append(t)
            prev = off
    return found


ZONES = [
    NY,
    BERLIN,
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Europe/Dublin",
    "America/Sao_Paulo",
    "America/Santiago",
    "Asia/Tehran",
    "UTC",
]
TRANSITIONS = {
    (tz, y): _transitions(tz, y) or [int(datetime(y, 6, 1, tzinfo=UTC).timestamp())]
    for tz in ZONES
    for y in (2018, 2024)
}


def field(low: int, high: int, step_choices: tuple[int, ...]) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        st.sampled_from(step_choices).map(lambda s: f"*/{s}"),
        value.map(str),
        st.lists(value, min_size=2, max_size=3, unique=True).map(
            lambda v: ",".join(map(str, sorted(v)))
        ),
        st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}"),
    )


@settings(max_examples=150, deadline=None)
@given(
    minute=field(0, 59, (5, 15, 20, 30)).filter(lambda f: f != "*"),
    hour=field(0, 23, (2, 3, 5)),
    tz=st.sampled_from(ZONES),
    year=st.sampled_from([2018, 2024]),
    which=st.integers(0, 1),
    shift_min=st.integers(-180, 60),
)
def test_minute_expressions_match_the_clock_watcher(
    minute: str, hour: str, tz: str, year: int, which: int, shift_min: int
) -> None:
    transitions = TRANSITIONS[(tz, year)]
    start = transitions[which % len(transitions)] + shift_min * 60
    end = start + 6 * 3600
    expr = f"{minute} {hour} * * *"
    expected = [s * 1000 for s in model_fires(expr, tz, start, end, 60)]
    assert CronTrigger(expr, tz).fire_times_between(start * 1000, end * 1000) == expected


@settings(max_examples=40, deadline=None)
@given(
    second=st.sampled_from(["0", "*/10", "20,40", "*/30"]),
    minute=st.sampled_from(["*/20", "0", "15,45", "*"]),
    hour=st.sampled_from(["1", "2", "*", "1-3", "*/2"]),
    tz=st.sampled_from([NY, BERLIN, "Australia/Lord_Howe"]),
    which=st.integers(0, 1),
    shift_min=st.integers(-120, 30),
)
def test_second_expressions_match_the_clock_watcher(
    second: str, minute: str, hour: str, tz: str, which: int, shift_min: int
) -> None:
    transitions = TRANSITIONS[(tz, 2024)]
    start = transitions[which] + shift_min * 60
    end = start + 3 * 3600
    expr = f"{second} {minute} {hour} * * *"
    expected = [s * 1000 for s in model_fires(expr, tz, start, end, 10)]
    assert CronTrigger(expr, tz).fire_times_between(start * 1000, end * 1000) == expected
