"""InvisibilityKeeper as a dispatch hook, on a real embedded consumer.

The broker counts invisible time on the ManualClock; the keeper decides when to
extend on real (monotonic) time, so a short invisible time lets it act at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from broker_adapter import Message
from broker_adapter.base import Consumer
from broker_adapter.clock import ManualClock
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from tests.helpers import pull_until
from workers.context import JobContext
from workers.invisibility import InvisibilityKeeper
from workers.runs import Run
from workers.settlement import Settlement

INVISIBLE_MS = 100
_log = logging.getLogger("chronoq.workers.Dispatcher")


@pytest.fixture
def consumer(app: Scheduler) -> Iterator[Consumer]:
    consumer = app.broker.consumer("g", [app.settings.topic], invisible_ms=INVISIBLE_MS)
    yield consumer
    consumer.close()


def _run(app: Scheduler, consumer: Consumer) -> Run:
    @app.job(name="held")
    def held() -> None: ...

    app.broker.send(Message(app.settings.topic, JobCall("held").encode()))
    (m,) = pull_until(consumer, 1)
    spec = app.registry.find("held")
    assert spec is not None
    call = JobCall("held")
    return Run(m, spec, call, JobContext(spec, call, m, None, lambda: 0.0))


def _tick_when_due(keeper: InvisibilityKeeper) -> None:
    time.sleep(INVISIBLE_MS / 2 / 1000)  # the keeper extends once half the time passed
    keeper.tick()


def test_a_kept_message_outlives_its_invisible_time(
    app: Scheduler, consumer: Consumer, manual_clock: ManualClock
) -> None:
    run = _run(app, consumer)
    keeper = InvisibilityKeeper(consumer, INVISIBLE_MS, _log)
    keeper.before_start(run, run.job)
    manual_clock.advance(90)
    _tick_when_due(keeper)  # extended: invisible until 90 + 100
    manual_clock.advance(60)  # past the first invisible time
    assert consumer.pull(1, 50) == []
    manual_clock.advance(60)  # past the extended one too
    (again,) = pull_until(consumer, 1)
    assert (again.msg_id, again.attempts) == (run.message.msg_id, 2)


def test_a_settled_message_is_no_longer_extended(
    app: Scheduler, consumer: Consumer, manual_clock: ManualClock
) -> None:
    run = _run(app, consumer)
    keeper = InvisibilityKeeper(consumer, INVISIBLE_MS, _log)
    keeper.before_start(run, run.job)
    run.settled = True
    keeper.before_settle(run.message, "held", run, Settlement.ABANDON, "stop")
    keeper.before_settle(run.message, None, None, Settlement.DEAD, "no run: nothing kept")
    assert len(keeper) == 0 and keeper.tick() is None
    manual_clock.advance(90)
    _tick_when_due(keeper)
    manual_clock.advance(60)  # not extended: it comes back after its invisible time
    (again,) = pull_until(consumer, 1)
    assert again.msg_id == run.message.msg_id


def test_a_handoff_is_kept_unless_settled_meanwhile(app: Scheduler, consumer: Consumer) -> None:
    run = _run(app, consumer)
    keeper = InvisibilityKeeper(consumer, INVISIBLE_MS, _log)
    keeper.after_handoff(run)
    assert len(keeper) == 1
    keeper.drop(run)
    run.settled = True  # e.g. a timeout settled it before the handoff was seen
    keeper.after_handoff(run)
    assert len(keeper) == 0


def test_tick_asks_for_the_next_look_within_a_quarter_invisible_time(
    app: Scheduler, consumer: Consumer
) -> None:
    keeper = InvisibilityKeeper(consumer, INVISIBLE_MS, _log)
    assert keeper.tick() is None  # keeps nothing: no wish
    run = _run(app, consumer)
    keeper.keep(run)
    wish = keeper.tick()
    assert wish is not None and 1 <= wish <= INVISIBLE_MS // 4
