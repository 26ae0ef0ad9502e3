"""IntervalTrigger and @app.every: anchored, drift-free fire times; misfires on
intervals; the planner arming them on a real broker, once across two schedulers."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sched_time import ms

from broker_adapter import open_broker
from broker_adapter.clock import ManualClock
from scheduler import Scheduler
from scheduler.errors import InvalidJobSpec, InvalidSchedule
from scheduler.interval import IntervalTrigger, format_span
from scheduler.misfire import latest_fire_times, resolve_misfires
from scheduler.plan import jitter_ms
from scheduler.spec import MisfirePolicy, cron_key
from scheduler.triggers import CronTrigger
from tests.helpers import assert_nothing, pull_one

S, MIN, HOUR = 1000, 60_000, 3_600_000
T0 = ms(2024, 1, 1, 12)


# -- the trigger --------------------------------------------------------------------------


def test_default_anchor_is_the_unix_epoch() -> None:
    every_90 = IntervalTrigger(timedelta(seconds=90))
    assert every_90.anchor_ms == 0 and every_90.every_ms == 90 * S
    assert every_90.next_fire_ms(0) == 90 * S
    assert every_90.next_fire_ms(90 * S - 1) == 90 * S
    assert every_90.next_fire_ms(90 * S) == 180 * S
    assert every_90.next_fire_ms(-1) == 0
    # every process computes the same times, whatever it was started at
    assert IntervalTrigger(90).next_fire_ms(T0 + 1) == IntervalTrigger(90.0).next_fire_ms(T0 + 1)


def test_every_7_minutes_crosses_hour_boundaries_without_drift() -> None:
    every_7 = IntervalTrigger(timedelta(minutes=7))
    times = every_7.fire_times_between(T0, T0 + 3 * HOUR)
    assert [b - a for a, b in itertools.pairwise(times)] == [7 * MIN] * (len(times) - 1)
    assert all(t % (7 * MIN) == 0 for t in times)  # n * 7 min after the epoch
    # 12:00 UTC on 2024-01-01 is 4,057,405 x 7 min + 5 min: the first run is 12:02
    minutes = [every_7.local(t).strftime("%H:%M") for t in times[:12]]
    assert minutes == [
        "12:02", "12:09", "12:16", "12:23", "12:30", "12:37", "12:44", "12:51", "12:58",
        "13:05", "13:12", "13:19",
    ]  # fmt: skip
    assert len(times) == 26  # 12:02 ... 14:57
    # the 1000th occurrence from here is exactly 7000 minutes later: nothing accumulates
    assert every_7.fire_times_between(T0, T0 + 10**6 * MIN, limit=1001)[-1] == times[0] + 7000 * MIN


def test_an_interval_is_real_time_across_a_dst_change() -> None:
    berlin = IntervalTrigger(timedelta(minutes=45), tz="Europe/Berlin")
    start = ms(2024, 3, 31, 0, tz="UTC")  # clocks jump 02:00 -> 03:00 local at 01:00 UTC
    times = berlin.fire_times_between(start, start + 4 * HOUR)
    assert {b - a for a, b in itertools.pairwise(times)} == {45 * MIN}
    shown = [berlin.local(t).strftime("%H:%M%z") for t in times[:4]]
    assert shown == ["01:45+0100", "03:30+0200", "04:15+0200", "05:00+0200"]


def test_anchor_sets_the_phase() -> None:
    anchor = datetime(2024, 1, 1, 0, 0, 30, tzinfo=UTC)
    every_minute = IntervalTrigger(timedelta(minutes=1), anchor)
    assert every_minute.next_fire_ms(T0) == T0 + 30 * S
    assert every_minute.next_fire_ms(ms(2023, 6, 1)) == ms(2023, 6, 1) + 30 * S  # before it too
    assert every_minute == IntervalTrigger(60, int(anchor.timestamp()) * 1000 + 60 * S)
    assert every_minute != IntervalTrigger(60)
    assert IntervalTrigger(60, T0) == IntervalTrigger(60)  # T0 is on the epoch's phase
    assert "every 1m" in every_minute.describe()
    assert format_span(90 * S) == "1m30s" and format_span(1500) == "1500ms"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0.5,), "at least 1 s"),
        ((timedelta(0),), "at least 1 s"),
        ((-60,), "at least 1 s"),
        ((float("inf"),), "finite"),
        (("90",), "timedelta"),
        ((True,), "timedelta"),
        ((60, datetime(2024, 1, 1)), "naive"),
        ((60, "2024-01-01"), "aware datetime"),
        ((60, None, "Mars/Base"), "unknown time zone"),
    ],
)
def test_bad_intervals_are_refused(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(InvalidSchedule, match=match):
        IntervalTrigger(*args)  # type: ignore[arg-type]


@given(
    every=st.integers(1000, 10**8),
    anchor=st.integers(-(10**13), 10**13),
    t=st.integers(-(10**13), 10**13),
)
def test_next_fire_time_is_the_first_multiple_after(every: int, anchor: int, t: int) -> None:
    trigger = IntervalTrigger(timedelta(milliseconds=every), anchor)
    nxt = trigger.next_fire_ms(t)
    assert t < nxt <= t + every
    assert (nxt - anchor) % every == 0 and trigger.is_fire_time(nxt)
    assert not trigger.is_fire_time(nxt - 1)


@given(
    every=st.integers(1000, 10**6),
    start=st.integers(0, 10**8),
    span=st.integers(0, 10**7),
    n=st.integers(1, 30),
)
def test_ranges_match_stepping(every: int, start: int, span: int, n: int) -> None:
    trigger = IntervalTrigger(timedelta(milliseconds=every), 12_345)
    stepped = []
    for t in trigger.iter_fire_ms(start):
        if t > start + span:
            break
        stepped.append(t)
    assert trigger.fire_times_between(start, start + span) == stepped
    assert trigger.fire_times_between(start, start + span, limit=n) == stepped[:n]
    assert trigger.latest_fire_times(start, start + span, n) == stepped[-n:]
    assert latest_fire_times(trigger, start, start + span, n) == stepped[-n:]


# -- misfires on intervals ------------------------------------------------------------------


@given(
    last=st.integers(0, 48).map(lambda k: T0 + k * 10 * MIN),
    gap=st.integers(0, 6 * HOUR),
    grace=st.one_of(st.none(), st.integers(0, 3 * HOUR)),
    coalesce=st.sampled_from(["latest", "earliest", "all"]),
    catch_up=st.integers(1, 5),
)
def test_misfires_on_an_interval_match_the_same_cron(
    last: int, gap: int, grace: int | None, coalesce: str, catch_up: int
) -> None:
    """Every 10 minutes as an interval and as ``*/10`` have the same fire times, so
    the misfire rules decide the same for both."""
    policy = MisfirePolicy(None if grace is None else grace / 1000, coalesce, catch_up)  # type: ignore[arg-type]
    as_interval = resolve_misfires(IntervalTrigger(600), last, last + gap, policy)
    as_cron = resolve_misfires(CronTrigger("*/10 * * * *"), last, last + gap, policy)
    assert as_interval == as_cron


def test_interval_downtime_with_grace() -> None:
    every_7 = IntervalTrigger(timedelta(minutes=7))
    first = every_7.next_fire_ms(T0)  # 12:02
    # down from 12:02 to 12:41: missed 12:09 ... 12:37 (5 of them)
    policy = MisfirePolicy(grace_s=15 * 60, coalesce="all")
    d = resolve_misfires(every_7, first, first + 39 * MIN, policy)
    assert d.run == (first + 28 * MIN, first + 35 * MIN)  # 12:30 and 12:37 are within 15 min
    assert d.skipped == 3 and d.next_fire_ms == first + 42 * MIN


# -- @app.every and the planner ---------------------------------------------------------------


def test_every_registers_an_interval_cron_spec(app: Scheduler) -> None:
    @app.every(timedelta(seconds=90), name="hb", jitter=5, misfire_grace_time=10, max_running=2)
    def heartbeat() -> str:
        return "beat"

    assert heartbeat() == "beat"
    [spec] = app.registry.crons()
    assert spec.name == "hb" and isinstance(spec.trigger, IntervalTrigger)
    assert (spec.trigger.every_ms, spec.jitter, spec.misfire.grace_s, spec.max_running) == (
        90 * S,
        5.0,
        10.0,
        2,
    )
    with pytest.raises(InvalidSchedule, match="at least 1 s"):
        app.every(0.1)
    with pytest.raises(InvalidJobSpec, match="no arguments"):

        @app.every(60, name="needs")
        def needs(day: str) -> None: ...

    assert [c.name for c in app.registry.crons()] == ["hb"]


def test_planner_arms_and_fires_an_interval_job(app: Scheduler, manual_clock: ManualClock) -> None:
    manual_clock.set(T0)
    app.every(timedelta(minutes=7), name="seven", misfire_grace_time=60)(lambda: None)
    assert app.planner.arm_all() == 1
    first = T0 + 2 * MIN  # 12:02
    [view] = app.pending()
    assert (view.key, view.deliver_at_ms, view.tags) == (cron_key("seven", first), first, "seven")
    manual_clock.set(first + 30 * S)
    with app.broker.consumer("w", ["chronoq.jobs"]) as consumer:
        m = pull_one(consumer)
        assert m.key == cron_key("seven", first)
        assert app.planner.on_fired("seven", first, manual_clock.now_ms()) == [first]
        assert consumer.ack(m)
    assert [v.key for v in app.pending()] == [cron_key("seven", first + 7 * MIN)]
    # a redelivery far too late: beyond grace, nothing runs, the next one stays armed
    assert app.planner.on_fired("seven", first, first + 8 * MIN) == []
    assert [v.key for v in app.pending()] == [
        cron_key("seven", first + 7 * MIN),
        cron_key("seven", first + 14 * MIN),
    ]


def test_two_schedulers_arm_an_interval_once(data_dir: Path, manual_clock: ManualClock) -> None:
    manual_clock.set(T0)
    with open_broker(f"rocksdb://{data_dir}", clock=manual_clock) as broker:
        apps = [Scheduler(broker, clock=manual_clock) for _ in range(2)]
        for a in apps:
            a.every(timedelta(seconds=90), name="hb", jitter=20)(lambda: None)
        assert [a.planner.arm_all() for a in apps] == [1, 0]
        fired = []
        with broker.consumer("w", ["chronoq.jobs"]) as consumer:
            for n in range(1, 5):
                t = T0 + n * 90 * S
                [view] = apps[0].pending()
                assert view.deliver_at_ms == t + jitter_ms(cron_key("hb", t), 20)
                manual_clock.set(view.deliver_at_ms)
                m = pull_one(consumer)
                # both schedulers see the delivery (e.g. a redelivery to the other one)
                assert [a.planner.on_fired("hb", t, manual_clock.now_ms()) for a in apps] == [
                    [t],
                    [t],
                ]
                assert consumer.ack(m)
                fired.append(m.key)
                assert [a.planner.arm_all() for a in apps] == [0, 0]
            assert_nothing(consumer)
        assert fired == [cron_key("hb", T0 + n * 90 * S) for n in range(1, 5)]
