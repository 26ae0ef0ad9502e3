"""CronPlanner on the real embedded broker, driven by a ManualClock.

Each test plays the dispatcher by hand: advance the clock to the armed
occurrence, pull its message with a plain consumer on the job topic, call
``planner.on_fired`` and look at what is armed next (``app.pending()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_time import ms, utc

from broker_adapter import SendStatus, open_broker
from broker_adapter.base import Consumer
from broker_adapter.clock import ManualClock
from broker_adapter.message import Message
from scheduler import CronPlanner, JobCall, Scheduler
from scheduler.cron import jitter_ms
from scheduler.errors import InvalidCron, InvalidJobSpec, JobNotFound
from scheduler.spec import cron_key
from tests.helpers import assert_nothing, pull_one

NY, BERLIN = "America/New_York", "Europe/Berlin"
S, MIN = 1000, 60_000
T0 = ms(2024, 1, 1, 12)  # a fire time of */10


def armed(app: Scheduler) -> list[str]:
    """Keys of the pending cron occurrences, in due order."""
    return [v.key for v in app.pending(limit=1000) if v.key and v.key.startswith("cron:")]


def fire_next(app: Scheduler, consumer: Consumer, clock: ManualClock) -> tuple[int, list[int]]:
    """Advance to the one armed occurrence, take its message, hand it to the planner."""
    [view] = [v for v in app.pending(limit=1000) if v.key and v.key.startswith("cron:")]
    clock.set(max(clock.now_ms(), view.deliver_at_ms))
    m = pull_one(consumer)
    assert m.key == view.key
    parsed = app.planner.parse(m.key)
    assert parsed is not None
    runs = app.planner.on_fired(*parsed, clock.now_ms())
    assert consumer.ack(m)
    return parsed[1], runs


@pytest.fixture
def consumer_of(app: Scheduler) -> Iterator[Callable[[Scheduler], Consumer]]:
    opened: list[Consumer] = []

    def make(which: Scheduler) -> Consumer:
        c = which.broker.consumer("test-workers", sorted(which.topics()))
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


def open_app(data_dir: Path, clock: ManualClock, **cron: Any) -> Scheduler:
    """A fresh Scheduler on ``data_dir`` with one cron job ``tick`` (*/10 by default)."""
    app = Scheduler(f"rocksdb://{data_dir}", clock=clock)
    expr = cron.pop("expr", "*/10 * * * *")
    app.cron(expr, name="tick", **cron)(lambda: None)
    return app


# -- decoration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "match"),
    [
        ("61 * * * *", "UTC", "does not parse"),
        ("* * *", "UTC", "fields"),
        ("0 0 30 2 *", "UTC", "no date"),
        ("@often", "UTC", "alias"),
        ("0 5 * * *", "Mars/Olympus_Mons", "unknown time zone"),
    ],
)
def test_invalid_cron_fails_at_decoration(app: Scheduler, expr: str, tz: str, match: str) -> None:
    with pytest.raises(InvalidCron, match=match):
        app.cron(expr, tz=tz)
    assert app.registry.crons() == []


def test_cron_options_are_checked_at_decoration(app: Scheduler) -> None:
    with pytest.raises(InvalidJobSpec, match="no arguments"):

        @app.cron("@daily")
        def needs_an_argument(day: str) -> None: ...

    with pytest.raises(InvalidJobSpec, match="coalesce"):
        app.cron("@daily", coalesce="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobSpec, match="misfire_grace_time"):
        app.cron("@daily", misfire_grace_time=-1)
    with pytest.raises(InvalidJobSpec, match="max_running"):
        app.cron("@daily", max_running=0)(lambda: None)
    assert app.registry.crons() == []


def test_cron_registers_a_cron_spec_and_a_callable_handle(app: Scheduler) -> None:
    @app.cron(
        "0 5 * * *",
        tz="Asia/Shanghai",
        misfire_grace_time=60,
        coalesce="all",
        max_running=2,
        jitter=5,
        name="nightly.cleanup",
    )
    def cleanup(day: str = "today") -> str:
        return f"cleaned {day}"

    @app.cron("@hourly", executor="spark")
    def report(spark: object) -> None: ...

    assert cleanup() == "cleaned today"
    [spec, _] = app.registry.crons()
    assert cleanup.cron is spec and spec.name == "nightly.cleanup"
    assert (spec.misfire.grace_s, spec.misfire.coalesce, spec.max_running, spec.jitter) == (
        60.0,
        "all",
        2,
        5.0,
    )
    assert spec.trigger.tz.key == "Asia/Shanghai"
    assert app.planner.parse(cron_key("nightly.cleanup", 123)) == ("nightly.cleanup", 123)
    assert app.planner.parse(cron_key("not.a.cron", 123)) is None
    assert app.planner.parse("order:42") is None and app.planner.parse(None) is None


# -- arming -----------------------------------------------------------------------------


def test_arm_all_arms_the_next_occurrence_once(data_dir: Path, manual_clock: ManualClock) -> None:
    manual_clock.set(T0 + 5 * MIN)
    with open_app(data_dir, manual_clock) as app:
        app.cron("0 5 * * *", tz="Asia/Shanghai", name="daily")(lambda: None)
        assert app.planner.arm_all() == 2
        assert app.planner.arm_all() == 0  # idempotent
        assert armed(app) == [
            cron_key("tick", T0 + 10 * MIN),
            cron_key("daily", ms(2024, 1, 2, 5, tz="Asia/Shanghai")),
        ]
        [view, _] = app.pending()
        assert view.deliver_at_ms == T0 + 10 * MIN
        assert app.broker.stats().pending == 2


def test_cron_message_format(
    app: Scheduler, manual_clock: ManualClock, consumer_of: Callable[[Scheduler], Consumer]
) -> None:
    manual_clock.set(T0 - MIN)
    app.cron("*/10 * * * *", name="tick", topic="crons")(lambda: None)
    consumer = consumer_of(app)
    app.planner.arm_all()
    manual_clock.set(T0)
    m = pull_one(consumer)
    assert (m.topic, m.key, m.deliver_at_ms) == ("crons", f"cron:tick:{T0}", T0)
    assert m.body == JobCall("tick").encode()


def test_on_fired_on_time_runs_it_and_arms_the_next(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    manual_clock.set(T0 - MIN)
    with (
        open_app(data_dir, manual_clock, misfire_grace_time=0) as app,
        app.broker.consumer("w", sorted(app.topics())) as consumer,
    ):
        app.planner.arm_all()
        for k in range(3):
            fire, runs = fire_next(app, consumer, manual_clock)
            assert (fire, runs) == (T0 + k * 10 * MIN, [fire])
            assert armed(app) == [cron_key("tick", fire + 10 * MIN)]


def test_on_fired_twice_for_one_occurrence_arms_once(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    manual_clock.set(T0)
    app.cron("*/10 * * * *", name="tick")(lambda: None)
    assert app.planner.on_fired("tick", T0, T0) == [T0]
    assert app.planner.on_fired("tick", T0, T0 + 5) == [T0]  # a redelivery runs again...
    assert armed(app) == [cron_key("tick", T0 + 10 * MIN)]  # ...but arms nothing new


def test_redelivery_after_the_next_occurrence_leaves_it_to_its_own_message(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    manual_clock.set(T0)
    app.cron("*/10 * * * *", name="tick", coalesce="all")(lambda: None)
    assert app.planner.on_fired("tick", T0, T0) == [T0]  # arms T0+10m
    # T0's message comes back (its ack was lost) after T0+10m had its own message:
    assert app.planner.on_fired("tick", T0, T0 + 25 * MIN) == [T0]


def test_redelivery_on_another_process_runs_no_occurrence_twice(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    """Three dispatchers on one broker: A takes T0 and dies; B runs the next
    occurrences from their own messages; T0 comes back to C, which armed nothing of
    them. C runs T0 again (at least once) but none of B's occurrences (a kill -9
    in tests/netns ran five twice)."""
    manual_clock.set(T0 - MIN)
    with open_broker(f"rocksdb://{data_dir}", clock=manual_clock) as broker:
        a, b, c = (Scheduler(broker, clock=manual_clock) for _ in range(3))
        for app in (a, b, c):
            app.cron("*/10 * * * *", name="tick", coalesce="all")(lambda: None)
        # T0 stays in flight on A for the whole test (A is dead: its ack never comes)
        with broker.consumer("w", ["chronoq.jobs"], invisible_ms=3_600_000) as consumer:
            assert a.planner.arm_all() == 1
            manual_clock.set(T0)
            first = pull_one(consumer)  # A took T0
            assert a.planner.on_fired("tick", T0, T0) == [T0]  # arms T0+10m
            for n in (1, 2):  # B runs T0+10m and T0+20m from their own messages
                t = T0 + n * 10 * MIN
                manual_clock.set(t)
                m = pull_one(consumer)
                assert m.key == cron_key("tick", t)
                assert b.planner.on_fired("tick", t, t) == [t]
                assert consumer.ack(m)
            now = T0 + 25 * MIN
            manual_clock.set(now)
            assert first.attempts == 1
            # (taken as a first delivery, it would catch up all three: D shows it)
            d = Scheduler(broker, clock=manual_clock)
            d.cron("*/10 * * * *", name="tick", coalesce="all")(lambda: None)
            assert d.planner.on_fired("tick", T0, now) == [T0, T0 + 10 * MIN, T0 + 20 * MIN]
            # Then T0's redelivery on C runs T0 alone and arms nothing new
            assert c.planner.on_fired("tick", T0, now, redelivery=True) == [T0]
            assert armed(c) == [cron_key("tick", T0 + 30 * MIN)]


def test_redelivery_of_a_cut_short_catch_up_arms_what_never_had_a_message(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    """A's first delivery of T0 came 25 min late and caught up three occurrences,
    then A died; the redelivery on B runs T0 and hands T0+10m and T0+20m, which
    never had messages, to messages of their own (due at once): run at least once,
    each by one delivery."""
    manual_clock.set(T0)
    with open_broker(f"rocksdb://{data_dir}", clock=manual_clock) as broker:
        a, b = (Scheduler(broker, clock=manual_clock) for _ in range(2))
        for app in (a, b):
            app.cron("*/10 * * * *", name="tick", coalesce="all")(lambda: None)
        now = T0 + 25 * MIN
        manual_clock.set(now)
        assert a.planner.on_fired("tick", T0, now) == [T0, T0 + 10 * MIN, T0 + 20 * MIN]
        assert b.planner.on_fired("tick", T0, now + 1, redelivery=True) == [T0]
        assert armed(b) == [cron_key("tick", T0 + n * 10 * MIN) for n in (1, 2, 3)]
        with broker.consumer("w", ["chronoq.jobs"]) as consumer:
            for n in (1, 2):  # each is delivered now and runs itself only
                m = pull_one(consumer)
                t = T0 + n * 10 * MIN
                assert m.key == cron_key("tick", t)
                assert b.planner.on_fired("tick", t, now + 2) == [t]
                assert consumer.ack(m)
            assert_nothing(consumer)


def test_on_fired_unknown_cron(app: Scheduler) -> None:
    @app.job(name="plain")
    def plain() -> None: ...

    with pytest.raises(JobNotFound):
        app.planner.on_fired("plain", T0, T0)


def test_delivery_reported_before_its_time_still_runs(app: Scheduler) -> None:
    """A dispatcher whose clock is slightly behind the broker's."""
    app.cron("*/10 * * * *", name="tick", misfire_grace_time=0)(lambda: None)
    assert app.planner.on_fired("tick", T0, T0 - 50) == [T0]


