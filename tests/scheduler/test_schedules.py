"""app.schedules on memory:// and rocksdb://: round trips, what is armed, typed
errors that change nothing, cron jobs listed and paused, names that share prefixes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sched_time import ms

from broker_adapter.clock import ManualClock
from broker_adapter.results import MessageView
from scheduler import JobCall, Scheduler
from scheduler.errors import (
    DuplicateSchedule,
    InvalidCron,
    InvalidSchedule,
    JobNotFound,
    ScheduleNotFound,
    UnserializableArgument,
)
from scheduler.plan import SCHEDULE_PROPERTY
from scheduler.schedule_def import ScheduleDef
from scheduler.schedule_store import SCHEDULES_TOPIC, record_key
from scheduler.spec import cron_key

S, MIN = 1000, 60_000
T0 = ms(2024, 1, 1, 12)


@pytest.fixture(params=["memory", "rocksdb"])
def url(request: pytest.FixtureRequest, data_dir: Path) -> str:
    name = data_dir.parent.name  # one memory broker per test
    return f"memory://{name}" if request.param == "memory" else f"rocksdb://{data_dir}"


@pytest.fixture
def app(url: str, manual_clock: ManualClock) -> Iterator[Scheduler]:
    """An app with a job ``sync(tenant)`` and a cron job ``nightly``, at T0."""
    manual_clock.set(T0)
    with Scheduler(url, clock=manual_clock) as a:

        @a.job(name="sync")
        def sync(tenant: int) -> None: ...

        @a.cron("0 3 * * *", name="nightly")
        def nightly() -> None: ...

        yield a


def occurrences(app: Scheduler) -> list[MessageView]:
    """Pending occurrences (``cron:`` keys) on the app's topic, in due order."""
    return [v for v in app.broker.pending(limit=1000) if (v.key or "").startswith("cron:")]


def keys(app: Scheduler) -> list[str]:
    return [v.key or "" for v in occurrences(app)]


def test_add_get_list_update_pause_resume_remove(app: Scheduler) -> None:
    info = app.schedules.add("tenant-1", "sync", every=timedelta(minutes=1), args=(1,))
    assert (info.name, info.job, info.source, info.version, info.paused) == (
        "tenant-1",
        "sync",
        "data",
        1,
        False,
    )
    assert info.next_fire_ms == (T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN)
    assert info.next_fire_times[0] == datetime(2024, 1, 1, 12, 1, tzinfo=UTC)
    [occ] = occurrences(app)
    assert (occ.key, occ.deliver_at_ms, occ.tags) == (
        cron_key("tenant-1", T0 + MIN),
        T0 + MIN,
        "sync",
    )
    assert app.schedules.get("tenant-1") == info

    listed = app.schedules.list()
    assert [(s.name, s.source, s.version) for s in listed] == [
        ("nightly", "decorator", 0),
        ("tenant-1", "data", 1),
    ]

    changed = app.schedules.update("tenant-1", every=timedelta(minutes=5), args=(2,))
    assert (changed.version, changed.definition.every_ms, changed.definition.args) == (
        2,
        5 * MIN,
        (2,),
    )
    assert keys(app) == [cron_key("tenant-1", T0 + 5 * MIN)]  # the old one aborted
    assert app.schedules.get("tenant-1").definition == changed.definition

    paused = app.schedules.pause("tenant-1")
    assert (paused.paused, paused.version, paused.next_fire_ms) == (True, 3, ())
    assert keys(app) == []
    assert app.schedules.pause("tenant-1").version == 3  # pausing again changes nothing
    app.planner.arm_all()  # nothing armed for a paused schedule (the cron job is)
    assert keys(app) == [cron_key("nightly", ms(2024, 1, 2, 3))]

    app.clock.advance(30 * MIN)  # type: ignore[attr-defined]
    resumed = app.schedules.resume("tenant-1")
    assert (resumed.paused, resumed.version) == (False, 4)
    assert keys(app)[0] == cron_key("tenant-1", T0 + 35 * MIN)  # from now; no catch-up

    removed = app.schedules.remove("tenant-1")
    assert removed.name == "tenant-1"
    assert keys(app) == [cron_key("nightly", ms(2024, 1, 2, 3))]
    with pytest.raises(ScheduleNotFound, match="tenant-1"):
        app.schedules.get("tenant-1")
    assert [s.name for s in app.schedules.list()] == ["nightly"]


