"""JobHandle.schedule / schedule_many / cancel / get and Scheduler.pending, on the
real embedded broker driven by a ManualClock.

Outcomes of the cancel race are produced for real: ``ALREADY_DELIVERED`` after a
consumer pulled the fired message, ``ABORTED`` before the fire time, ``NOT_FOUND``
for keys never used.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter import AbortStatus, Message, MessageState, SendResult, SendStatus
from broker_adapter.base import Consumer
from broker_adapter.clock import ManualClock
from broker_adapter.errors import InvalidArgument, InvalidDelay, InvalidMessage
from scheduler import Call, JobCall, JobHandle, Scheduler
from scheduler.errors import InvalidSchedule, UnserializableArgument
from scheduler.wire import make_encoder
from tests.helpers import assert_nothing, pull_one, pull_until

S = 1000


@pytest.fixture
def close_order(app: Scheduler) -> JobHandle[[int], str]:
    @app.job(name="shop.close_order")
    def close_order(order_id: int) -> str:
        return f"closed {order_id}"

    return close_order


@pytest.fixture
def consumer(app: Scheduler, close_order: JobHandle[[int], str]) -> Iterator[Consumer]:
    with app.broker.consumer("test-workers", sorted(app.topics())) as c:
        yield c


def nothing_sent(app: Scheduler) -> bool:
    return app.pending() == [] and app.broker.stats().pending == 0


# -- schedule ---------------------------------------------------------------------------


def test_schedule_returns_a_receipt(
    app: Scheduler, close_order: JobHandle[[int], str], manual_clock: ManualClock
) -> None:
    now = manual_clock.now_ms()
    job = close_order.schedule(42, delay=timedelta(minutes=30), key="order:42")
    assert job.status is SendStatus.OK and not job.duplicate
    assert job.key == "order:42"
    assert job.deliver_at_ms == now + 30 * 60 * S
    assert job.deliver_at == datetime.fromtimestamp((now + 30 * 60 * S) / 1000, UTC)
    assert job.deliver_at.tzinfo is UTC
    [view] = app.pending()
    assert (view.msg_id, view.key, view.topic, view.state) == (
        job.msg_id,
        "order:42",
        "chronoq.jobs",
        MessageState.PENDING,
    )
    assert close_order(1) == "closed 1"  # still callable directly


@pytest.mark.parametrize(
    ("timing", "delay_ms"),
    [
        ({}, 0),
        ({"delay": 5}, 5 * S),
        ({"delay": 0.25}, 250),
        ({"delay": timedelta(seconds=90)}, 90 * S),
        ({"delay_level": 3}, 10 * S),
        ({"delay_level": 18}, 2 * 3600 * S),
        ({"at_offset_ms": 60 * S}, 60 * S),
        ({"at_offset_ms": -500}, 0),  # in the past, within the 1 s tolerance: now
    ],
)
def test_schedule_timing(
    close_order: JobHandle[[int], str],
    manual_clock: ManualClock,
    timing: dict[str, Any],
    delay_ms: int,
) -> None:
    now = manual_clock.now_ms()
    if "at_offset_ms" in timing:
        at = datetime.fromtimestamp(
            (now + timing.pop("at_offset_ms")) / 1000, ZoneInfo("Asia/Tokyo")
        )
        timing = {"at": at}
    job = close_order.schedule(1, **timing)
    assert job.deliver_at_ms == now + delay_ms


def test_schedule_timing_changing_from_call_to_call(
    close_order: JobHandle[[int], str], manual_clock: ManualClock, consumer: Consumer
) -> None:
    """schedule() copies the message of the last timing used: each call still gets its
    own timing, arguments and key."""
    now = manual_clock.now_ms()
    calls: list[tuple[dict[str, Any], int]] = [
        ({"delay": 5}, 5 * S),
        ({"delay": 5, "key": "order:2"}, 5 * S),
        ({"delay": 7}, 7 * S),
        ({}, 0),
        ({"delay_level": 1}, S),
        ({"delay": 5}, 5 * S),
    ]
    jobs = [close_order.schedule(i, **timing) for i, (timing, _) in enumerate(calls)]
    assert [j.deliver_at_ms - now for j in jobs] == [ms for _, ms in calls]
    assert [j.key for j in jobs] == [None, "order:2", None, None, None, None]
    manual_clock.advance(10 * S)
    got = {m.msg_id: m for m in pull_until(consumer, len(calls))}
    for i, job in enumerate(jobs):
        m = got[job.msg_id]
        assert JobCall.decode(m.body).args == (i,)
        assert (m.key, m.tags, m.deliver_at_ms) == (job.key, "shop.close_order", job.deliver_at_ms)


def test_same_key_while_pending_is_a_duplicate(close_order: JobHandle[[int], str]) -> None:
    first = close_order.schedule(42, delay=60, key="order:42")
    again = close_order.schedule(42, delay=120, key="order:42")
    assert again.status is SendStatus.DUPLICATE and again.duplicate
    assert (again.msg_id, again.deliver_at_ms) == (first.msg_id, first.deliver_at_ms)


def test_message_format(app: Scheduler, manual_clock: ManualClock, consumer: Consumer) -> None:
    """What the dispatcher relies on: topic, JSON JobCall body, the caller's key."""

    @app.job(name="billing.charge", topic="billing")
    def charge(order_id: int, *, amount: str, tags: list[str]) -> None: ...

    with app.broker.consumer("billing-workers", ["billing"]) as billing:
        charge.schedule(7, amount="9.90", tags=["ä", "b"], key="charge:7", delay=1)
        manual_clock.advance(1 * S)
        m = pull_one(billing)
    assert (m.topic, m.key) == ("billing", "charge:7")
    call = JobCall("billing.charge", (7,), {"amount": "9.90", "tags": ["ä", "b"]})
    assert m.body == call.encode()
    assert JobCall.decode(m.body) == call


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((1, -2.5, "x", None, True), {}),
        (("ünïcode ✓", 'quote"\\'), {"k": 1e300}),
        (([1, [2, {"a": None}]], {"n": {"m": []}}), {"x": (1, 2)}),
        ((2**70,), {"big": -(2**64)}),
        ((0, -1, 2**70), {}),  # ints only: their repr is their JSON
        ([7, 8], {}),
    ],
)
def test_fast_encoder_matches_jobcall(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert make_encoder("m.f")(args, kwargs) == JobCall("m.f", args, kwargs).encode()


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(args=st.lists(_json, max_size=4), kwargs=st.dictionaries(st.text(), _json, max_size=3))
def test_fast_encoder_matches_jobcall_property(args: list[Any], kwargs: dict[str, Any]) -> None:
    assert make_encoder("m.f")(tuple(args), kwargs) == JobCall("m.f", tuple(args), kwargs).encode()


NAIVE = datetime(2030, 1, 1, 12, 0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda h, now: h.schedule(1, at=NAIVE), InvalidSchedule, "naive"),
        (lambda h, now: h.schedule(1, at=now - timedelta(seconds=5)), InvalidSchedule, "past"),
        (lambda h, now: h.schedule(1, at="2030-01-01"), InvalidSchedule, "datetime"),
        (lambda h, now: h.schedule(1, delay=-1), InvalidSchedule, "negative"),
        (lambda h, now: h.schedule(1, delay=math.nan), InvalidSchedule, "finite"),
        (lambda h, now: h.schedule(1, delay=math.inf), InvalidSchedule, "finite"),
        (lambda h, now: h.schedule(1, delay="10"), InvalidSchedule, "timedelta or seconds"),
        (lambda h, now: h.schedule(1, delay=True), InvalidSchedule, "timedelta or seconds"),
        (lambda h, now: h.schedule(1, delay=5, at=now), InvalidSchedule, "at most one"),
        (lambda h, now: h.schedule(1, delay=5, delay_level=2), InvalidSchedule, "at most one"),
        (lambda h, now: h.schedule(1, delay_level=0), InvalidSchedule, "levels"),
        (lambda h, now: h.schedule(1, delay_level=19), InvalidSchedule, "levels"),
        (lambda h, now: h.schedule(now), UnserializableArgument, r"args\[0\]"),
        (lambda h, now: h.schedule({1, 2}), UnserializableArgument, "sorted list"),
        (lambda h, now: h.schedule(b"raw"), UnserializableArgument, "base64"),
        (lambda h, now: h.schedule(math.nan), UnserializableArgument, "nan"),
        (lambda h, now: h.schedule(object()), UnserializableArgument, "plain JSON"),
        (lambda h, now: h.schedule({1: "a"}), UnserializableArgument, "keys are str"),
        (lambda h, now: h.schedule(1, amount=Decimal("1.5")), UnserializableArgument, "amount"),
        (lambda h, now: h.schedule([[now]]), UnserializableArgument, r"args\[0\]\[0\]\[0\]"),
        (lambda h, now: h.schedule(1, key=""), InvalidMessage, "key"),
        (lambda h, now: h.schedule(1, key=5), InvalidMessage, "key"),
        (lambda h, now: h.schedule(1, key="x" * 513), InvalidMessage, "key"),
        (lambda h, now: h.schedule(1, key="cron:shop.close_order:1"), InvalidSchedule, "reserved"),
        (lambda h, now: h.schedule(1, delay=timedelta(days=365 * 20)), InvalidDelay, "max delay"),
    ],
)
def test_bad_input_raises_and_sends_nothing(
    app: Scheduler,
    close_order: JobHandle[[int], str],
    manual_clock: ManualClock,
    call: Callable[[JobHandle[Any, Any], datetime], object],
    error: type[Exception],
    match: str,
) -> None:
    now = datetime.fromtimestamp(manual_clock.now_ms() / 1000, UTC)
    with pytest.raises(error, match=match):
        call(close_order, now)
    assert nothing_sent(app)


