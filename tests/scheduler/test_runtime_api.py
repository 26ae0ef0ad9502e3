"""The scheduler's runtime calls (issue 15 §2): runs tagged with their job's name,
``job.reschedule``/``run_now`` (and on the receipt), ``app.cancel_all`` and
``app.pending(job=..., key_prefix=...)``, sync and awaitable, on real brokers: the
in-process ``memory://`` broker and the embedded ``rocksdb://`` one in a temporary
directory, both on a ManualClock.
"""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker_adapter import AbortStatus, MessageState, SendStatus, open_broker
from broker_adapter.base import Consumer
from broker_adapter.clock import ManualClock
from broker_adapter.errors import InvalidArgument, UnknownTopic
from broker_adapter.message import MAX_TAGS_CHARS
from broker_adapter.results import MessageView, RescheduleStatus
from scheduler import Call, JobCall, JobHandle, JobNotFound, Scheduler
from scheduler import pending_runs as pending_runs_module
from scheduler.errors import InvalidSchedule, UnserializableArgument
from scheduler.pending_runs import PendingRun
from scheduler.receipts import CancelAllResult, RescheduleReceipt, ScheduledJob
from scheduler.spec import MAX_NAME_CHARS
from tests.helpers import assert_nothing, pull_one

S = 1000
MIN = 60 * S
REMIND, CLOSE = "shop.remind_customer", "shop.close_order"


@pytest.fixture(params=["memory", "rocksdb"])
def app(
    request: pytest.FixtureRequest, data_dir: Path, manual_clock: ManualClock
) -> Iterator[Scheduler]:
    if request.param == "rocksdb":
        with Scheduler(f"rocksdb://{data_dir}", clock=manual_clock) as scheduler:
            yield scheduler
        return
    with (
        open_broker("memory://", clock=manual_clock) as broker,
        Scheduler(broker, clock=manual_clock) as scheduler,
    ):
        yield scheduler


class Jobs:
    """The order workflow's two jobs, on two topics (so the app has two)."""

    def __init__(self, app: Scheduler) -> None:
        @app.job(name=REMIND)
        def remind_customer(order_id: int, note: str = "") -> None: ...

        @app.job(name=CLOSE, topic="shop.close")
        def close_order(order_id: int) -> None: ...

        self.remind: JobHandle[Any, None] = remind_customer
        self.close: JobHandle[Any, None] = close_order


@pytest.fixture
def jobs(app: Scheduler) -> Jobs:
    return Jobs(app)


@pytest.fixture
def consumer(app: Scheduler, jobs: Jobs) -> Iterator[Consumer]:
    with app.broker.consumer("runtime-tests", sorted(app.topics())) as c:
        yield c


def view(app: Scheduler, msg_id: str | None) -> MessageView:
    assert msg_id is not None
    found = app.get(msg_id)
    assert found is not None
    return found


def all_pending(app: Scheduler, **filters: Any) -> list[MessageView]:
    """Every page of the broker's ``find_pending`` (pages may be short before the last)."""
    views: list[MessageView] = []
    cursor = None
    while True:
        page = app.broker.find_pending(**filters, cursor=cursor)
        views += page.messages
        if page.cursor is None:
            return views
        cursor = page.cursor


def body_call(app: Scheduler, topic: str, key: str) -> JobCall:
    """The job call a pending run carries now (read back through find_pending)."""
    views = all_pending(app, topic=topic, key_prefix=key, with_body=True)
    (found,) = [v for v in views if v.key == key]
    assert found.body is not None
    return JobCall.decode(found.body)


def place_order(jobs: Jobs, order: int) -> tuple[ScheduledJob, ScheduledJob]:
    remind = jobs.remind.schedule(order, delay=timedelta(minutes=15), key=f"order:{order}:remind")
    close = jobs.close.schedule(order, delay=timedelta(minutes=30), key=f"order:{order}:close")
    return remind, close


# -- every run carries its job's name ---------------------------------------------------------