def test_a_stored_schedule_is_a_record_message(app: Scheduler) -> None:
    app.schedules.add("r", "sync", cron="*/15 * * * *", tz="Asia/Shanghai", kwargs={"tenant": 7})
    page = app.broker.find_pending(SCHEDULES_TOPIC, key_prefix="schedule:", with_body=True)
    [view] = page.messages
    assert view.key == record_key("r") == "schedule:r:"
    assert view.body is not None and view.deliver_at_ms > T0 + 300 * 24 * 3600 * S
    d = ScheduleDef.from_json(view.body)
    assert (d.cron, d.tz, d.kwargs, d.topic, d.version) == (
        "*/15 * * * *",
        "Asia/Shanghai",
        {"tenant": 7},
        "chronoq.jobs",
        1,
    )
    [occ] = occurrences(app)
    assert occ.key == cron_key("r", T0 + 15 * MIN)
    body = app.broker.find_pending(app.settings.topic, key_prefix="cron:r:", with_body=True)
    assert body.messages[0].body == JobCall("sync", (), {"tenant": 7}).encode()


def test_occurrences_carry_the_schedule_property(app: Scheduler) -> None:
    app.schedules.add("p", "sync", every=60, args=(3,))
    consumer = app.broker.consumer("w", [app.settings.topic])
    app.clock.advance(MIN)  # type: ignore[attr-defined]
    with consumer:
        [m] = consumer.pull(10, 2000)
        assert m.properties[SCHEDULE_PROPERTY] == "1" and m.tags == "sync"
        consumer.ack(m)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"every": 60, "cron": "* * * * *"}, InvalidSchedule, "exactly one"),
        ({}, InvalidSchedule, "exactly one"),
        ({"every": 0.5}, InvalidSchedule, "at least 1 s"),
        ({"cron": "61 * * * *"}, InvalidCron, "does not parse"),
        ({"cron": "0 5 * * *", "tz": "Mars/Base"}, InvalidCron, "time zone"),
        ({"cron": "0 5 * * *", "anchor": 0}, InvalidSchedule, "anchor= goes with every="),
        ({"every": 60, "start": datetime(2024, 1, 1)}, InvalidSchedule, "naive"),
        ({"every": 60, "start": T0, "end": T0 - 1}, InvalidSchedule, "end is before start"),
        ({"every": 60, "coalesce": "sometimes"}, InvalidSchedule, "coalesce"),
        ({"every": 60, "max_running": 0}, InvalidSchedule, "max_running"),
        ({"every": 60, "misfire_grace_time": -1}, InvalidSchedule, "misfire_grace_time"),
        ({"every": 60, "args": ({1, 2},)}, UnserializableArgument, "sorted list"),
        ({"every": 60, "job": "nope"}, JobNotFound, "nope"),
    ],
)
def test_bad_add_raises_and_stores_nothing(
    app: Scheduler, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    options = dict(options)
    job = options.pop("job", "sync")
    with pytest.raises(error, match=match):
        app.schedules.add("bad", job, **options)
    assert [s.name for s in app.schedules.list()] == ["nightly"]
    assert keys(app) == []


def test_names_are_unique_and_lookups_typed(app: Scheduler) -> None:
    app.schedules.add("t", "sync", every=60, args=(1,))
    with pytest.raises(DuplicateSchedule, match="stored schedule"):
        app.schedules.add("t", "sync", every=120, args=(9,))
    with pytest.raises(DuplicateSchedule, match="cron job"):
        app.schedules.add("nightly", "sync", every=60, args=(1,))
    assert app.schedules.get("t").definition.args == (1,)
    assert keys(app) == [cron_key("t", T0 + MIN)]
    with pytest.raises(InvalidSchedule, match="schedule name"):
        app.schedules.add("has space", "sync", every=60)
    for call in (
        app.schedules.get,
        app.schedules.pause,
        app.schedules.resume,
        app.schedules.remove,
        app.schedules.run_now,
    ):
        with pytest.raises(ScheduleNotFound, match="no schedule named 'tt'"):
            call("tt") if call is not app.schedules.get else app.schedules.get("tt")
    with pytest.raises(ScheduleNotFound):
        app.schedules.update("tt", args=(2,))


def test_bad_update_changes_nothing(app: Scheduler) -> None:
    before = app.schedules.add("u", "sync", every=60, args=(1,))
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"colour": "red"}, InvalidSchedule, "unknown option"),
        ({"paused": True}, InvalidSchedule, "unknown option"),
        ({"every": 0}, InvalidSchedule, "at least 1 s"),
        ({"cron": "nope"}, InvalidCron, "fields"),
        ({"args": (object(),)}, UnserializableArgument, "JSON"),
        ({"job": "nope"}, JobNotFound, "nope"),
    ]
    for changes, error, match in cases:
        with pytest.raises(error, match=match):
            app.schedules.update("u", **changes)
    assert app.schedules.get("u") == before
    assert keys(app) == [cron_key("u", T0 + MIN)]
    with pytest.raises(InvalidSchedule, match="change it in the code"):
        app.schedules.pause("nightly")  # creates its record
        app.schedules.update("nightly", cron="0 4 * * *")
    with pytest.raises(InvalidSchedule, match="remove it from the code"):
        app.schedules.remove("nightly")