def test_fast_encoder_refuses_an_int_past_the_digits_limit_as_jobcall_does() -> None:
    with pytest.raises(UnserializableArgument) as fast:
        make_encoder("m.f")((10**5000,), {})
    with pytest.raises(UnserializableArgument) as checked:
        JobCall("m.f", (10**5000,), {}).encode()
    assert str(fast.value) == str(checked.value)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda h: h.schedule(1, delay=5, key=""), InvalidMessage, "key"),
        (lambda h: h.schedule(1, delay=5, key=5), InvalidMessage, "key"),
        (lambda h: h.schedule(1, delay=5, key="cron:x"), InvalidSchedule, "reserved"),
        (lambda h: h.schedule(object(), delay=5), UnserializableArgument, "plain JSON"),
        (lambda h: h.schedule(10**5000, delay=5), UnserializableArgument, "args"),
        (lambda h: h.schedule(1, delay=5.0, at=NAIVE), InvalidSchedule, "at most one"),
        (lambda h: h.schedule(1, delay=5, delay_level=0), InvalidSchedule, "at most one"),
        (lambda h: h.schedule(1, delay=timedelta(days=365 * 20)), InvalidDelay, "max delay"),
    ],
)
def test_a_repeated_delay_still_checks_everything(
    app: Scheduler,
    close_order: JobHandle[[int], str],
    call: Callable[[JobHandle[Any, Any]], object],
    error: type[Exception],
    match: str,
) -> None:
    """schedule() reuses the message of a repeated plain delay (its hot path): bad
    input alongside it raises as before and sends nothing."""
    first = close_order.schedule(1, delay=5)
    with pytest.raises(error, match=match):
        call(close_order)
    assert [v.msg_id for v in app.pending()] == [first.msg_id]
    assert app.broker.stats().pending == 1


