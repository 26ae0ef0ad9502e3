"""Settler on a real embedded broker: each Settlement's broker effect and words; an
unknown settlement is an error that leaves the message alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from broker_adapter import Message, MessageState
from broker_adapter.base import Consumer
from broker_adapter.clock import ManualClock
from broker_adapter.errors import ChronoqError
from broker_adapter.results import ReceivedMessage
from scheduler.scheduler import Scheduler
from tests.helpers import pull_until
from workers.outcomes import Settler
from workers.settlement import Decision, Settlement, UnknownSettlement

_log = logging.getLogger("chronoq.workers.Dispatcher")


@pytest.fixture
def consumer(app: Scheduler) -> Iterator[Consumer]:
    consumer = app.broker.consumer("g", [app.settings.topic])
    yield consumer
    consumer.close()


def _pulled(app: Scheduler, consumer: Consumer) -> ReceivedMessage:
    app.broker.send(Message(app.settings.topic, b"{}"))
    (m,) = pull_until(consumer, 1)
    return m


def _state(app: Scheduler, m: ReceivedMessage) -> tuple[MessageState, int, str | None]:
    view = app.broker.query(m.msg_id)
    assert view is not None
    return view.state, view.attempts, view.error


def test_ack_and_skip_finish_the_message(app: Scheduler, consumer: Consumer) -> None:
    settler = Settler(consumer, _log)
    ok, skipped = _pulled(app, consumer), _pulled(app, consumer)
    assert settler.settle(ok, Settlement.ACK) == "ok"
    assert settler.settle(skipped, Settlement.SKIP, "runs elsewhere") == "runs elsewhere"
    assert _state(app, ok)[0] is MessageState.DONE
    assert _state(app, skipped)[0] is MessageState.DONE


def test_retry_comes_back_after_the_delay_with_the_reason(
    app: Scheduler, consumer: Consumer, manual_clock: ManualClock
) -> None:
    m = _pulled(app, consumer)
    outcome = Settler(consumer, _log).settle(m, Settlement.RETRY, "Flaky: x", 5_000)
    assert outcome == "failed (Flaky: x); retry in 5000 ms"
    view = app.broker.query(m.msg_id)
    assert view is not None and view.state is MessageState.PENDING
    assert view.deliver_at_ms == manual_clock.now_ms() + 5_000
    assert view.error == "Flaky: x"


def test_dead_letters_with_the_reason(app: Scheduler, consumer: Consumer) -> None:
    m = _pulled(app, consumer)
    assert Settler(consumer, _log).settle(m, Settlement.DEAD, "E: no") == "dead-lettered: E: no"
    assert _state(app, m) == (MessageState.DEAD, 1, "E: no")


def test_release_and_defer_give_back_without_an_attempt(
    app: Scheduler, consumer: Consumer, manual_clock: ManualClock
) -> None:
    settler = Settler(consumer, _log)
    now, later = _pulled(app, consumer), _pulled(app, consumer)
    assert settler.settle(now, Settlement.RELEASE, "released: drain") == "released: drain"
    outcome = settler.settle(later, Settlement.DEFER, "JobNotStarted: down", 2_000)
    assert outcome == "not started (JobNotStarted: down); released, retry in 2000 ms"
    view = app.broker.query(now.msg_id)
    assert view is not None and view.state in (MessageState.PENDING, MessageState.READY)
    assert (view.attempts, view.deliver_at_ms) == (0, manual_clock.now_ms())
    view = app.broker.query(later.msg_id)
    assert view is not None and (view.state, view.attempts) == (MessageState.PENDING, 0)
    assert view.deliver_at_ms == manual_clock.now_ms() + 2_000


def test_abandon_gives_back_now_counting_the_attempt(
    app: Scheduler, consumer: Consumer, manual_clock: ManualClock
) -> None:
    m = _pulled(app, consumer)
    assert Settler(consumer, _log).settle(m, Settlement.ABANDON, "stopped") == "stopped"
    view = app.broker.query(m.msg_id)
    assert view is not None and view.state in (MessageState.PENDING, MessageState.READY)
    assert (view.attempts, view.deliver_at_ms) == (1, manual_clock.now_ms())


@pytest.mark.parametrize("how", ["abandn", "ack", None])
def test_an_unknown_settlement_raises_and_leaves_the_message_in_flight(
    app: Scheduler, consumer: Consumer, how: object
) -> None:
    # A plain string, even a valid spelling, is not a Settlement: no silent fallback.
    m = _pulled(app, consumer)
    with pytest.raises(UnknownSettlement, match="unknown settlement") as err:
        Settler(consumer, _log).settle(m, how, "why")  # type: ignore[arg-type]
    assert isinstance(err.value, ChronoqError) and isinstance(err.value, ValueError)
    assert _state(app, m)[0] is MessageState.INFLIGHT


def test_a_message_no_longer_in_flight_is_said_so(app: Scheduler, consumer: Consumer) -> None:
    m = _pulled(app, consumer)
    settler = Settler(consumer, _log)
    assert settler.settle(m, Settlement.ACK) == "ok"
    assert settler.settle(m, Settlement.ACK) == (
        "ok (the message was no longer in flight here: redelivered meanwhile)"
    )


def test_a_broker_error_is_told_not_raised_and_warned_when_asked(
    app: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = app.broker.consumer("g", [app.settings.topic])
    m = _pulled(app, consumer)
    consumer.close()
    settler = Settler(consumer, _log)
    caplog.set_level(logging.WARNING, logger=_log.name)
    quiet = settler.settle(m, Settlement.RETRY, "E", 10)
    assert quiet.startswith("retry failed (") and quiet.endswith("will be redelivered")
    assert not caplog.records
    loud = settler.settle(m, Settlement.SKIP, "elsewhere", warn=True)
    assert loud.startswith("ack failed (")
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(f"msg={m.msg_id}: ack failed (")


def test_a_decision_is_typed_and_never_delayed_backwards() -> None:
    assert Decision(Settlement.RETRY, "E", 5).delay_ms == 5
    with pytest.raises(UnknownSettlement):
        Decision("retry", "E")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay_ms"):
        Decision(Settlement.RETRY, "E", -1)
