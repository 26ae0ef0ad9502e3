"""Stored schedules under a real dispatcher (ChronoqKit: memory:// and a ManualClock):
a change takes effect at the next occurrence, a paused or removed schedule fires
nothing, stragglers armed by an old version are recognised, two dispatchers fire
each occurrence once; and a paused cron job stays paused across a restart of
``run_app`` on rocksdb://."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.memory import MemoryBroker
from scheduler import Scheduler
from scheduler.spec import cron_key
from workers.context import current_job
from workers.runner import run_app
from workers.testing import ChronoqKit

S, MIN = 1000, 60_000
T0 = 1_704_110_400_000  # 2024-01-01T12:00:00Z, a multiple of 2, 5 and 10 minutes


class Tenants:
    """An app with a job ``sync(tenant)`` that records (tenant, occurrence time)."""

    def __init__(self, name: str = "tenants") -> None:
        self.app = Scheduler(f"memory://{name}-unused")
        self.runs: list[tuple[int, int]] = []
        self.gate: threading.Event | None = None

        @self.app.job(name="sync")
        def sync(tenant: int) -> None:
            self.runs.append((tenant, current_job().due_ms))
            if self.gate is not None:
                assert self.gate.wait(10)


@pytest.fixture
def tenants() -> Iterator[Tenants]:
    t = Tenants()
    yield t
    t.app.close()


@pytest.fixture
def kit(tenants: Tenants) -> Iterator[ChronoqKit]:
    with ChronoqKit(tenants.app, clock=ManualClock(T0)) as k:
        yield k


def test_an_update_takes_effect_at_the_next_occurrence(tenants: Tenants, kit: ChronoqKit) -> None:
    schedules = tenants.app.schedules
    schedules.add("t1", "sync", every=timedelta(minutes=1), args=(1,))
    kit.advance(minutes=2)
    assert tenants.runs == [(1, T0 + MIN), (1, T0 + 2 * MIN)]
    schedules.update("t1", every=timedelta(minutes=2), args=(2,))
    kit.advance(minutes=4)
    assert tenants.runs[2:] == [(2, T0 + 4 * MIN), (2, T0 + 6 * MIN)]
    schedules.update("t1", cron="*/5 * * * *")
    kit.advance(minutes=9)
    assert tenants.runs[4:] == [(2, T0 + 10 * MIN), (2, T0 + 15 * MIN)]
    assert kit.dead_letters() == []


def test_a_paused_schedule_fires_nothing(tenants: Tenants, kit: ChronoqKit) -> None:
    schedules = tenants.app.schedules
    schedules.add("t1", "sync", every=60, args=(1,))
    schedules.add("t2", "sync", every=60, args=(2,))
    kit.advance(minutes=1)
    schedules.pause("t1")
    kit.advance(minutes=10)
    assert [r for r in tenants.runs if r[0] == 1] == [(1, T0 + MIN)]
    assert len([r for r in tenants.runs if r[0] == 2]) == 11
    schedules.resume("t1")  # at 12:11: from now, the paused span is not caught up
    kit.advance(minutes=1)
    assert [r for r in tenants.runs if r[0] == 1] == [(1, T0 + MIN), (1, T0 + 12 * MIN)]


def test_an_update_while_an_occurrence_runs(tenants: Tenants, kit: ChronoqKit) -> None:
    """The running occurrence finishes as it was; the next one has the change."""
    schedules = tenants.app.schedules
    schedules.add("t1", "sync", every=60, args=(1,))
    tenants.gate = threading.Event()
    advancing = threading.Thread(target=kit.advance, args=(60,))
    advancing.start()
    try:
        for _ in range(500):
            if tenants.runs:
                break
            threading.Event().wait(0.01)
        assert tenants.runs == [(1, T0 + MIN)]  # running now, its next one already armed
        schedules.update("t1", args=(2,))
    finally:
        tenants.gate.set()
        advancing.join(10)
    tenants.gate = None
    kit.advance(minutes=2)
    assert tenants.runs == [(1, T0 + MIN), (2, T0 + 2 * MIN), (2, T0 + 3 * MIN)]


def test_stragglers_armed_by_an_old_version(tenants: Tenants, kit: ChronoqKit) -> None:
    """What a dispatcher still arming from an old version (the race with update,
    pause and remove) leaves behind: run only as the current definition says."""
    app = tenants.app
    app.schedules.add("t1", "sync", every=60, args=(1,))
    old = app.planner.plan_of_def(app.schedules.get("t1").definition)
    app.schedules.update("t1", every=120, args=(2,))
    # armed late from version 1: 12:03 is no occurrence of version 2; 12:04 is one
    for t in (T0 + 3 * MIN, T0 + 4 * MIN):
        kit.broker.send(old.message(t))
    kit.advance(minutes=4)
    assert tenants.runs == [(2, T0 + 2 * MIN), (2, T0 + 4 * MIN)]  # 12:04 with the new args

    app.schedules.pause("t1")
    kit.broker.send(old.message(T0 + 6 * MIN))
    kit.advance(minutes=2)
    assert len(tenants.runs) == 2

    app.schedules.remove("t1")
    kit.broker.send(old.message(T0 + 7 * MIN))
    kit.advance(minutes=2)
    assert len(tenants.runs) == 2
    assert kit.dead_letters() == [] and kit.pending() == []


def test_interval_job_runs_at_anchored_times(tenants: Tenants, kit: ChronoqKit) -> None:
    beats: list[int] = []

    @tenants.app.every(timedelta(minutes=7), name="beat")
    def beat() -> None:
        beats.append(current_job().due_ms)

    kit.advance(minutes=30)
    assert beats == [T0 + m * MIN for m in (2, 9, 16, 23, 30)]  # multiples of 7 min
    tenants.app.schedules.pause("beat")
    kit.advance(minutes=30)
    assert len(beats) == 5
    tenants.app.schedules.resume("beat")
    kit.advance(minutes=7)
    assert beats[5:] == [T0 + 65 * MIN]


def test_two_dispatchers_fire_each_occurrence_once() -> None:
    clock = ManualClock(T0)
    broker = MemoryBroker(clock=clock)
    one, two = Tenants("one"), Tenants("two")
    with ChronoqKit(one.app, broker=broker) as k1, ChronoqKit(two.app, broker=broker) as k2:
        for i in range(20):
            one.app.schedules.add(f"t{i}", "sync", every=60, args=(i,), jitter=10)
        k1.run_until_idle()
        k2.run_until_idle()  # both armed everything: idempotent
        for minute in range(1, 6):
            clock.set(T0 + minute * MIN + 10 * S)
            runners = [threading.Thread(target=k.run_until_idle) for k in (k1, k2)]
            for r in runners:
                r.start()
            for r in runners:
                r.join(30)
        fired = sorted(one.runs + two.runs)
        assert fired == sorted((i, T0 + m * MIN) for i in range(20) for m in range(1, 6))
    broker.close()


def test_a_stored_schedule_of_a_job_this_dispatcher_lacks(tenants: Tenants) -> None:
    clock = ManualClock(T0)
    broker = MemoryBroker(clock=clock)
    other = Scheduler("memory://lacks-unused")
    with ChronoqKit(tenants.app, broker=broker) as k, ChronoqKit(other, broker=broker) as bare:
        tenants.app.schedules.add("t1", "sync", every=60, args=(1,))
        bare.advance(minutes=1)  # only the dispatcher without the job runs
        assert [v.key for v in bare.dead_letters()] == [cron_key("t1", T0 + MIN)]
        assert [v.key for v in bare.pending() if v.key and v.key.startswith("cron:")] == [
            cron_key("t1", T0 + 2 * MIN)
        ]
        k.advance(minutes=1)
        assert tenants.runs == [(1, T0 + 2 * MIN)]
    other.close()
    broker.close()


def test_a_paused_cron_job_stays_paused_across_restarts(data_dir: Path) -> None:
    clock = ManualClock(T0)
    url = f"rocksdb://{data_dir}"

    def make() -> Scheduler:
        app = Scheduler(url, clock=clock)
        app.cron("*/10 * * * *", name="tick")(lambda: None)
        app.every(timedelta(minutes=3), name="beat")(lambda: None)
        return app

    with make() as first:
        run_app(first, exit_when_idle=True, drain_timeout_s=1)
        assert {v.key for v in first.broker.pending(topic="chronoq.jobs")} == {
            cron_key("tick", T0 + 10 * MIN),
            cron_key("beat", T0 + 3 * MIN),
        }
        first.schedules.pause("tick")
    with make() as again:
        run_app(again, exit_when_idle=True, drain_timeout_s=1)
        assert [v.key for v in again.broker.pending(topic="chronoq.jobs")] == [
            cron_key("beat", T0 + 3 * MIN)
        ]
        bare = Scheduler(again.broker, clock=clock)  # the broker alone lists both
        assert [(s.name, s.paused) for s in bare.schedules.list()] == [
            ("beat", False),
            ("tick", True),
        ]
        again.schedules.resume("tick")
        assert cron_key("tick", T0 + 10 * MIN) in {
            v.key for v in again.broker.pending(topic="chronoq.jobs")
        }


def test_list_shows_the_last_run_recorded_by_run_app(data_dir: Path) -> None:
    clock = ManualClock(T0)
    with Scheduler(f"rocksdb://{data_dir}", clock=clock) as app:

        @app.job(name="sync")
        def sync(tenant: int) -> None:
            if tenant == 2:
                raise ValueError("tenant 2 is broken")

        @app.every(60, name="beat")
        def beat() -> None: ...

        app.schedules.add("t1", "sync", every=60, args=(1,))
        app.schedules.add("t2", "sync", every=60, args=(2,))
        assert all(s.last_run is None for s in app.schedules.list())
        app.planner.arm_all()
        clock.set(T0 + MIN + 5 * S)  # the first occurrences are due: run them, then stop
        run_app(app, exit_when_idle=True, drain_timeout_s=1)
        last = {s.name: s.last_run for s in app.schedules.list()}
        assert {n: (r.fire_ms, r.outcome) for n, r in last.items() if r is not None} == {
            "beat": (T0 + MIN, "ok"),
            "t1": (T0 + MIN, "ok"),
            "t2": (T0 + MIN, "failed: ValueError"),
        }
        run = last["t1"]
        assert run is not None and run.ended_ms >= run.started_ms >= T0 + MIN
        assert app.schedules.get("t2").to_dict()["last_run"]["outcome"] == "failed: ValueError"