def test_a_repeated_delay_of_another_type_or_value_gets_its_own_timing(
    close_order: JobHandle[[int], str], manual_clock: ManualClock, consumer: Consumer
) -> None:
    now = manual_clock.now_ms()
    at = datetime.fromtimestamp((now + 9 * S) / 1000, UTC)
    calls: list[tuple[dict[str, Any], int]] = [
        ({"delay": 5}, 5 * S),
        ({"delay": 5}, 5 * S),
        ({"delay": 5.0}, 5 * S),
        ({"delay": 5.0004}, 5 * S),
        ({"delay": 5.6}, 5600),
        ({"delay": timedelta(seconds=5)}, 5 * S),
        ({"delay": timedelta(seconds=6)}, 6 * S),
        ({"at": at}, 9 * S),
        ({"delay": 6, "key": "order:7"}, 6 * S),
        ({"delay": 6}, 6 * S),
        ({}, 0),
        ({"delay": None}, 0),
        ({"delay": 0}, 0),
    ]
    jobs = [close_order.schedule(i, **timing) for i, (timing, _) in enumerate(calls)]
    assert [j.deliver_at_ms - now for j in jobs] == [ms for _, ms in calls]
    manual_clock.advance(10 * S)
    got = {m.msg_id: m for m in pull_until(consumer, len(calls))}
    for i, job in enumerate(jobs):
        m = got[job.msg_id]
        assert m.body == JobCall("shop.close_order", (i,), {}).encode()
        assert (m.key, m.tags, m.deliver_at_ms) == (job.key, "shop.close_order", job.deliver_at_ms)


# -- schedule_many --------------------------------------------------------------------


