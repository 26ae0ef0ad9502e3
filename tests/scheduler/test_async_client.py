"""The awaitable client calls (``schedule_async`` & co., :mod:`scheduler.async_client`)
and the loop rule (:mod:`scheduler.loop_rule`), on real brokers: the embedded one
in a temporary directory, a real ``chronoq`` server subprocess and the session's
real redis-server.

Coroutines are driven by plain ``asyncio.run`` (no pytest-asyncio): each test owns
its loops, which is also how the tests show one async client per loop and the
client closing with its loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker_adapter import AbortStatus, MessageState, SendStatus
from broker_adapter.async_base import AsyncAdapterBase
from broker_adapter.clock import ManualClock
from broker_adapter.errors import BrokerClosed, InvalidArgument
from broker_adapter.threaded_async import ThreadedAsyncBroker
from scheduler import Call, JobHandle, Scheduler, SyncCallInEventLoop
from scheduler.errors import InvalidSchedule, UnserializableArgument
from scheduler.loop_rule import is_local
from tests.helpers import pull_one
from tests.server.serverproc import ServerProcess

T = TypeVar("T")
S = 1000


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop (closed afterwards, its tasks cancelled)."""
    return asyncio.run(coro)


def add_jobs(app: Scheduler) -> JobHandle[[int], str]:
    @app.job(name="shop.close_order")
    def close_order(order_id: int) -> str:
        return f"closed {order_id}"

    return close_order


@pytest.fixture
def close_order(app: Scheduler) -> JobHandle[[int], str]:
    return add_jobs(app)


def nothing_sent(app: Scheduler) -> bool:
    return app.pending() == [] and app.broker.stats().pending == 0


# -- embedded: the twins send what the sync forms send -------------------------------------


def test_schedule_async_sends_the_message_schedule_sends(
    app: Scheduler, close_order: JobHandle[[int], str], manual_clock: ManualClock
) -> None:
    now = manual_clock.now_ms()
    sync = close_order.schedule(42, delay=30, key="order:42")
    receipt = run(close_order.schedule_async(42, delay=30, key="order:43"))
    assert receipt.status is SendStatus.OK and receipt.key == "order:43"
    assert receipt.deliver_at_ms == sync.deliver_at_ms == now + 30 * S
    with app.broker.consumer("g", sorted(app.topics())) as consumer:
        manual_clock.advance(30 * S)
        first, second = pull_one(consumer), pull_one(consumer)
    assert first.body == second.body  # byte for byte the same job call
    assert {first.key, second.key} == {"order:42", "order:43"}
    assert first.topic == second.topic == close_order.topic


