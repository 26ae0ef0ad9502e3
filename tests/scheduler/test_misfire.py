"""resolve_misfires: named cases, then properties against a direct model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_time import ms

from scheduler.misfire import MAX_COUNTED, MisfireDecision, latest_fire_times, resolve_misfires
from scheduler.spec import MisfirePolicy
from scheduler.triggers import CronTrigger

MIN = 60_000
EVERY_10 = CronTrigger("*/10 * * * *")
T0 = ms(2024, 1, 1, 12)  # a fire time of EVERY_10


def test_first_start_catches_nothing_up() -> None:
    d = resolve_misfires(EVERY_10, None, T0 + 25 * MIN, MisfirePolicy())
    assert d == MisfireDecision(run=(), skipped=0, next_fire_ms=T0 + 30 * MIN)


def test_nothing_missed() -> None:
    d = resolve_misfires(EVERY_10, T0, T0 + 5 * MIN, MisfirePolicy())
    assert d == MisfireDecision(run=(), skipped=0, next_fire_ms=T0 + 10 * MIN)


def test_on_time_occurrence_is_due_not_skipped() -> None:
    d = resolve_misfires(EVERY_10, T0, T0 + 10 * MIN, MisfirePolicy(grace_s=0))
    assert d.run == (T0 + 10 * MIN,) and d.skipped == 0
    assert d.next_fire_ms == T0 + 20 * MIN


@pytest.mark.parametrize(
    ("policy", "run", "skipped"),
    [
        # down from 12:00 to 12:45: missed 12:10, 12:20, 12:30, 12:40
        (MisfirePolicy(), (40,), 3),
        (MisfirePolicy(coalesce="earliest"), (10,), 3),
        (MisfirePolicy(coalesce="all"), (10, 20, 30, 40), 0),
        (MisfirePolicy(coalesce="all", max_catch_up=2), (30, 40), 2),
        (MisfirePolicy(grace_s=20 * 60, coalesce="all"), (30, 40), 2),
        (MisfirePolicy(grace_s=20 * 60, coalesce="earliest"), (30,), 3),
        (MisfirePolicy(grace_s=15 * 60), (40,), 3),
        (MisfirePolicy(grace_s=4 * 60), (), 4),
        (MisfirePolicy(grace_s=5 * 60, coalesce="all"), (40,), 3),  # exactly at the edge
    ],
)
def test_restart_after_downtime(policy: MisfirePolicy, run: tuple[int, ...], skipped: int) -> None:
    d = resolve_misfires(EVERY_10, T0, T0 + 45 * MIN, policy)
    assert d.run == tuple(T0 + m * MIN for m in run)
    assert d.skipped == skipped
    assert d.next_fire_ms == T0 + 50 * MIN


def test_last_fire_in_the_future_never_repeats_it() -> None:
    d = resolve_misfires(EVERY_10, T0 + 20 * MIN, T0 + 5 * MIN, MisfirePolicy(coalesce="all"))
    assert d == MisfireDecision(run=(), skipped=0, next_fire_ms=T0 + 30 * MIN)


def test_long_downtime_of_a_dense_cron_is_bounded() -> None:
    every_second = CronTrigger("* * * * * *")
    last, now = T0, T0 + 30 * 24 * 3600 * 1000
    d = resolve_misfires(every_second, last, now, MisfirePolicy(coalesce="all", max_catch_up=5))
    assert d.run == tuple(now - k * 1000 for k in (4, 3, 2, 1, 0))
    assert d.skipped == MAX_COUNTED
    assert resolve_misfires(every_second, last, now, MisfirePolicy()).run == (now,)
    assert resolve_misfires(every_second, last, now, MisfirePolicy(coalesce="earliest")).run == (
        last + 1000,
    )


def test_latest_fire_times_of_a_sparse_cron_across_years() -> None:
    yearly = CronTrigger("0 0 1 1 *", "Europe/Berlin")
    got = latest_fire_times(yearly, ms(2010, 1, 1), ms(2024, 6, 1), 3)
    assert got == [ms(y, 1, 1, tz="Europe/Berlin") for y in (2022, 2023, 2024)]
    assert latest_fire_times(yearly, ms(2024, 1, 1), ms(2024, 6, 1), 3) == []
    with pytest.raises(ValueError):
        latest_fire_times(yearly, 0, 1, 0)


def test_dst_missed_fixed_occurrence_runs_once() -> None:
    # Down over the NY fall-back night: "30 1 * * *" had one occurrence, not two.
    t = CronTrigger("30 1 * * *", "America/New_York")
    last = ms(2024, 11, 2, 5, 30)
    d = resolve_misfires(t, last, ms(2024, 11, 3, 12), MisfirePolicy(coalesce="all"))
    assert d.run == (ms(2024, 11, 3, 5, 30),)
    assert d.skipped == 0


# -- properties ------------------------------------------------------------------------

TRIGGERS = [
    CronTrigger("*/10 * * * *"),
    CronTrigger("0 * * * *", "America/New_York"),
    CronTrigger("30 1 * * *", "America/New_York"),
    CronTrigger("*/20 2 * * *", "Europe/Berlin"),
    CronTrigger("15,45 * * * *", "Australia/Lord_Howe"),
]
BASE = ms(2024, 11, 2, 20)  # a few hours before New York falls back


def model(trigger: CronTrigger, last: int, now: int, policy: MisfirePolicy) -> MisfireDecision:
    due = trigger.fire_times_between(last, now) if last < now else []
    grace = policy.grace_ms
    ok = [t for t in due if grace is None or now - t <= grace]
    if not ok:
        run: list[int] = []
    elif policy.coalesce == "latest":
        run = [ok[-1]]
    elif policy.coalesce == "earliest":
        run = [ok[0]]
    else:
        run = ok[-policy.max_catch_up :]
    after = max(last, now)
    return MisfireDecision(tuple(run), len(due) - len(run), trigger.next_fire_ms(after))


policies = st.builds(
    MisfirePolicy,
    grace_s=st.none() | st.integers(0, 6 * 3600),
    coalesce=st.sampled_from(["latest", "earliest", "all"]),
    max_catch_up=st.integers(1, 5),
)


@settings(max_examples=300, deadline=None)
@given(
    trigger=st.sampled_from(TRIGGERS),
    last_offset_s=st.integers(0, 12 * 3600),
    gap_s=st.integers(-3600, 18 * 3600),
    policy=policies,
)
def test_matches_model(
    trigger: CronTrigger, last_offset_s: int, gap_s: int, policy: MisfirePolicy
) -> None:
    last = BASE + last_offset_s * 1000
    now = last + gap_s * 1000
    got = resolve_misfires(trigger, last, now, policy)
    assert got == model(trigger, last, now, policy)
    # Properties that hold whatever the model says:
    assert list(got.run) == sorted(set(got.run))
    assert all(last < t <= now for t in got.run)
    if policy.grace_ms is not None:
        assert all(now - t <= policy.grace_ms for t in got.run)
    if policy.coalesce != "all":
        assert len(got.run) <= 1
    assert got.next_fire_ms > max(now, last)
    assert got.skipped >= 0


@settings(max_examples=100, deadline=None)
@given(
    trigger=st.sampled_from(TRIGGERS),
    offset_s=st.integers(0, 24 * 3600),
    span_s=st.integers(0, 24 * 3600),
    n=st.integers(1, 30),
)
def test_latest_fire_times_matches_forward_enumeration(
    trigger: CronTrigger, offset_s: int, span_s: int, n: int
) -> None:
    after = BASE + offset_s * 1000
    until = after + span_s * 1000
    assert (
        latest_fire_times(trigger, after, until, n) == trigger.fire_times_between(after, until)[-n:]
    )
