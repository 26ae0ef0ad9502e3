"""AsyncRedisBroker against a real redis-server: every call and its answers, and
interop with the sync RedisBroker both ways (same scripts, keys and arguments), on
one instance, a Cluster and through Sentinel; a Redis that stops answering or
restarts; a closed adapter; an event loop that keeps running meanwhile."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from broker_adapter import open_async_broker
from broker_adapter.clock import ManualClock
from broker_adapter.errors import BrokerClosed, ConnectionFailed, InvalidArgument, InvalidDelay
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.async_broker import AsyncRedisBroker
from broker_adapter.redis.client_calls import KEYLESS_SLICE_MS
from broker_adapter.redis.connect import open_client
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.scripts import Scripts
from broker_adapter.redis.send_coalescer import MAX_WRITES
from broker_adapter.results import AbortStatus, MessageState, SendStatus
from tests.conftest import START_MS
from tests.helpers import assert_nothing, pull_one, pull_until
from tests.redis_server import RedisClusterProcs, RedisSentinelProcs, RedisServer

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(180)]

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run one test coroutine on a fresh event loop (each adapter belongs to one loop)."""

    async def wrapped() -> T:
        return await main()

    return asyncio.run(wrapped())


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_MS)


@pytest.fixture
def sync_broker(redis_url: str, clock: ManualClock) -> Iterator[RedisBroker]:
    """The sync broker on the same Redis and clock: it fires and delivers."""
    broker = RedisBroker.from_url(redis_url, clock=clock)
    try:
        yield broker
    finally:
        broker.close()


# -- every call and its answers ------------------------------------------------------------


def test_open_async_broker_gives_the_native_adapter_for_every_redis_scheme() -> None:
    urls = [
        "redis://127.0.0.1:1/0",
        "rediss://127.0.0.1:1/0",
        "redis+cluster://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/svc",
    ]
    for url in urls:
        broker = open_async_broker(url + "?prefix=p&shards=3&fire=0&fire_chunk=9")
        assert isinstance(broker, AsyncRedisBroker), url  # nothing connects yet
        assert broker.keyspace.prefix == "p" and broker.keyspace.shards == 3
        run(broker.close)
    with pytest.raises(InvalidArgument):
        open_async_broker("redis://127.0.0.1:1/0?shards=x")


def test_send_query_pending_stats_answer_as_the_sync_broker_does(
    redis_url: str, clock: ManualClock, sync_broker: RedisBroker
) -> None:
    message = Message(
        "orders", b"close 7", key="order:7", tags="t1", properties={"a": "b"}, delay_ms=5_000
    )

    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            sent = await broker.send(message)
            assert sent.status is SendStatus.OK and sent.deliver_at_ms == START_MS + 5_000
            view = await broker.query(sent.msg_id)
            assert view is not None
            assert (view.state, view.topic, view.key, view.tags, view.body_size) == (
                MessageState.PENDING,
                "orders",
                "order:7",
                "t1",
                7,
            )
            assert view.born_ms == START_MS
            assert await broker.pending() == [view]
            assert await broker.pending(topic="other") == []
            assert await broker.pending(end_ms=START_MS + 5_000) == []  # end is exclusive
            stats = await broker.stats()
            assert stats.topics["orders"].pending == 1
            assert await broker.query("0-999") is None
            assert await broker.query("not an id") is None
            # the sync broker reads the very same records
            assert sync_broker.query(sent.msg_id) == view
            assert sync_broker.pending() == [view]
            assert sync_broker.stats() == stats

    run(main)


def test_send_batch_answers_in_input_order_with_keyed_duplicates(
    redis_url: str, clock: ManualClock
) -> None:
    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            results = await broker.send_batch(
                [
                    Message("t", b"a", key="k", delay_ms=1_000),
                    Message("t", b"b", delay_ms=2_000),
                    Message("t", b"c", key="k", delay_ms=3_000),  # the first's duplicate
                    Message("u", b"d", key="k", delay_ms=4_000),  # another topic: its own
                ]
            )
            statuses = [r.status for r in results]
            assert statuses == [SendStatus.OK, SendStatus.OK, SendStatus.DUPLICATE, SendStatus.OK]
            assert results[2].msg_id == results[0].msg_id
            assert results[2].deliver_at_ms == START_MS + 1_000  # the first's due time
            assert len({results[0].msg_id, results[1].msg_id, results[3].msg_id}) == 3
            assert [v.msg_id for v in await broker.pending()] == [
                results[0].msg_id,
                results[1].msg_id,
                results[3].msg_id,
            ]
            assert await broker.send_batch([]) == []

    run(main)