def test_update_switches_between_cron_and_interval(app: Scheduler) -> None:
    app.schedules.add("s", "sync", every=90, args=(1,), anchor=T0 + 10 * S)
    assert app.schedules.get("s").next_fire_ms[0] == T0 + 10 * S
    c = app.schedules.update("s", cron="30 12 * * *")
    assert (c.definition.cron, c.definition.every_ms, c.definition.anchor_ms) == (
        "30 12 * * *",
        None,
        0,
    )
    assert keys(app) == [cron_key("s", T0 + 30 * MIN)]
    e = app.schedules.update("s", every=timedelta(hours=1))
    assert (e.definition.cron, e.next_fire_ms[0]) == (None, T0 + 60 * MIN)
    assert keys(app) == [cron_key("s", T0 + 60 * MIN)]


def test_window_start_and_end(app: Scheduler) -> None:
    info = app.schedules.add(
        "w", "sync", every=60, args=(1,), start=T0 + 10 * MIN, end=T0 + 11 * MIN
    )
    assert info.next_fire_ms == (T0 + 10 * MIN, T0 + 11 * MIN)
    assert keys(app) == [cron_key("w", T0 + 10 * MIN)]
    ended = app.schedules.update("w", end=T0 - MIN, start=None)
    assert ended.next_fire_ms == () and keys(app) == []


def test_cron_jobs_are_listed_and_pausable(app: Scheduler) -> None:
    assert app.planner.arm_all() == 1
    nightly_at = ms(2024, 1, 2, 3)
    assert keys(app) == [cron_key("nightly", nightly_at)]
    [info] = app.schedules.list()
    assert (info.name, info.source, info.paused, info.next_fire_ms[0]) == (
        "nightly",
        "decorator",
        False,
        nightly_at,
    )
    assert info.definition.cron == "0 3 * * *"
    paused = app.schedules.pause("nightly")
    assert (paused.paused, paused.version) == (True, 1)
    assert keys(app) == []
    assert app.planner.arm_all() == 0  # the stored state wins over the code
    assert app.planner.on_fired("nightly", nightly_at, nightly_at) == []  # a straggler
    assert keys(app) == []
    resumed = app.schedules.resume("nightly")
    assert (resumed.paused, resumed.version) == (False, 2)
    assert keys(app) == [cron_key("nightly", nightly_at)]