def test_schedule_many_is_one_send_batch(
    app: Scheduler,
    close_order: JobHandle[[int], str],
    manual_clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = app.broker
    batches: list[int] = []
    real = broker.send_batch

    def counting(messages: list[Message]) -> list[SendResult]:
        batches.append(len(messages))
        return real(messages)

    monkeypatch.setattr(broker, "send_batch", counting)
    monkeypatch.setattr(broker, "send", lambda m: pytest.fail("schedule_many used send()"))
    now = manual_clock.now_ms()
    jobs = close_order.schedule_many(
        [
            ((1,), {}),
            ((2,), {}, "order:2"),
            Call((3,), key="order:3", delay=10),
            Call(kwargs={"order_id": 4}, at=datetime.fromtimestamp(now / 1000 + 20, UTC)),
            Call((5,), delay_level=1),
            ((6,), {}, "order:2"),  # repeated key within the batch
        ],
        delay=timedelta(minutes=1),
    )
    assert batches == [6]
    assert [j.deliver_at_ms - now for j in jobs] == [60 * S, 60 * S, 10 * S, 20 * S, S, 60 * S]
    assert [j.key for j in jobs] == [None, "order:2", "order:3", None, None, "order:2"]
    assert [j.status for j in jobs] == [SendStatus.OK] * 5 + [SendStatus.DUPLICATE]
    assert jobs[5].msg_id == jobs[1].msg_id
    assert app.broker.stats().pending == 5


def test_schedule_many_of_nothing_sends_nothing(
    app: Scheduler, close_order: JobHandle[[int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.broker, "send_batch", lambda ms: pytest.fail("sent"))
    assert close_order.schedule_many([]) == []
    assert close_order.schedule_many(iter(())) == []


def test_schedule_many_many(app: Scheduler, close_order: JobHandle[[int], str]) -> None:
    jobs = close_order.schedule_many((((i,), {}, f"order:{i}") for i in range(5000)), delay=60)
    assert len({j.msg_id for j in jobs}) == 5000
    assert app.broker.stats().pending == 5000
    assert gc.isenabled()


def test_schedule_many_leaves_a_disabled_collector_disabled(
    close_order: JobHandle[[int], str],
) -> None:
    gc.disable()
    try:
        close_order.schedule_many([((1,), {})])
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "bad",
    [
        ((1,), {}, "cron:x:1"),
        ((datetime(2030, 1, 1),), {}),
        Call((1,), delay=-5),
        Call((1,), at=NAIVE),
        ((1,), {}, ""),
        ((1,), {}, 5),
        ((1,), {}, "k\x00"),
        ((b"raw",), {}, "order:2"),
        "not a call",
        ((1,),),
    ],
)
def test_schedule_many_is_all_or_nothing(
    app: Scheduler, close_order: JobHandle[[int], str], bad: Any
) -> None:
    with pytest.raises((InvalidSchedule, UnserializableArgument, InvalidMessage, TypeError)):
        close_order.schedule_many([((1,), {}, "order:1"), bad, ((3,), {})], delay=10)
    assert nothing_sent(app)
    assert gc.isenabled()


def test_schedule_many_bad_default_timing(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    with pytest.raises(InvalidSchedule):
        close_order.schedule_many([((1,), {})], delay=1, delay_level=2)
    assert nothing_sent(app)


# -- cancel, get, pending -------------------------------------------------------------


def test_cancel_before_the_fire_time_aborts(
    app: Scheduler,
    close_order: JobHandle[[int], str],
    manual_clock: ManualClock,
    consumer: Consumer,
) -> None:
    job = close_order.schedule(42, delay=60, key="order:42")
    assert close_order.cancel(key="order:42") is AbortStatus.ABORTED
    assert close_order.cancel(key="order:42") is AbortStatus.ABORTED  # twice: ABORTED twice
    view = close_order.get(job.msg_id)
    assert view is not None and view.state is MessageState.ABORTED
    manual_clock.advance(120 * S)
    assert_nothing(consumer)
    # the key is free again
    again = close_order.schedule(42, delay=60, key="order:42")
    assert again.status is SendStatus.OK and again.msg_id != job.msg_id


def test_cancel_by_msg_id(close_order: JobHandle[[int], str]) -> None:
    job = close_order.schedule(1, delay=60)
    assert close_order.cancel(msg_id=job.msg_id) is AbortStatus.ABORTED


def test_cancel_after_delivery_is_already_delivered(
    close_order: JobHandle[[int], str], manual_clock: ManualClock, consumer: Consumer
) -> None:
    job = close_order.schedule(42, delay=10, key="order:42")
    manual_clock.advance(10 * S)
    m = pull_one(consumer)
    assert m.msg_id == job.msg_id
    assert close_order.cancel(key="order:42") is AbortStatus.ALREADY_DELIVERED
    assert close_order.cancel(msg_id=job.msg_id) is AbortStatus.ALREADY_DELIVERED
    view = close_order.get(job.msg_id)
    assert view is not None and view.state is MessageState.INFLIGHT


def test_cancel_unknown_is_not_found(close_order: JobHandle[[int], str]) -> None:
    assert close_order.cancel(key="order:404") is AbortStatus.NOT_FOUND
    assert close_order.cancel(msg_id="00" * 16) is AbortStatus.NOT_FOUND
    assert close_order.cancel(msg_id="not-an-id") is AbortStatus.NOT_FOUND


def test_cancel_needs_exactly_one_of_key_and_msg_id(close_order: JobHandle[[int], str]) -> None:
    with pytest.raises(InvalidArgument):
        close_order.cancel()
    with pytest.raises(InvalidArgument):
        close_order.cancel(key="a", msg_id="b")


def test_cancel_by_key_looks_on_the_jobs_topic(app: Scheduler) -> None:
    @app.job(name="a", topic="topic-a")
    def a() -> None: ...

    @app.job(name="b")
    def b() -> None: ...

    a.schedule(delay=60, key="same")
    assert b.cancel(key="same") is AbortStatus.NOT_FOUND
    assert a.cancel(key="same") is AbortStatus.ABORTED


def test_get(close_order: JobHandle[[int], str], manual_clock: ManualClock) -> None:
    job = close_order.schedule(1, delay=60, key="order:1")
    view = close_order.get(job.msg_id)
    assert view is not None
    assert (view.state, view.deliver_at_ms, view.key) == (
        MessageState.PENDING,
        job.deliver_at_ms,
        "order:1",
    )
    assert close_order.get("ff" * 16) is None


def test_pending_filters(
    app: Scheduler, close_order: JobHandle[[int], str], manual_clock: ManualClock
) -> None:
    @app.job(name="other", topic="other")
    def other() -> None: ...

    now = manual_clock.now_ms()
    for i in range(1, 6):
        close_order.schedule(i, delay=i * 60, key=f"order:{i}")
    other.schedule(delay=90)
    assert len(app.pending()) == 6
    assert [v.key for v in app.pending(topic="chronoq.jobs", limit=2)] == ["order:1", "order:2"]
    start = datetime.fromtimestamp((now + 120 * S) / 1000, UTC)
    assert [v.key for v in app.pending("chronoq.jobs", start=start, end=now + 240 * S)] == [
        "order:2",
        "order:3",
    ]
    assert [v.topic for v in app.pending("other")] == ["other"]
    with pytest.raises(InvalidSchedule, match="naive"):
        app.pending(start=NAIVE)
    with pytest.raises(TypeError):
        app.pending(end="soon")  # type: ignore[call-overload]


# -- the order auto-close workflow ----------------------------------------------------


def test_order_timeout_workflow(
    app: Scheduler, manual_clock: ManualClock, consumer: Consumer
) -> None:
    """Schedule the close at order creation; cancel on payment; the job body checks
    the order's state, so losing the cancel race is harmless."""
    orders = {1: "unpaid", 2: "unpaid", 3: "unpaid"}

    @app.job(name="shop.auto_close")
    def auto_close(order_id: int) -> None:
        if orders[order_id] == "unpaid":  # idempotent: close only if still unpaid
            orders[order_id] = "closed"

    def pay(order_id: int) -> AbortStatus:
        status = auto_close.cancel(key=f"order:{order_id}")
        if orders[order_id] == "unpaid":
            orders[order_id] = "paid"
        return status

    for order_id in orders:
        auto_close.schedule(order_id, delay=timedelta(minutes=30), key=f"order:{order_id}")
    assert pay(2) is AbortStatus.ABORTED
    manual_clock.advance(30 * 60 * S)
    fired = pull_until(consumer, 2)
    assert sorted(m.key or "" for m in fired) == ["order:1", "order:3"]
    for m in fired:
        call = JobCall.decode(m.body)
        app.registry.get(call.name).func(*call.args, **call.kwargs)
        consumer.ack(m)
    assert pay(3) is AbortStatus.ALREADY_DELIVERED  # too late: the close ran first
    assert orders == {1: "closed", 2: "paid", 3: "closed"}
    assert_nothing(consumer)