def test_abort_by_id_and_by_key_gives_each_of_the_three_outcomes(
    redis_url: str, clock: ManualClock, sync_broker: RedisBroker
) -> None:
    consumer = sync_broker.consumer("g", ["t"])

    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            by_id = await broker.send(Message("t", b"1", delay_ms=10_000))
            by_key = await broker.send(Message("t", b"2", key="k", delay_ms=10_000))
            fired = await broker.send(Message("t", b"3", key="f", delay_ms=1_000))
            clock.advance(1_000)
            await asyncio.to_thread(pull_one, consumer)  # "f" fired and was delivered

            aborted = await broker.abort(by_id.msg_id)
            assert (aborted.status, aborted.msg_id) == (AbortStatus.ABORTED, by_id.msg_id)
            aborted = await broker.abort(key="k", topic="t")
            assert (aborted.status, aborted.msg_id) == (AbortStatus.ABORTED, by_key.msg_id)
            again = await broker.abort(by_id.msg_id)
            assert again.status is AbortStatus.ABORTED  # aborting twice changes nothing
            late = await broker.abort(key="f", topic="t")
            assert (late.status, late.msg_id) == (AbortStatus.ALREADY_DELIVERED, fired.msg_id)
            assert (await broker.abort(fired.msg_id)).status is AbortStatus.ALREADY_DELIVERED
            assert (await broker.abort(key="nope", topic="t")).status is AbortStatus.NOT_FOUND
            assert (await broker.abort("0-999")).status is AbortStatus.NOT_FOUND
            assert (await broker.abort("garbage")).status is AbortStatus.NOT_FOUND
            view = await broker.query(by_key.msg_id)
            assert view is not None and view.state is MessageState.ABORTED
            assert await broker.pending() == []
            with pytest.raises(InvalidArgument):
                await broker.abort()

    run(main)
    clock.advance(10_000)
    assert_nothing(consumer)  # the aborted ones never fire


# -- interop with the sync broker ------------------------------------------------------------


def test_an_async_send_is_delivered_by_a_sync_consumer_at_its_due_time(
    redis_url: str, clock: ManualClock, sync_broker: RedisBroker
) -> None:
    consumer = sync_broker.consumer("g", ["t"])
    message = Message("t", b"hello", key="k1", tags="x", properties={"p": "q"}, delay_ms=5_000)

    async def main() -> str:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            return (await broker.send(message)).msg_id

    msg_id = run(main)
    clock.advance(4_999)
    assert_nothing(consumer)
    clock.advance(1)
    got = pull_one(consumer)
    assert (got.msg_id, got.topic, got.body, got.key, got.tags, dict(got.properties)) == (
        msg_id,
        "t",
        b"hello",
        "k1",
        "x",
        {"p": "q"},
    )
    assert (got.deliver_at_ms, got.born_ms, got.attempts) == (START_MS + 5_000, START_MS, 1)
    assert consumer.ack(got)


def test_an_async_send_that_makes_the_head_earlier_wakes_the_firers(redis_url: str) -> None:
    # Given: a listener on the wake channel, as every firing process has
    listener = redis.Redis.from_url(redis_url)
    pubsub = listener.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(Keyspace.build("cq", 1).wake_channel)
    subscribed = pubsub.get_message(timeout=5)
    assert subscribed is not None and subscribed["type"] == "subscribe"
    clock = ManualClock(START_MS)

    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            await broker.send(Message("t", b"late", delay_ms=9_000))
            await broker.send(Message("t", b"later", delay_ms=10_000))  # head unchanged
            await broker.send(Message("t", b"early", delay_ms=1_000))

    try:
        run(main)
        heard = [pubsub.get_message(timeout=5) for _ in range(2)]
        assert [m["data"] for m in heard if m] == [
            f"0:{START_MS + 9_000}".encode(),
            f"0:{START_MS + 1_000}".encode(),
        ]
        assert pubsub.get_message(timeout=0.2) is None  # the later one woke nobody
    finally:
        pubsub.close()
        listener.close()


def test_a_sync_send_is_queried_and_aborted_by_the_async_client(
    redis_url: str, clock: ManualClock, sync_broker: RedisBroker
) -> None:
    first = sync_broker.send(Message("t", b"s1", key="order:1", delay_ms=3_000))
    second = sync_broker.send(Message("t", b"s2", delay_ms=3_000))

    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            view = await broker.query(first.msg_id)
            assert view == sync_broker.query(first.msg_id)
            assert view is not None and view.key == "order:1"
            assert (await broker.abort(key="order:1", topic="t")).msg_id == first.msg_id
            assert (await broker.abort(second.msg_id)).status is AbortStatus.ABORTED

    run(main)
    state = sync_broker.query(first.msg_id)
    assert state is not None and state.state is MessageState.ABORTED
    assert sync_broker.pending() == []