def test_names_sharing_prefixes_do_not_interfere(app: Scheduler) -> None:
    names = ["tenant-1", "tenant-10", "tenant-1:x", "a%3A", "a:"]
    for i, name in enumerate(names):
        app.schedules.add(name, "sync", every=60 * (i + 1), args=(i,))
    assert len({record_key(n) for n in names}) == len(names)
    assert [app.schedules.get(n).definition.args for n in names] == [(i,) for i in range(5)]
    app.schedules.pause("tenant-1")
    assert sorted(keys(app)) == sorted(
        cron_key(n, app.schedules.get(n).next_fire_ms[0]) for n in names if n != "tenant-1"
    )
    app.schedules.remove("a:")
    assert [s.name for s in app.schedules.list()] == sorted(["nightly", *names[:-1]])


def test_run_now_sends_one_plain_run(app: Scheduler) -> None:
    app.schedules.add("r", "sync", every=3600, args=(5,))
    sent = app.schedules.run_now("r")
    view = app.broker.query(sent.msg_id)
    assert view is not None and view.key is None and view.tags == "sync"
    assert sent.deliver_at_ms <= T0
    assert keys(app) == [cron_key("r", T0 + 60 * MIN)]  # the regular one stays
    app.schedules.run_now("nightly")  # a cron job's extra run too


def test_publish_decorators_stores_and_refreshes_cron_records(app: Scheduler) -> None:
    assert app.schedules.publish_decorators() == 1
    assert app.schedules.publish_decorators() == 0
    bare = Scheduler(app.broker, clock=app.clock)  # no jobs: what the CLI sees
    [info] = bare.schedules.list()
    assert (info.name, info.source, info.definition.cron, info.paused) == (
        "nightly",
        "decorator",
        "0 3 * * *",
        False,
    )
    bare.schedules.pause("nightly")  # from the broker alone
    assert app.schedules.get("nightly").paused
    assert app.schedules.publish_decorators() == 0  # keeps the paused state


def test_record_check_sees_changes_from_another_scheduler(app: Scheduler) -> None:
    """``store.current`` (what dispatchers use per occurrence) notices another
    process's change with one point lookup, and re-reads only then."""
    other = Scheduler(app.broker, clock=app.clock)
    other.job(name="sync")(lambda tenant: None)
    app.schedules.add("c", "sync", every=60, args=(1,))
    assert other.planner.store.current("c") == app.schedules.get("c").definition
    app.schedules.update("c", args=(2,))
    d = other.planner.store.current("c")
    assert d is not None and d.args == (2,)
    app.schedules.remove("c")
    assert other.planner.store.current("c") is None


def test_records_are_kept_from_falling_due(app: Scheduler, manual_clock: ManualClock) -> None:
    app.schedules.add("k", "sync", every=86400, args=(1,))
    [before] = app.planner.store.read_all()
    manual_clock.advance(200 * 24 * 3600 * S)  # past half the one-year horizon
    app.planner.arm_all()
    [after] = app.planner.store.read_all()
    assert after.due_ms > before.due_ms + 150 * 24 * 3600 * S
    assert after.msg_id == before.msg_id and after.definition == before.definition


def test_schedules_persist_across_reopen(data_dir: Path, manual_clock: ManualClock) -> None:
    manual_clock.set(T0)
    url = f"rocksdb://{data_dir}"
    with Scheduler(url, clock=manual_clock) as first:
        first.job(name="sync")(lambda tenant: None)
        first.cron("0 3 * * *", name="nightly")(lambda: None)
        first.schedules.add("a", "sync", every=60, args=(1,))
        first.schedules.add("b", "sync", cron="*/5 * * * *", args=(2,), paused=True)
        first.schedules.pause("nightly")
        listed = first.schedules.list()
    manual_clock.advance(10 * MIN)
    with Scheduler(url, clock=manual_clock) as again:
        again.job(name="sync")(lambda tenant: None)
        again.cron("0 3 * * *", name="nightly")(lambda: None)
        assert [(s.name, s.paused, s.version) for s in again.schedules.list()] == [
            (s.name, s.paused, s.version) for s in listed
        ]
        assert again.schedules.get("a").definition == listed[0].definition
        again.planner.arm_all()  # a restart: the paused cron job stays paused
        assert [k for k in keys(again) if "nightly" in k or ":b:" in k] == []
        assert cron_key("a", T0 + 11 * MIN) in keys(again)