def test_schedule_async_with_a_pending_key_is_a_duplicate(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    first = close_order.schedule(1, delay=60, key="order:1")
    again = run(close_order.schedule_async(1, delay=5, key="order:1"))
    assert again.duplicate and again.msg_id == first.msg_id
    assert len(app.pending()) == 1


def test_schedule_many_async_answers_in_order_with_duplicates(
    app: Scheduler, close_order: JobHandle[[int], str], manual_clock: ManualClock
) -> None:
    now = manual_clock.now_ms()
    receipts = run(
        close_order.schedule_many_async(
            [((1,), {}, "a"), Call((2,), key="b", delay=90), ((3,), {}, "a")], delay=60
        )
    )
    assert [r.status for r in receipts] == [SendStatus.OK, SendStatus.OK, SendStatus.DUPLICATE]
    assert [r.deliver_at_ms for r in receipts] == [now + 60 * S, now + 90 * S, now + 60 * S]
    assert receipts[2].msg_id == receipts[0].msg_id
    assert run(close_order.schedule_many_async([])) == []
    assert [v.key for v in app.pending()] == ["a", "b"]


def test_cancel_async_gives_the_three_answers(
    app: Scheduler, close_order: JobHandle[[int], str], manual_clock: ManualClock
) -> None:
    close_order.schedule(1, delay=60, key="order:1")
    fired = close_order.schedule(2, delay=1, key="order:2")
    with app.broker.consumer("g", sorted(app.topics())) as consumer:
        manual_clock.advance(1 * S)
        assert pull_one(consumer).msg_id == fired.msg_id

        async def cancels() -> list[AbortStatus]:
            return [
                await close_order.cancel_async(key="order:1"),
                await close_order.cancel_async(msg_id=fired.msg_id),
                await close_order.cancel_async(key="order:404"),
                await app.cancel_async(key="order:2"),
            ]

        assert run(cancels()) == [
            AbortStatus.ABORTED,
            AbortStatus.ALREADY_DELIVERED,
            AbortStatus.NOT_FOUND,
            AbortStatus.ALREADY_DELIVERED,  # app.cancel's default topic is the job's here
        ]


def test_get_and_pending_async_see_what_the_sync_forms_see(
    app: Scheduler, close_order: JobHandle[[int], str], manual_clock: ManualClock
) -> None:
    now = manual_clock.now_ms()
    ids = [close_order.schedule(i, delay=10 * (3 - i)).msg_id for i in range(3)]

    async def look() -> tuple[Any, ...]:
        return (
            await close_order.get_async(ids[0]),
            await app.get_async("no-such-id"),
            await app.pending_async(),
            await app.pending_async(close_order.topic, start=now + 15 * S, limit=1),
            await app.pending_async("other-topic"),
        )

    view, unknown, every, bounded, other = run(look())
    assert view == close_order.get(ids[0]) and view.state is MessageState.PENDING
    assert unknown is None
    assert every == app.pending() and [v.msg_id for v in every] == ids[::-1]
    assert [v.msg_id for v in bounded] == [ids[1]]
    assert other == []


def test_the_embedded_app_reuses_its_own_broker_on_threads(app: Scheduler) -> None:
    async def adapter() -> Any:
        return await app.async_broker()

    adapter_of_loop = run(adapter())
    assert isinstance(adapter_of_loop, ThreadedAsyncBroker)
    assert adapter_of_loop.broker is app.broker  # one process, one RocksDB handle


def test_concurrent_first_calls_share_one_adapter_and_all_land(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    async def many() -> tuple[set[int], list[Any]]:
        adapters, receipts = await asyncio.gather(
            asyncio.gather(*(app.async_broker() for _ in range(20))),
            asyncio.gather(
                *(close_order.schedule_async(i, delay=60, key=f"o:{i}") for i in range(200))
            ),
        )
        return {id(a) for a in adapters}, receipts

    adapters, receipts = run(many())
    assert len(adapters) == 1
    assert {r.key for r in receipts} == {f"o:{i}" for i in range(200)}
    assert all(r.status is SendStatus.OK for r in receipts)
    assert app.broker.stats().pending == 200


# -- embedded: bad input, nothing sent ------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"delay": -1}, InvalidSchedule),
        ({"delay": 1, "delay_level": 2}, InvalidSchedule),
        ({"key": "cron:shop.close_order:1"}, InvalidSchedule),
        ({"when": object()}, UnserializableArgument),
    ],
    ids=["negative-delay", "two-timings", "cron-key", "object-argument"],
)
def test_bad_schedule_async_raises_and_sends_nothing(
    app: Scheduler, close_order: JobHandle[[int], str], kwargs: dict[str, Any], error: type
) -> None:
    with pytest.raises(error):
        run(close_order.schedule_async(1, **kwargs))
    timing = {k: v for k, v in kwargs.items() if k in ("delay", "delay_level", "key")}
    job_kwargs = {k: v for k, v in kwargs.items() if k not in timing}
    bad = Call((1,), job_kwargs, **timing)
    with pytest.raises(error):
        run(close_order.schedule_many_async([Call((0,), key="good"), bad]))
    assert nothing_sent(app)