def test_keyed_duplicates_hold_across_the_two_clients(
    redis_url: str, clock: ManualClock, sync_broker: RedisBroker
) -> None:
    from_sync = sync_broker.send(Message("t", b"sync", key="a", delay_ms=2_000))

    async def main() -> str:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:
            dup = await broker.send(Message("t", b"async", key="a", delay_ms=7_000))
            assert (dup.status, dup.msg_id, dup.deliver_at_ms) == (
                SendStatus.DUPLICATE,
                from_sync.msg_id,
                from_sync.deliver_at_ms,
            )
            first = await broker.send(Message("t", b"async", key="b", delay_ms=2_000))
            assert first.status is SendStatus.OK
            return first.msg_id

    from_async = run(main)
    again = sync_broker.send(Message("t", b"sync", key="b", delay_ms=9_000))
    assert (again.status, again.msg_id) == (SendStatus.DUPLICATE, from_async)
    assert len(sync_broker.pending()) == 2


def test_a_thousand_concurrent_coroutines_are_all_answered_right(
    redis_url: str, clock: ManualClock, sync_broker: RedisBroker
) -> None:
    consumer = sync_broker.consumer("g", ["t"], max_inflight=2_000)

    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, clock=clock) as broker:

            async def one(i: int) -> tuple[int, str, SendStatus, int]:
                # 500 keys, each sent twice with different due times; 200 keyless
                key = f"k{i % 500}" if i < 1_000 else None
                r = await broker.send(Message("t", b"%d" % i, key=key, delay_ms=1_000 + i))
                return i, r.msg_id, r.status, r.deliver_at_ms

            answers = await asyncio.gather(*(one(i) for i in range(1_200)))
            ok = [a for a in answers if a[2] is SendStatus.OK]
            assert len(ok) == 700 and len({a[1] for a in ok}) == 700
            owner = {f"k{a[0] % 500}": a for a in ok if a[0] < 1_000}
            assert len(owner) == 500
            for i, msg_id, status, due in answers:
                assert due == START_MS + 1_000 + i or status is SendStatus.DUPLICATE
                if status is SendStatus.DUPLICATE:
                    first = owner[f"k{i % 500}"]
                    assert (msg_id, due) == (first[1], first[3])
            assert (await broker.stats()).topics["t"].pending == 700
            views = {v.msg_id: v for v in await broker.pending(limit=1_000)}
            assert {v.key for v in views.values()} == {*owner, None}
            for key, (_i, msg_id, _s, _due) in owner.items():
                assert views[msg_id].key == key

    run(main)
    clock.advance(3_000)
    got = pull_until(consumer, 700, timeout=30, max_messages=500)
    assert len({m.msg_id for m in got}) == 700


def test_a_bad_message_among_concurrent_sends_fails_alone(redis_url: str) -> None:
    async def main() -> None:
        async with AsyncRedisBroker.from_url(redis_url, max_delay_ms=10_000) as broker:
            sends = [broker.send(Message("t", b"ok", delay_ms=1_000)) for _ in range(20)]
            sends.insert(7, broker.send(Message("t", b"far", delay_ms=60_000)))
            results = await asyncio.gather(*sends, return_exceptions=True)
            assert isinstance(results.pop(7), InvalidDelay)
            assert all(
                not isinstance(r, BaseException) and r.status is SendStatus.OK for r in results
            )
            assert (await broker.stats()).topics["t"].pending == 20

    run(main)


# -- closing, a Redis that stops answering, a restart -------------------------------------


def test_a_closed_adapter_raises_broker_closed_and_answers_sends_made_before(
    redis_url: str,
) -> None:
    async def main() -> None:
        broker = AsyncRedisBroker.from_url(redis_url)
        queued = [
            asyncio.ensure_future(broker.send(Message("t", delay_ms=1_000))) for _ in range(50)
        ]
        await asyncio.sleep(0)  # the sends are queued, not yet answered
        await broker.close()
        assert all(f.result().status is SendStatus.OK for f in queued)
        assert broker.closed
        await broker.close()  # twice is harmless
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: broker.send(Message("t")),
            lambda: broker.send_batch([Message("t")]),
            lambda: broker.abort("0-1"),
            lambda: broker.query("0-1"),
            lambda: broker.pending(),
            lambda: broker.stats(),
        ]
        for call in calls:
            with pytest.raises(BrokerClosed):
                await call()

    run(main)
    assert redis.Redis.from_url(redis_url).zcard("cq:{s0.0}:due") == 50


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone (it gets stopped, killed and restarted)."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()