def test_every_run_the_scheduler_sends_is_tagged_with_its_job_name(
    app: Scheduler, jobs: Jobs
) -> None:
    one = jobs.remind.schedule(1, delay=60)
    many = jobs.remind.schedule_many([((2,), {}), ((3,), {}, "k3"), Call((4,), key="k4", delay=5)])
    other = jobs.close.schedule_many([((5,), {})], delay=60)
    later = asyncio.run(jobs.close.schedule_async(6, delay=60))
    for r in [one, *many]:
        assert view(app, r.msg_id).tags == REMIND
    for r in [*other, later]:
        assert view(app, r.msg_id).tags == CLOSE
    # So the broker finds a job's runs by tag.
    found = all_pending(app, tag=CLOSE)
    assert {v.msg_id for v in found} == {other[0].msg_id, later.msg_id}


def test_a_job_name_of_the_longest_length_fits_in_the_tags(app: Scheduler) -> None:
    assert MAX_TAGS_CHARS >= MAX_NAME_CHARS
    name = "n" * MAX_NAME_CHARS

    @app.job(name=name)
    def long_named() -> None: ...

    receipt = long_named.schedule(delay=60)
    (batched,) = long_named.schedule_many([((), {})], delay=60)
    assert view(app, receipt.msg_id).tags == name
    assert view(app, batched.msg_id).tags == name


# -- reschedule -------------------------------------------------------------------------------


def test_reschedule_moves_both_timers_of_an_order_keeping_id_key_and_arguments(
    app: Scheduler, jobs: Jobs, manual_clock: ManualClock, consumer: Consumer
) -> None:
    remind, close = place_order(jobs, 42)
    now = manual_clock.now_ms()
    moved_remind = jobs.remind.reschedule(key="order:42:remind", delay=timedelta(minutes=35))
    at = datetime.fromtimestamp((now + 50 * MIN) / 1000, UTC)
    moved_close = jobs.close.reschedule(key="order:42:close", at=at)
    assert moved_remind == RescheduleReceipt(
        RescheduleStatus.RESCHEDULED, remind.msg_id, now + 35 * MIN
    )
    assert moved_close == RescheduleReceipt(
        RescheduleStatus.RESCHEDULED, close.msg_id, now + 50 * MIN
    )
    assert moved_close.rescheduled and moved_close.deliver_at == at
    for receipt, due in ((remind, now + 35 * MIN), (close, now + 50 * MIN)):
        v = view(app, receipt.msg_id)
        assert (v.state, v.deliver_at_ms, v.key) == (MessageState.PENDING, due, receipt.key)
    assert body_call(app, "shop.close", "order:42:close") == JobCall(CLOSE, (42,))
    # The key is still taken by the moved run.
    again = jobs.close.schedule(42, delay=timedelta(minutes=30), key="order:42:close")
    assert (again.status, again.msg_id) == (SendStatus.DUPLICATE, close.msg_id)
    # Nothing fires at the old times; each fires once at its new time.
    manual_clock.advance(31 * MIN)
    assert_nothing(consumer)
    manual_clock.advance(4 * MIN)
    first = pull_one(consumer)
    assert first.msg_id == remind.msg_id and consumer.ack(first)
    manual_clock.advance(15 * MIN)
    got = pull_one(consumer)
    assert (got.msg_id, got.key, got.tags) == (close.msg_id, "order:42:close", CLOSE)
    assert_nothing(consumer)


def test_reschedule_with_arguments_replaces_the_call(
    app: Scheduler, jobs: Jobs, manual_clock: ManualClock, consumer: Consumer
) -> None:
    remind, _ = place_order(jobs, 7)
    moved = jobs.remind.reschedule(
        key="order:7:remind", delay=60, args=[7], kwargs={"note": "20 more minutes"}
    )
    assert moved.status is RescheduleStatus.RESCHEDULED
    expected = JobCall(REMIND, (7,), {"note": "20 more minutes"})
    assert body_call(app, "chronoq.jobs", "order:7:remind") == expected
    # Only kwargs: the positional arguments become empty (the whole call is replaced).
    jobs.remind.reschedule(msg_id=remind.msg_id, delay=60, kwargs={"order_id": 8})
    assert body_call(app, "chronoq.jobs", "order:7:remind") == JobCall(REMIND, (), {"order_id": 8})
    manual_clock.advance(60 * S)
    got = pull_one(consumer)
    assert JobCall.decode(got.body) == JobCall(REMIND, (), {"order_id": 8})