# -- DST --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "start", "expected"),
    [
        # NY spring forward 2024-03-10 02:00 EST -> 03:00 EDT: 02:30 runs once, at 03:00 EDT
        (
            "30 2 * * *",
            NY,
            ms(2024, 3, 8, 12, tz=NY),
            [
                ms(2024, 3, 9, 2, 30, tz=NY),
                ms(2024, 3, 10, 3, tz=NY),
                ms(2024, 3, 11, 2, 30, tz=NY),
            ],
        ),
        # NY fall back 2024-11-03 02:00 EDT -> 01:00 EST: 01:30 runs once (EDT)
        (
            "30 1 * * *",
            NY,
            ms(2024, 11, 2, 12, tz=NY),
            [ms(2024, 11, 3, 5, 30), ms(2024, 11, 4, 6, 30)],
        ),
        # NY hourly over the fall back: 01:00 EDT and 01:00 EST both run, an hour apart
        (
            "0 * * * *",
            NY,
            ms(2024, 11, 3, 0, 30, tz=NY),
            [ms(2024, 11, 3, 5), ms(2024, 11, 3, 6), ms(2024, 11, 3, 7), ms(2024, 11, 3, 8)],
        ),
        # Berlin spring forward 2024-03-31 02:00 CET -> 03:00 CEST
        (
            "30 2 * * *",
            BERLIN,
            ms(2024, 3, 30, 12, tz=BERLIN),
            [ms(2024, 3, 31, 1), ms(2024, 4, 1, 0, 30)],
        ),
        (
            "0 * * * *",
            BERLIN,
            ms(2024, 3, 31, 0, 30, tz=BERLIN),
            [ms(2024, 3, 31, 0), ms(2024, 3, 31, 1), ms(2024, 3, 31, 2)],
        ),
        # Berlin fall back 2024-10-27 03:00 CEST -> 02:00 CET
        (
            "0 * * * *",
            BERLIN,
            ms(2024, 10, 27, 0, 30, tz=BERLIN),
            [ms(2024, 10, 26, 23), ms(2024, 10, 27, 0), ms(2024, 10, 27, 1), ms(2024, 10, 27, 2)],
        ),
        (
            "30 2 * * *",
            BERLIN,
            ms(2024, 10, 26, 12, tz=BERLIN),
            [ms(2024, 10, 27, 0, 30), ms(2024, 10, 28, 1, 30)],
        ),
        # six fields (seconds) across the NY spring forward
        (
            "30 59 1 * * *",
            NY,
            ms(2024, 3, 10, 1, tz=NY),
            [ms(2024, 3, 10, 6, 59, 30), ms(2024, 3, 11, 5, 59, 30)],
        ),
    ],
)
def test_cron_across_dst(
    app: Scheduler,
    manual_clock: ManualClock,
    consumer_of: Callable[[Scheduler], Consumer],
    expr: str,
    tz: str,
    start: int,
    expected: list[int],
) -> None:
    manual_clock.set(start)
    app.cron(expr, tz=tz, name="dst", misfire_grace_time=0)(lambda: None)
    consumer = consumer_of(app)
    assert app.planner.arm_all() == 1
    fired = []
    for _ in expected:
        fire, runs = fire_next(app, consumer, manual_clock)
        assert runs == [fire], utc(fire)
        fired.append(fire)
        [key] = armed(app)
        assert key == cron_key("dst", app.registry.crons()[0].trigger.next_fire_ms(fire))
    assert [utc(t) for t in fired] == [utc(t) for t in expected]