def test_the_loop_keeps_running_while_redis_does_not_answer(own_server: RedisServer) -> None:
    assert own_server.proc is not None

    async def main() -> None:
        async with AsyncRedisBroker.from_url(own_server.url) as broker:
            await broker.send(Message("t", delay_ms=1_000))  # connected, scripts known
            own_server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            try:
                sending = asyncio.ensure_future(broker.send(Message("t", delay_ms=1_000)))
                querying = asyncio.ensure_future(broker.query("0-1"))
                ticks = 0
                for _ in range(50):  # a blocking client would hold the loop here
                    await asyncio.sleep(0.001)
                    ticks += 1
                assert ticks == 50 and not sending.done() and not querying.done()
            finally:
                own_server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            assert (await sending).status is SendStatus.OK
            assert await querying is not None

    run(main)


def test_a_send_cancelled_while_queued_behind_busy_writes_is_not_stored(
    own_server: RedisServer,
) -> None:
    assert own_server.proc is not None

    async def main() -> None:
        async with AsyncRedisBroker.from_url(own_server.url) as broker:
            await broker.send(Message("t", b"warm", delay_ms=1_000))
            own_server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            try:
                busy = []
                for i in range(MAX_WRITES):  # each write takes what is queued, then waits
                    busy.append(asyncio.ensure_future(broker.send(Message("t", b"%d" % i))))
                    for _ in range(3):
                        await asyncio.sleep(0)
                queued = asyncio.ensure_future(broker.send(Message("t", b"cancelled")))
                await asyncio.sleep(0.01)
                queued.cancel()
            finally:
                own_server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            assert all(r.status is SendStatus.OK for r in await asyncio.gather(*busy))
            with pytest.raises(asyncio.CancelledError):
                await queued
            pending = await broker.pending()
            assert len(pending) == 1 + MAX_WRITES
            assert {v.body_size for v in pending} == {1, 4}  # "0".."3" and "warm"

    run(main)


def test_a_redis_restart_fails_the_call_in_flight_then_the_adapter_recovers(
    own_server: RedisServer, tmp_path: Path
) -> None:
    assert own_server.proc is not None
    again = RedisServer(tmp_path / "again", port=own_server.port)

    async def main() -> None:
        async with AsyncRedisBroker.from_url(own_server.url) as broker:
            before = await broker.send(Message("t", key="k", delay_ms=1_000))
            own_server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            in_flight = asyncio.ensure_future(broker.send(Message("t", b"x", delay_ms=1_000)))
            await asyncio.sleep(0.05)  # sent, waiting for the reply
            assert not in_flight.done()
            own_server.kill()  # the reply never comes
            with pytest.raises(ConnectionFailed):
                await in_flight
            with pytest.raises(ConnectionFailed):
                await broker.query(before.msg_id)
            # Redis comes back empty on the same port: no scripts, no data
            await asyncio.to_thread(again.start)
            after = await broker.send(Message("t", key="k", delay_ms=1_000))
            assert after.status is SendStatus.OK
            assert (await broker.abort(key="k", topic="t")).status is AbortStatus.ABORTED

    try:
        run(main)
    finally:
        again.stop()


# -- Redis Cluster and Sentinel ----------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterProcs]:
    procs = RedisClusterProcs(tmp_path / "cluster", masters=3)
    try:
        yield procs.start()
    finally:
        procs.stop()


