"""Steps of the wall clock (an NTP step, a resumed VM) on each adapter's firing loop
(issue 18 §4), and on cron occurrences through the scheduler.

Due times are wall-clock epoch ms; waits are not: the firing loops wait in slices
and read the clock after each. The steps here are made with ``ManualClock.jump``;
most with ``notify=False``, as the system clock makes them (nobody is told), so only
a loop that reads the clock by itself sees them. ``chronoq://`` rides on the
embedded broker's loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import ManualClock
from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.memory.broker import MemoryBroker
from broker_adapter.message import Message
from broker_adapter.results import ReceivedMessage
from scheduler.scheduler import Scheduler
from tests.conftest import START_MS
from tests.helpers import assert_nothing, eventually, pull_one
from workers import Dispatcher, current_job

pytestmark = pytest.mark.timeout(120)

MINUTE = 60_000
HOUR = 60 * MINUTE


@pytest.fixture(params=["embedded", "memory", "redis"])
def clocked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[BrokerAdapter, ManualClock]]:
    """A broker of each kind on its own manual clock."""
    clock = ManualClock(START_MS)
    broker: BrokerAdapter
    if request.param == "embedded":
        broker = EmbeddedBroker(tmp_path / "db", clock=clock)
    elif request.param == "memory":
        broker = MemoryBroker(clock=clock)
    else:
        from broker_adapter.redis import RedisBroker

        broker = RedisBroker.from_url(request.getfixturevalue("redis_url"), clock=clock)
    try:
        yield broker, clock
    finally:
        broker.close()


def waiting_pull(broker: BrokerAdapter, topic: str, wait_ms: int) -> list[ReceivedMessage]:
    """Start one long pull on a thread; the list it fills when it returns."""
    consumer = broker.consumer("g", [topic])
    got: list[ReceivedMessage] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        got.extend(consumer.pull(max_messages=1, wait_ms=wait_ms))

    threading.Thread(target=run, daemon=True).start()
    started.wait(5)
    return got


def test_a_pending_message_is_not_fired_early_by_a_backward_step(
    clocked: tuple[BrokerAdapter, ManualClock],
) -> None:
    broker, clock = clocked
    consumer = broker.consumer("g", ["t"])
    due = broker.send(Message("t", b"x", delay_ms=10_000)).deliver_at_ms
    # When: the clock steps back a minute, then runs on for the message's delay
    clock.jump(-MINUTE, notify=False)
    clock.jump(10_000, notify=False)
    # Then: it is not due (its due time is wall-clock) ...
    assert_nothing(consumer)
    # ... until the clock reads its due time again
    clock.jump(due - clock.now_ms(), notify=False)
    assert pull_one(consumer).deliver_at_ms == due


def test_a_delay_after_a_backward_step_counts_from_the_clock(
    clocked: tuple[BrokerAdapter, ManualClock],
) -> None:
    broker, clock = clocked
    consumer = broker.consumer("g", ["t"])
    clock.jump(-10_000, notify=False)
    # When: a message is sent with a delay longer than the step
    result = broker.send(Message("t", b"x", delay_ms=30_000))
    # Then: it is due 30 s after the clock's reading, not after the time before the step
    assert result.deliver_at_ms == clock.now_ms() + 30_000
    clock.jump(29_000, notify=False)
    assert_nothing(consumer)
    clock.jump(1_000, notify=False)
    assert pull_one(consumer).msg_id == result.msg_id


def test_a_delay_shorter_than_a_backward_step_is_due_at_most_the_step_early(
    clocked: tuple[BrokerAdapter, ManualClock],
) -> None:
    broker, clock = clocked
    consumer = broker.consumer("g", ["t"])
    # The broker reads the clock before the step: a send does (an empty pull need
    # not: it skips its take when nothing new fired).
    broker.send(Message("before", b"x"))
    clock.jump(-MINUTE, notify=False)
    if not isinstance(broker, (EmbeddedBroker, MemoryBroker)):
        # A Redis firing pass that read the clock just before the step fires with that
        # reading (a busy CI machine once stalled one past the send): let it end first.
        assert_nothing(consumer)
    result = broker.send(Message("t", b"x", delay_ms=5_000))
    wall = clock.now_ms()
    if isinstance(broker, (EmbeddedBroker, MemoryBroker)):
        # the fire position cannot go back: due at the broker's time, at once (5 s
        # early by the clock, less than the step)
        assert result.deliver_at_ms == START_MS
        assert pull_one(consumer).msg_id == result.msg_id
    else:  # Redis compares due times with the clock as it reads now
        assert result.deliver_at_ms == wall + 5_000
        assert_nothing(consumer)
        clock.jump(5_000, notify=False)
        assert pull_one(consumer).msg_id == result.msg_id


def test_a_forward_step_mid_wait_fires_what_is_due_at_once(
    clocked: tuple[BrokerAdapter, ManualClock],
) -> None:
    broker, clock = clocked
    broker.send(Message("t", b"x", delay_ms=MINUTE))
    # Given: a pull waiting 20 s for a message due in a minute
    got = waiting_pull(broker, "t", wait_ms=20_000)
    # When: the clock steps two minutes ahead and tells nobody
    clock.jump(2 * MINUTE, notify=False)
    # Then: the waiting loops see it within a slice: the pull returns the message
    # long before its own wait ends
    eventually(lambda: got, timeout=10, what="the message fired after the step")


def test_a_backward_then_forward_step_mid_wait_leaves_nothing_asleep(
    clocked: tuple[BrokerAdapter, ManualClock],
) -> None:
    broker, clock = clocked
    broker.send(Message("t", b"x", delay_ms=1_000))
    got = waiting_pull(broker, "t", wait_ms=20_000)
    # When: the clock steps an hour back, and (a moment later) an hour and a second ahead
    clock.jump(-HOUR, notify=False)
    assert_nothing(broker.consumer("other", ["t"]), wait_ms=300)
    clock.jump(HOUR + 1_000, notify=False)
    # Then: no loop slept for the hour: the message fires now
    eventually(lambda: got, timeout=10, what="the message fired after the steps")


def test_an_announced_backward_step_wakes_nothing_early(
    clocked: tuple[BrokerAdapter, ManualClock],
) -> None:
    broker, clock = clocked
    consumer = broker.consumer("g", ["t"])
    broker.send(Message("t", b"x", delay_ms=2_000))
    clock.jump(-HOUR)  # listeners are told; the wheels look again and find nothing due
    assert_nothing(consumer)
    clock.jump(HOUR + 2_000)
    pull_one(consumer)


# -- cron occurrences across steps (the scheduler on an embedded broker) -----------------------


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Scheduler, ManualClock]]:
    clock = ManualClock(START_MS)
    scheduler = Scheduler(f"rocksdb://{tmp_path / 'db'}", clock=clock, max_workers=2)
    try:
        yield scheduler, clock
    finally:
        scheduler.close()


def test_a_cron_job_around_a_backward_step_runs_each_occurrence_once(
    app: tuple[Scheduler, ManualClock],
) -> None:
    scheduler, clock = app
    runs: list[int | None] = []

    @scheduler.cron("*/10 * * * * *")  # every 10 s
    def tick() -> None:
        runs.append(current_job().fire_ms)

    scheduler.planner.arm_all()
    first = scheduler.pending()[0].deliver_at_ms
    with Dispatcher(scheduler) as dispatcher:
        clock.set(first)
        dispatcher.run_until_idle()
        clock.jump(10_000)
        dispatcher.run_until_idle()
        # When: the clock steps back 35 s (past three occurrences that already ran),
        # and the planner arms again as `chronoq run` does every arm interval
        clock.jump(-35_000)
        scheduler.planner.arm_all()
        dispatcher.run_until_idle()
        # Then: nothing runs again; the clock runs on, each occurrence runs once
        for _ in range(9):
            clock.jump(5_000)
            scheduler.planner.arm_all()
            dispatcher.run_until_idle()
    assert runs == [first, first + 10_000, first + 20_000], runs


def test_a_forward_step_beyond_the_grace_applies_the_misfire_policy_once(
    app: tuple[Scheduler, ManualClock],
) -> None:
    scheduler, clock = app
    runs: list[int | None] = []

    @scheduler.cron("*/10 * * * * *", misfire_grace_time=30, coalesce="latest")
    def tick() -> None:
        runs.append(current_job().fire_ms)

    scheduler.planner.arm_all()
    first = scheduler.pending()[0].deliver_at_ms
    with Dispatcher(scheduler) as dispatcher:
        clock.set(first)
        dispatcher.run_until_idle()
        # When: the clock steps 5 minutes ahead (a resumed VM), silently
        clock.jump(5 * MINUTE + 5_000, notify=False)
        dispatcher.run_until_idle(timeout_s=2)
        scheduler.planner.arm_all()
        dispatcher.run_until_idle()
        clock.jump(5_000)
        dispatcher.run_until_idle()
    # Then: the occurrences missed beyond the grace are skipped, those within it
    # coalesce into the latest, and each later occurrence runs once
    late = first + 5 * MINUTE
    assert runs == [first, late, late + 10_000], runs


def test_an_interval_job_around_steps_both_ways_runs_each_occurrence_once(
    app: tuple[Scheduler, ManualClock],
) -> None:
    scheduler, clock = app
    runs: list[int | None] = []

    @scheduler.every(15)  # every 15 s, anchored at the epoch
    def beat() -> None:
        runs.append(current_job().fire_ms)

    scheduler.planner.arm_all()
    first = scheduler.pending()[0].deliver_at_ms
    with Dispatcher(scheduler) as dispatcher:
        clock.set(first)
        dispatcher.run_until_idle()
        clock.jump(15_000)
        dispatcher.run_until_idle()
        # When: the clock steps back 40 s, the planner arms again, time runs on ...
        clock.jump(-40_000, notify=False)
        for _ in range(7):  # to 5 s past the third occurrence
            scheduler.planner.arm_all()
            dispatcher.run_until_idle(timeout_s=0.5)
            clock.jump(10_000, notify=False)
        # ... then a 10 minute step forward, within no grace limit (coalesce latest)
        clock.jump(10 * MINUTE, notify=False)
        dispatcher.run_until_idle(timeout_s=1)
        latest = clock.now_ms() // 15_000 * 15_000
    # Then: each occurrence ran once, the ones the backward step repeated did not run
    # again, and the ten missed minutes ran once, as their latest occurrence
    assert runs == [first, first + 15_000, first + 30_000, latest], runs