# -- restarts ---------------------------------------------------------------------------


def down_over_occurrences(
    data_dir: Path, clock: ManualClock, back_at: int, **cron: Any
) -> tuple[Scheduler, int, list[int]]:
    """Arm at T0-5m, stop, come back at ``back_at``; return the new app and what the
    late occurrence's ``on_fired`` says."""
    clock.set(T0 - 5 * MIN)
    with open_app(data_dir, clock, **cron) as first:
        assert first.planner.arm_all() == 1
    clock.set(back_at)
    app = open_app(data_dir, clock, **cron)
    app.planner.arm_all()  # what the runner does at start-up
    with app.broker.consumer("w", sorted(app.topics())) as consumer:
        m = pull_one(consumer)  # the occurrence due while we were down fires on start
        parsed = app.planner.parse(m.key)
        assert parsed is not None
        runs = app.planner.on_fired(*parsed, clock.now_ms())
        consumer.ack(m)
        assert_nothing(consumer, wait_ms=100)
    return app, parsed[1], runs


def test_restart_within_grace_runs_the_missed_occurrence_once(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    app, fire, runs = down_over_occurrences(
        data_dir, manual_clock, T0 + 30 * S, misfire_grace_time=60
    )
    with app:
        assert (fire, runs) == (T0, [T0])
        assert armed(app) == [cron_key("tick", T0 + 10 * MIN)]


def test_restart_beyond_grace_skips_it(
    data_dir: Path, manual_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    app, fire, runs = down_over_occurrences(
        data_dir, manual_clock, T0 + 5 * MIN, misfire_grace_time=60
    )
    with app:
        assert (fire, runs) == (T0, [])
        assert armed(app) == [cron_key("tick", T0 + 10 * MIN)]
    assert "skipped occurrence" in caplog.text


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # down from 11:55 to 12:45: missed 12:00, 12:10, 12:20, 12:30, 12:40
        ({}, [40]),
        ({"coalesce": "earliest"}, [0]),
        ({"coalesce": "all"}, [0, 10, 20, 30, 40]),
        ({"coalesce": "all", "max_catch_up": 2}, [30, 40]),
        ({"coalesce": "all", "misfire_grace_time": 16 * 60}, [30, 40]),
        ({"coalesce": "earliest", "misfire_grace_time": 16 * 60}, [30]),
    ],
)
def test_restart_after_several_missed_follows_the_coalesce_policy(
    data_dir: Path, manual_clock: ManualClock, policy: dict[str, Any], expected: list[int]
) -> None:
    app, fire, runs = down_over_occurrences(data_dir, manual_clock, T0 + 45 * MIN, **policy)
    with app:
        assert fire == T0
        assert runs == [T0 + m * MIN for m in expected]
        assert armed(app) == [cron_key("tick", T0 + 50 * MIN)]