def test_reschedule_answers_already_delivered_and_not_found(
    app: Scheduler, jobs: Jobs, manual_clock: ManualClock, consumer: Consumer
) -> None:
    remind, close = place_order(jobs, 9)
    manual_clock.advance(15 * MIN)
    assert pull_one(consumer).msg_id == remind.msg_id
    late = jobs.remind.reschedule(key="order:9:remind", delay=60, args=[9])
    assert late.status is RescheduleStatus.ALREADY_DELIVERED
    assert late.msg_id == remind.msg_id
    assert jobs.remind.reschedule(msg_id=remind.msg_id, delay=60).status is (
        RescheduleStatus.ALREADY_DELIVERED
    )
    missing = jobs.remind.reschedule(key="order:nope", delay=60)
    assert (missing.status, missing.deliver_at) == (RescheduleStatus.NOT_FOUND, None)
    assert jobs.close.cancel(key="order:9:close") is AbortStatus.ABORTED
    assert jobs.close.reschedule(msg_id=close.msg_id, delay=60).status is RescheduleStatus.NOT_FOUND
    # A job whose topic never had a message: NOT_FOUND, not an error.

    @app.job(name="shop.quiet", topic="shop.quiet")
    def quiet() -> None: ...

    assert quiet.reschedule(key="k", delay=1, args=[]).status is RescheduleStatus.NOT_FOUND


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"delay": 60}, InvalidArgument),  # no run named
        ({"key": "order:1:remind", "msg_id": "m", "delay": 60}, InvalidArgument),
        ({"key": "order:1:remind"}, InvalidSchedule),  # no time
        (
            {"key": "order:1:remind", "delay": 60, "at": datetime(2030, 1, 1, tzinfo=UTC)},
            InvalidSchedule,
        ),
        ({"key": "order:1:remind", "at": datetime(2030, 1, 1)}, InvalidSchedule),  # naive
        ({"key": "order:1:remind", "at": datetime(2020, 1, 1, tzinfo=UTC)}, InvalidSchedule),
        ({"key": "order:1:remind", "delay": -1}, InvalidSchedule),
        ({"key": "cron:shop.remind_customer:1", "delay": 60}, InvalidSchedule),
        ({"key": "order:1:remind", "delay": 60, "args": [object()]}, UnserializableArgument),
        ({"key": "order:1:remind", "delay": 60, "args": 5}, UnserializableArgument),
        (
            {"key": "order:1:remind", "delay": 60, "kwargs": {"x": float("nan")}},
            UnserializableArgument,
        ),
    ],
)
def test_bad_reschedules_raise_and_change_nothing(
    app: Scheduler, jobs: Jobs, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    remind, _ = place_order(jobs, 1)
    before = view(app, remind.msg_id)
    with pytest.raises(error):
        jobs.remind.reschedule(**kwargs)
    with pytest.raises(error):
        asyncio.run(jobs.remind.reschedule_async(**kwargs))
    assert view(app, remind.msg_id) == before
    assert body_call(app, "chronoq.jobs", "order:1:remind") == JobCall(REMIND, (1,))


def test_new_arguments_for_another_jobs_run_are_refused(app: Scheduler, jobs: Jobs) -> None:
    """Keys are per topic, not per job: a handle may not rewrite another job's run
    into its own call."""

    @app.job(name="shop.notify")
    def notify(order_id: int) -> None: ...

    remind, _ = place_order(jobs, 3)
    with pytest.raises(InvalidArgument, match="shop.remind_customer"):
        notify.reschedule(key="order:3:remind", delay=60, args=[3])
    with pytest.raises(InvalidArgument, match="shop.remind_customer"):
        notify.reschedule(msg_id=remind.msg_id, delay=60, args=[3])
    with pytest.raises(InvalidArgument):
        asyncio.run(notify.reschedule_async(key="order:3:remind", delay=60, args=[3]))
    assert view(app, remind.msg_id).deliver_at_ms == remind.deliver_at_ms
    assert body_call(app, "chronoq.jobs", "order:3:remind") == JobCall(REMIND, (3,))


# -- run now ----------------------------------------------------------------------------------


def test_run_now_by_key_by_id_and_from_the_receipt(
    app: Scheduler, jobs: Jobs, manual_clock: ManualClock, consumer: Consumer
) -> None:
    remind, close = place_order(jobs, 5)
    now = manual_clock.now_ms()
    by_key = jobs.close.run_now(key="order:5:close")
    assert by_key == RescheduleReceipt(RescheduleStatus.RESCHEDULED, close.msg_id, now)
    assert pull_one(consumer).msg_id == close.msg_id
    assert remind.job is jobs.remind
    assert remind.run_now() == RescheduleReceipt(RescheduleStatus.RESCHEDULED, remind.msg_id, now)
    assert pull_one(consumer).msg_id == remind.msg_id
    assert remind.run_now().status is RescheduleStatus.ALREADY_DELIVERED
    assert jobs.close.run_now(msg_id="no-such-id").status is RescheduleStatus.NOT_FOUND


def test_a_receipt_reschedules_and_cancels_its_run(
    app: Scheduler, jobs: Jobs, manual_clock: ManualClock
) -> None:
    remind, close = place_order(jobs, 6)
    moved = remind.reschedule(delay=timedelta(minutes=40), args=[6], kwargs={"note": "n"})
    assert moved.deliver_at_ms == manual_clock.now_ms() + 40 * MIN
    assert body_call(app, "chronoq.jobs", "order:6:remind") == JobCall(REMIND, (6,), {"note": "n"})
    assert close.cancel() is AbortStatus.ABORTED
    assert view(app, close.msg_id).state is MessageState.ABORTED


def test_a_copied_or_unpickled_receipt_is_plain_and_says_what_to_call(jobs: Jobs) -> None:
    remind, _ = place_order(jobs, 8)
    for plain in (pickle.loads(pickle.dumps(remind)), copy.copy(remind)):
        assert plain == remind and type(plain) is ScheduledJob and plain.job is None
        with pytest.raises(InvalidArgument, match=r"run_now\(msg_id="):
            plain.run_now()
    assert isinstance(remind, ScheduledJob) and remind._asdict() == plain._asdict()
    assert len(remind) == 4


# -- cancel_all -------------------------------------------------------------------------------


def test_cancel_all_cancels_every_timer_of_an_order_on_every_topic(
    app: Scheduler, jobs: Jobs, consumer: Consumer, manual_clock: ManualClock
) -> None:
    place_order(jobs, 42)
    other = place_order(jobs, 420)  # "order:420:" is not under "order:42:"
    result = app.cancel_all(key_prefix="order:42:")
    assert result == CancelAllResult(2, (), 0, ("chronoq.jobs", "shop.close"))
    assert not result.any_fired
    assert app.cancel_all(key_prefix="order:42:").aborted == 0
    manual_clock.advance(31 * MIN)
    got = {pull_one(consumer).msg_id, pull_one(consumer).msg_id}
    assert got == {r.msg_id for r in other}


def test_cancel_all_reports_the_keys_that_had_fired(
    app: Scheduler, jobs: Jobs, consumer: Consumer, manual_clock: ManualClock
) -> None:
    remind, close = place_order(jobs, 43)
    manual_clock.advance(16 * MIN)
    assert pull_one(consumer).msg_id == remind.msg_id
    result = app.cancel_all(key_prefix="order:43:")
    assert (result.aborted, result.already_delivered, result.any_fired) == (
        1,
        ("order:43:remind",),
        True,
    )
    assert view(app, close.msg_id).state is MessageState.ABORTED


def test_cancel_all_on_a_named_topic_and_on_topics_the_broker_never_saw(
    app: Scheduler, jobs: Jobs
) -> None:
    @app.job(name="shop.quiet", topic="shop.quiet")
    def quiet() -> None: ...

    place_order(jobs, 44)
    # The app's own topic "shop.quiet" never had a message: nothing to cancel there.
    only_close = app.cancel_all(key_prefix="order:44:", topic="shop.close")
    assert (only_close.aborted, only_close.topics) == (1, ("shop.close",))
    assert app.cancel_all(key_prefix="order:44:").aborted == 1  # the reminder
    with pytest.raises(UnknownTopic):
        app.cancel_all(key_prefix="order:", topic="never.seen")
    with pytest.raises(UnknownTopic):
        asyncio.run(app.cancel_all_async(key_prefix="order:", topic="never.seen"))


@pytest.mark.parametrize("prefix", ["", "cron:", "cron:shop", "c", 42])
def test_cancel_all_refuses_bad_prefixes_and_changes_nothing(
    app: Scheduler, jobs: Jobs, prefix: Any
) -> None:
    remind, close = place_order(jobs, 45)
    with pytest.raises(InvalidArgument):
        app.cancel_all(key_prefix=prefix)
    with pytest.raises(InvalidArgument):
        asyncio.run(app.cancel_all_async(key_prefix=prefix))
    with pytest.raises(InvalidArgument):
        app.pending(key_prefix=prefix)
    assert view(app, remind.msg_id).state is view(app, close.msg_id).state is MessageState.PENDING


# -- pending ----------------------------------------------------------------------------------


def test_pending_keeps_its_list_form(app: Scheduler, jobs: Jobs, manual_clock: ManualClock) -> None:
    remind, close = place_order(jobs, 50)
    now = manual_clock.now_ms()
    everything = app.pending()
    assert isinstance(everything, list) and all(isinstance(v, MessageView) for v in everything)
    assert [v.msg_id for v in everything] == [remind.msg_id, close.msg_id]
    assert [v.msg_id for v in app.pending("shop.close")] == [close.msg_id]
    assert [v.msg_id for v in app.pending(None, now + 20 * MIN, limit=5)] == [close.msg_id]
    assert len(app.pending(limit=1)) == 1


def test_pending_by_key_prefix_and_job_yields_decoded_runs_in_due_order(
    app: Scheduler, jobs: Jobs, manual_clock: ManualClock
) -> None:
    now = manual_clock.now_ms()
    place_order(jobs, 60)
    jobs.remind.schedule(61, delay=timedelta(minutes=5), key="order:61:remind")
    jobs.close.schedule(62, delay=timedelta(minutes=1), key="invoice:62")
    runs = app.pending(key_prefix="order:")
    assert isinstance(runs, Iterator)
    listed = [(r.job, r.args, r.key, r.deliver_at_ms) for r in runs]
    assert listed == [
        (REMIND, (61,), "order:61:remind", now + 5 * MIN),
        (REMIND, (60,), "order:60:remind", now + 15 * MIN),
        (CLOSE, (60,), "order:60:close", now + 30 * MIN),
    ]
    by_job = list(app.pending(job=jobs.close))
    assert [(r.key, r.topic) for r in by_job] == [
        ("invoice:62", "shop.close"),
        ("order:60:close", "shop.close"),
    ]
    assert [r.key for r in app.pending(job=CLOSE, key_prefix="order:")] == ["order:60:close"]
    first = next(iter(app.pending(job=REMIND)))
    assert isinstance(first, PendingRun)
    assert first.deliver_at == datetime.fromtimestamp((now + 5 * MIN) / 1000, UTC)
    assert first.call == JobCall(REMIND, (61,)) and first.kwargs == {}
    assert first.view.state is MessageState.PENDING
    window = app.pending(key_prefix="order:", start=now + 10 * MIN, end=now + 30 * MIN)
    assert [r.key for r in window] == ["order:60:remind"]
    assert [r.key for r in app.pending(key_prefix="order:", limit=2)] == [
        "order:61:remind",
        "order:60:remind",
    ]


def test_pending_walks_every_page_lazily(
    app: Scheduler, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pending_runs_module, "PAGE_SIZE", 7)
    # Distinct due times, so the order within a topic does not depend on the broker.
    receipts = jobs.remind.schedule_many(
        [Call((i,), key=f"order:{i:03}:remind", delay=60 + i) for i in range(50)]
    ) + jobs.close.schedule_many(
        [Call((i,), key=f"order:{i:03}:close", delay=30 + 2 * i) for i in range(30)]
    )
    runs = app.iter_pending(key_prefix="order:")
    first = next(runs)
    # Pages not read yet: a run cancelled now is not listed.
    assert jobs.close.cancel(key="order:029:close") is AbortStatus.ABORTED
    rest = [first, *runs]
    assert len(rest) == 79
    assert [r.deliver_at_ms for r in rest] == sorted(r.deliver_at_ms for r in rest)
    assert {r.msg_id for r in rest} == {r.msg_id for r in receipts} - {receipts[-1].msg_id}


def test_pending_argument_errors_are_raised_at_the_call(app: Scheduler, jobs: Jobs) -> None:
    place_order(jobs, 70)
    with pytest.raises(InvalidArgument, match="topic"):
        app.pending(job=jobs.close, topic="chronoq.jobs")
    with pytest.raises(JobNotFound):
        app.pending(job="shop.nope")
    with pytest.raises(UnknownTopic):
        app.iter_pending(topic="never.seen")
    with pytest.raises(InvalidArgument):
        app.pending(key_prefix="order:", limit=0)
    with pytest.raises(InvalidSchedule):
        app.pending(key_prefix="order:", start=datetime(2030, 1, 1))
    with pytest.raises(JobNotFound):
        app.iter_pending_async(job="shop.nope")


def test_the_async_twins(app: Scheduler, jobs: Jobs, manual_clock: ManualClock) -> None:
    now = manual_clock.now_ms()

    async def workflow() -> dict[str, Any]:
        remind = await jobs.remind.schedule_async(
            80, delay=timedelta(minutes=15), key="order:80:remind"
        )
        await jobs.close.schedule_async(80, delay=timedelta(minutes=30), key="order:80:close")
        out: dict[str, Any] = {"old": await app.pending_async()}
        out["moved"] = await jobs.close.reschedule_async(
            key="order:80:close", delay=timedelta(minutes=50)
        )
        out["listed"] = await app.pending_async(key_prefix="order:80:")
        out["iterated"] = [r.key async for r in app.iter_pending_async(job=jobs.close)]
        out["moved_again"] = await remind.reschedule_async(delay=60)
        out["cancelled"] = await app.cancel_all_async(key_prefix="order:80:")
        other = await jobs.close.schedule_async(81, delay=60, key="order:81:close")
        out["now"] = await other.run_now_async()
        await jobs.remind.schedule_async(82, delay=60, key="order:82:remind")
        out["by_key"] = await jobs.remind.run_now_async(key="order:82:remind")
        await app.aclose()
        return out

    out = asyncio.run(workflow())
    assert all(isinstance(v, MessageView) for v in out["old"]) and len(out["old"]) == 2
    assert out["moved"].deliver_at_ms == now + 50 * MIN
    assert [(r.key, r.deliver_at_ms) for r in out["listed"]] == [
        ("order:80:remind", now + 15 * MIN),
        ("order:80:close", now + 50 * MIN),
    ]
    assert out["iterated"] == ["order:80:close"]
    assert out["moved_again"].deliver_at_ms == now + 60 * S
    assert out["cancelled"] == CancelAllResult(2, (), 0, ("chronoq.jobs", "shop.close"))
    assert out["now"].status is out["by_key"].status is RescheduleStatus.RESCHEDULED
    assert out["now"].deliver_at_ms == out["by_key"].deliver_at_ms == now