def test_a_coroutine_object_as_an_argument_is_refused_and_sends_nothing(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    async def order_id() -> int:
        return 42

    coro = order_id()  # forgot the await
    try:
        with pytest.raises(UnserializableArgument, match="coroutine object"):
            run(close_order.schedule_async(coro))  # type: ignore[arg-type]
        with pytest.raises(UnserializableArgument, match="coroutine object"):
            close_order.schedule(coro)  # type: ignore[arg-type]
    finally:
        coro.close()
    assert nothing_sent(app)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"key": "k", "msg_id": "m"}],
    ids=["neither", "both"],
)
def test_cancel_async_needs_exactly_a_key_or_an_id(
    app: Scheduler, close_order: JobHandle[[int], str], kwargs: dict[str, str]
) -> None:
    close_order.schedule(1, delay=60, key="k")
    with pytest.raises(InvalidArgument):
        run(close_order.cancel_async(**kwargs))
    with pytest.raises(InvalidArgument):
        run(app.cancel_async(**kwargs))
    with pytest.raises(InvalidArgument):
        run(app.cancel_async(msg_id="m", topic="t"))
    assert [v.key for v in app.pending()] == ["k"]


@pytest.mark.parametrize("limit", [0, -1])
def test_pending_async_limit_below_one_is_invalid(app: Scheduler, limit: int) -> None:
    with pytest.raises(InvalidArgument):
        run(app.pending_async(limit=limit))


# -- embedded: loops and closing ------------------------------------------------------------