def test_restart_never_repeats_an_occurrence_that_ran(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    manual_clock.set(T0 - 5 * MIN)
    with (
        open_app(data_dir, manual_clock) as app,
        app.broker.consumer("w", sorted(app.topics())) as consumer,
    ):
        app.planner.arm_all()
        assert fire_next(app, consumer, manual_clock) == (T0, [T0])
    # back at the same millisecond, and with a clock a little behind
    with (
        open_app(data_dir, manual_clock) as app,
        app.broker.consumer("w", sorted(app.topics())) as consumer,
    ):
        assert manual_clock.now_ms() == T0
        assert app.planner.arm_all() == 0  # T0+10m is already armed
        assert app.planner.arm_all(now_ms=T0 - 1) == 0  # T0 already fired at that very ms
        sent = app.broker.send(app.planner.message(app.registry.crons()[0], T0))
        assert sent.status is SendStatus.DUPLICATE
        assert_nothing(consumer)
        assert armed(app) == [cron_key("tick", T0 + 10 * MIN)]


# -- two schedulers ---------------------------------------------------------------------


def test_two_schedulers_on_one_broker_arm_and_fire_once(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    manual_clock.set(T0 - 5 * MIN)
    with open_broker(f"rocksdb://{data_dir}", clock=manual_clock) as broker:
        apps = [Scheduler(broker, clock=manual_clock) for _ in range(2)]
        for app in apps:
            app.cron("*/10 * * * *", name="tick", jitter=30)(lambda: None)
        assert [app.planner.arm_all() for app in apps] == [1, 0]
        assert armed(apps[0]) == [cron_key("tick", T0)]
        with broker.consumer("w", ["chronoq.jobs"]) as consumer:
            [view] = apps[0].pending()
            manual_clock.set(view.deliver_at_ms)
            m = pull_one(consumer)
            # both see the delivery (e.g. a redelivery to the other process)
            assert [app.planner.on_fired("tick", T0, manual_clock.now_ms()) for app in apps] == [
                [T0],
                [T0],
            ]
            consumer.ack(m)
            assert armed(apps[0]) == [cron_key("tick", T0 + 10 * MIN)]
            assert [app.planner.arm_all() for app in apps] == [0, 0]
            assert_nothing(consumer)


# -- jitter -----------------------------------------------------------------------------


def test_jitter_is_deterministic_and_bounded() -> None:
    keys = [cron_key("tick", T0 + i * MIN) for i in range(200)]
    values = [jitter_ms(k, 30) for k in keys]
    assert values == [jitter_ms(k, 30.0) for k in keys]
    assert all(0 <= v <= 30_000 for v in values) and len(set(values)) > 100
    assert jitter_ms(keys[0], None) == 0 and jitter_ms(keys[0], 0) == 0


def test_jittered_occurrence_is_not_a_misfire(app: Scheduler, manual_clock: ManualClock) -> None:
    manual_clock.set(T0 - MIN)
    app.cron("*/10 * * * *", name="tick", jitter=120, misfire_grace_time=0)(lambda: None)
    app.planner.arm_all()
    [view] = app.pending()
    delay = jitter_ms(cron_key("tick", T0), 120)
    assert view.deliver_at_ms == T0 + delay
    assert app.planner.on_fired("tick", T0, T0 + delay) == [T0]
    assert app.planner.on_fired("tick", T0, T0 + 121 * S) == []  # beyond jitter + grace


def test_planner_message(app: Scheduler) -> None:
    app.cron("@daily", name="d", topic="t")(lambda: None)
    m = app.planner.message(app.registry.crons()[0], T0)
    assert m == Message("t", JobCall("d").encode(), f"cron:d:{T0}", "d", deliver_at_ms=T0)
    assert isinstance(app.planner, CronPlanner)