def test_on_a_cluster_async_sends_spread_over_the_shards_and_a_sync_consumer_gets_them(
    cluster: RedisClusterProcs,
) -> None:
    clock = ManualClock(START_MS)
    sync_broker = RedisBroker.from_url(cluster.url, clock=clock)
    consumer = sync_broker.consumer("g", ["t"], max_inflight=500)

    async def main() -> list[str]:
        async with AsyncRedisBroker.from_url(cluster.url, clock=clock) as broker:
            assert broker.keyspace == sync_broker.keyspace  # 12 shards on a cluster
            batch = await broker.send_batch(
                [Message("t", b"%d" % i, delay_ms=1_000) for i in range(120)]
            )
            singles = await asyncio.gather(
                *(broker.send(Message("t", b"k", key=f"k{i}", delay_ms=1_000)) for i in range(60))
            )
            ids = [r.msg_id for r in [*batch, *singles]]
            assert len(set(ids)) == 180
            assert {i.split("-")[0] for i in ids} == {str(s) for s in range(12)}
            dup = await broker.send(Message("t", key="k3", delay_ms=5_000))
            assert (dup.status, dup.msg_id) == (SendStatus.DUPLICATE, singles[3].msg_id)
            assert (await broker.stats()).topics["t"].pending == 180
            assert len(await broker.pending(limit=500)) == 180
            view = await broker.query(singles[5].msg_id)
            assert view is not None and view.key == "k5"
            aborted = await broker.abort(key="k5", topic="t")
            assert (aborted.status, aborted.msg_id) == (AbortStatus.ABORTED, singles[5].msg_id)
            assert (await broker.abort(batch[0].msg_id)).status is AbortStatus.ABORTED
            return ids

    try:
        ids = run(main)
        clock.advance(1_000)
        got = pull_until(consumer, 178, timeout=30, max_messages=200)
        assert sorted(m.msg_id for m in got) == sorted(set(ids) - {ids[0], ids[125]})
        again = sync_broker.send(Message("t", key="k7", deliver_at_ms=START_MS + 1_000))
        assert again.status is SendStatus.DUPLICATE  # fired, asked for the same due ms
    finally:
        sync_broker.close()


def test_on_a_cluster_async_and_sync_clients_put_a_due_slice_on_the_same_shard(
    cluster: RedisClusterProcs,
) -> None:
    # Given: keyless messages due in 9 slices in a row, sent by both clients
    clock = ManualClock(START_MS)
    sync_broker = RedisBroker.from_url(cluster.url, clock=clock, fire=False)
    slice0 = START_MS // KEYLESS_SLICE_MS + 100
    dues = [(slice0 + k) * KEYLESS_SLICE_MS + i for k in range(9) for i in range(3)]

    async def main() -> list[str]:
        async with AsyncRedisBroker.from_url(cluster.url, clock=clock) as broker:
            sent = await broker.send_batch([Message("t", deliver_at_ms=d) for d in dues])
            return [r.msg_id for r in sent]

    try:
        mine = run(main)
        theirs = [
            r.msg_id for r in sync_broker.send_batch([Message("t", deliver_at_ms=d) for d in dues])
        ]
        # Then: a slice lies on one shard whichever client sent it, and the slices
        # take the masters in turn (before, the async client spread each batch evenly)
        shard = [int(i.split("-")[0]) for i in mine]
        assert shard == [int(i.split("-")[0]) for i in theirs]
        client, _opts = open_client(cluster.url)
        try:
            masters = Scripts(client).by_node(sync_broker.keyspace.due_keys)
        finally:
            client.close()
        master_of = {s: m for m, g in enumerate(masters) for s in g}
        for k in range(9):
            assert len(set(shard[3 * k : 3 * k + 3])) == 1
        assert len({master_of[shard[3 * k]] for k in range(3)}) == 3
    finally:
        sync_broker.close()


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[RedisSentinelProcs]:
    procs = RedisSentinelProcs(tmp_path / "sentinel")
    try:
        yield procs.start()
    finally:
        procs.stop()


def test_through_sentinel_the_async_client_reaches_the_master_and_follows_a_failover(
    sentinel: RedisSentinelProcs,
) -> None:
    clock = ManualClock(START_MS)
    url = sentinel.url + "?retention_ms=600000"
    sync_broker = RedisBroker.from_url(url, clock=clock)
    consumer = sync_broker.consumer("g", ["t"])

    async def main() -> None:
        async with open_async_broker(url, clock=clock) as broker:
            assert isinstance(broker, AsyncRedisBroker)
            first = await broker.send(Message("t", b"before", key="a", delay_ms=1_000))
            assert sync_broker.query(first.msg_id) == await broker.query(first.msg_id)
            master = redis.Redis(host="127.0.0.1", port=sentinel.master.port)
            try:
                master.execute_command("WAIT", 1, 5_000)  # type: ignore[no-untyped-call]
            finally:
                master.close()
            # When: the master dies; the sentinel promotes the replica
            await asyncio.to_thread(sentinel.master.kill)
            for _ in range(600):
                try:
                    after = await broker.send(Message("t", b"after", delay_ms=1_000))
                    break
                except ConnectionFailed:  # until the promotion
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("no send succeeded after the failover")
            assert after.status is SendStatus.OK
            dup = await broker.send(Message("t", key="a", delay_ms=1_000))
            assert (dup.status, dup.msg_id) == (SendStatus.DUPLICATE, first.msg_id)

    try:
        run(main)
        clock.advance(1_000)
        got = pull_until(consumer, 2, timeout=30)
        assert sorted(m.body for m in got) == [b"after", b"before"]
    finally:
        sync_broker.close()