def test_each_loop_gets_its_adapter_and_the_loops_end_closes_it(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    async def schedule_and_get_adapter(i: int) -> AsyncAdapterBase:
        await close_order.schedule_async(i, delay=60)
        adapter = await app.async_broker()
        assert isinstance(adapter, AsyncAdapterBase)
        return adapter

    first = run(schedule_and_get_adapter(1))
    second = run(schedule_and_get_adapter(2))
    assert first is not second
    assert first.closed and second.closed  # asyncio.run cancelled the keepers: closed
    assert app.broker.stats().pending == 2  # the app's own broker stays open


def test_aclose_closes_the_app_and_later_calls_raise_broker_closed(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    async def use_then_close() -> AsyncAdapterBase:
        await close_order.schedule_async(1, delay=60)
        adapter = await app.async_broker()
        assert isinstance(adapter, AsyncAdapterBase)
        await app.aclose()
        assert adapter.closed
        with pytest.raises(BrokerClosed):
            await close_order.schedule_async(2)
        with pytest.raises(BrokerClosed):
            await app.pending_async()
        await app.aclose()  # twice is harmless
        return adapter

    run(use_then_close())
    with pytest.raises(BrokerClosed):
        app.broker  # noqa: B018 - the property raises
    with pytest.raises(BrokerClosed):
        run(app.get_async("x"))


def test_close_from_another_thread_closes_a_running_loops_adapter(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    opened = threading.Event()
    box: list[Any] = []

    async def serve() -> None:
        box.append(await app.async_broker())
        opened.set()
        while not box[0].closed:
            await asyncio.sleep(0.01)

    thread = threading.Thread(target=run, args=(serve(),), daemon=True)
    thread.start()
    assert opened.wait(10)
    app.close()  # waits for the loop's keeper to close its adapter
    assert box[0].closed
    thread.join(10)
    assert not thread.is_alive()


def test_sync_close_inside_the_loop_closes_the_adapter_when_the_loop_turns(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    async def close_inside() -> None:
        adapter = await app.async_broker()
        assert isinstance(adapter, AsyncAdapterBase)
        app.close()
        for _ in range(100):
            if adapter.closed:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the adapter was not closed")

    run(close_inside())


# -- the loop rule --------------------------------------------------------------------------


def test_embedded_sync_calls_inside_a_loop_are_allowed(
    app: Scheduler, close_order: JobHandle[[int], str]
) -> None:
    """The embedded broker answers in microseconds: exempt from the loop rule."""

    async def sync_calls_in_a_coroutine() -> AbortStatus:
        receipt = close_order.schedule(1, delay=60, key="order:1")
        assert close_order.get(receipt.msg_id) is not None
        assert len(app.pending()) == 1
        return close_order.cancel(key="order:1")

    assert run(sync_calls_in_a_coroutine()) is AbortStatus.ABORTED


@pytest.fixture(scope="module")
def chronoq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real broker server subprocess for this module's network tests."""
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "data").start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(params=["remote", "redis"])
def network_app(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Scheduler, JobHandle[[int], str]]]:
    """A Scheduler on a network broker: a chronoq server, or the session redis-server."""
    if request.param == "remote":
        url = request.getfixturevalue("chronoq_server").url
        topic = f"t{tmp_path.name}"  # the module's server is shared: a topic per test
    else:
        url = request.getfixturevalue("redis_url")
        topic = "t"
    with Scheduler(url, topic=topic) as scheduler:
        yield scheduler, add_jobs(scheduler)


SYNC_CALLS = {
    "schedule": lambda app, job: job.schedule(1, delay=60, key="k"),
    "schedule_many": lambda app, job: job.schedule_many([((1,), {}, "k")], delay=60),
    "cancel": lambda app, job: job.cancel(key="k"),
    "get": lambda app, job: job.get("x"),
    "app.pending": lambda app, job: app.pending(),
    "app.cancel": lambda app, job: app.cancel(key="k"),
    "app.get": lambda app, job: app.get("x"),
}


@pytest.mark.external_service
@pytest.mark.parametrize("call", list(SYNC_CALLS))
def test_network_sync_calls_inside_a_loop_raise_and_send_nothing(
    network_app: tuple[Scheduler, JobHandle[[int], str]], call: str
) -> None:
    app, job = network_app

    async def sync_call_in_a_coroutine() -> None:
        SYNC_CALLS[call](app, job)

    with pytest.raises(SyncCallInEventLoop, match=r"_async\(") as caught:
        run(sync_call_in_a_coroutine())
    assert caught.value.call.endswith(call.removeprefix("app."))
    assert app.pending(topic=app.settings.topic) == []
    # outside a loop (or on a thread of it) the same call works
    SYNC_CALLS[call](app, job)
    run(asyncio.to_thread(SYNC_CALLS[call], app, job))


@pytest.mark.external_service
def test_network_async_calls_work_end_to_end(
    network_app: tuple[Scheduler, JobHandle[[int], str]],
) -> None:
    app, job = network_app
    topic = app.settings.topic

    async def flow() -> None:
        # chronoq:// and redis:// speak their protocol on the loop: no thread hand-off
        assert not isinstance(await app.async_broker(), ThreadedAsyncBroker)
        receipts = await asyncio.gather(
            *(job.schedule_async(i, delay=60, key=f"order:{i}") for i in range(100))
        )
        assert all(r.status is SendStatus.OK for r in receipts)
        assert len({r.msg_id for r in receipts}) == 100
        again = await job.schedule_async(0, delay=60, key="order:0")
        assert again.duplicate and again.msg_id == receipts[0].msg_id
        many = await job.schedule_many_async(
            [Call((7,), key="order:a"), ((8,), {}, "order:a")], delay=60
        )
        assert [r.status for r in many] == [SendStatus.OK, SendStatus.DUPLICATE]
        view = await job.get_async(receipts[5].msg_id)
        assert view is not None and view.state is MessageState.PENDING and view.key == "order:5"
        pending = await app.pending_async(topic, limit=1000)
        assert {v.key for v in pending} == {f"order:{i}" for i in range(100)} | {"order:a"}
        statuses = await asyncio.gather(
            *(job.cancel_async(key=f"order:{i}") for i in range(50)),
            app.cancel_async(key="order:404"),
        )
        assert statuses == [AbortStatus.ABORTED] * 50 + [AbortStatus.NOT_FOUND]
        assert len(await app.pending_async(topic, limit=1000)) == 51
        await app.aclose()

    run(flow())


def test_a_shared_rocksdb_app_is_local_for_the_loop_rule_and_async_calls_work(
    tmp_path: Path,
) -> None:
    """``rocksdb://`` without a clock opens the shared broker (owner here): exempt, like
    the embedded one, and reached on threads by the async client."""
    with Scheduler(f"rocksdb://{tmp_path / 'data'}") as app:
        job = add_jobs(app)
        assert is_local(app.broker)

        async def both_forms() -> list[AbortStatus]:
            job.schedule(1, delay=60, key="a")
            await job.schedule_async(2, delay=60, key="b")
            assert [v.key for v in await app.pending_async()] == ["a", "b"]
            return [job.cancel(key="b"), await job.cancel_async(key="a")]

        assert run(both_forms()) == [AbortStatus.ABORTED, AbortStatus.ABORTED]
