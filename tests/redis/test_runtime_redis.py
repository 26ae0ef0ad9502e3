"""The runtime calls on Redis beyond the contract suite: a 3-master cluster, races with
the real firer, a 20,000-key prefix abort while other messages fire, the key lex index
through fire and retention, cursors over equal due times, rate limits and semaphores
shared by two clients."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import ManualClock
from broker_adapter.errors import MessageTooLarge, UnknownTopic
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.async_broker import AsyncRedisBroker
from broker_adapter.redis.runtime_calls import FIND_GATHER
from broker_adapter.results import MessageView, RescheduleStatus, SendStatus
from tests.conftest import START_MS
from tests.helpers import eventually, pull_until
from tests.redis_server import RedisClusterProcs, RedisSentinelProcs

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(240)]

T = "t"


def find_all(broker: BrokerAdapter, limit: int = 37, **filters: Any) -> list[MessageView]:
    """Every page of ``find_pending`` with ``filters``, checking each page's size."""
    views: list[MessageView] = []
    cursor = None
    while True:
        page = broker.find_pending(limit=limit, cursor=cursor, **filters)
        assert len(page.messages) <= limit
        views.extend(page.messages)
        cursor = page.cursor
        if cursor is None:
            return views


def in_due_order(views: list[MessageView]) -> bool:
    dues = [v.deliver_at_ms for v in views]
    return dues == sorted(dues)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    procs = RedisClusterProcs(tmp_path_factory.mktemp("runtime-cluster"), masters=3)
    try:
        yield procs.start()
    finally:
        procs.stop()


@pytest.fixture
def cluster_url(cluster: RedisClusterProcs) -> Iterator[str]:
    """The cluster's URL, every master flushed after the test."""
    yield cluster.url
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port)
        try:
            client.flushall()
        finally:
            client.close()


# -- a cluster: every call across 12 shards on 3 masters -------------------------------


def test_cluster_reschedule_find_and_abort_prefix_across_shards(cluster_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(cluster_url, clock=clock) as broker:
        assert broker.keyspace.shards == 12
        consumer = broker.consumer("g", [T])
        msgs = [
            Message(
                T,
                f"b{i}".encode(),
                key=f"user:{i % 3}:{i}",
                tags=f"job{i % 2}",
                deliver_at_ms=START_MS + 1_000 + (i * 7919) % 5_000,
            )
            for i in range(300)
        ]
        sent = broker.send_batch(msgs)
        assert len({r.msg_id.split("-")[0] for r in sent}) == 12  # every shard has some

        everything = find_all(broker, topic=T)
        assert {v.msg_id for v in everything} == {r.msg_id for r in sent}
        assert len(everything) == 300 and in_due_order(everything)
        tagged = find_all(broker, tag="job1", with_body=True)
        assert {v.key for v in tagged} == {m.key for m in msgs if m.tags == "job1"}
        assert all(v.body == b"b" + (v.key or "").split(":")[2].encode() for v in tagged)
        window = find_all(broker, topic=T, start_ms=START_MS + 2_000, end_ms=START_MS + 3_000)
        assert {v.msg_id for v in window} == {
            r.msg_id for r in sent if START_MS + 2_000 <= r.deliver_at_ms < START_MS + 3_000
        }
        assert in_due_order(window)

        # move every user:2: message past all others, by key, with a new body
        late = START_MS + 60_000
        for i in range(2, 300, 3):
            r = broker.reschedule(key=f"user:2:{i}", topic=T, deliver_at_ms=late + i, body=b"L")
            assert (r.status, r.deliver_at_ms) == (RescheduleStatus.RESCHEDULED, late + i)
        order = find_all(broker, topic=T)
        assert in_due_order(order) and len(order) == 300
        assert {v.key for v in order[-100:]} == {f"user:2:{i}" for i in range(2, 300, 3)}
        prefixed = find_all(broker, limit=9, topic=T, key_prefix="user:2:")
        assert [v.deliver_at_ms for v in prefixed] == [late + i for i in range(2, 300, 3)]

        # fire about half of user:0: and user:1:, then abort the whole user:1: prefix
        clock.advance(3_500)
        due_by_now = [
            m.key or ""
            for m in msgs
            if not (m.key or "").startswith("user:2:")
            and (m.deliver_at_ms or 0) <= START_MS + 3_500
        ]
        got = pull_until(consumer, len(due_by_now))
        assert sorted(m.key or "" for m in got) == sorted(due_by_now)
        fired = sorted(k for k in due_by_now if k.startswith("user:1:"))
        result = broker.abort_prefix(T, "user:1:")
        assert result.aborted == 100 - len(fired)
        assert result.already_delivered == tuple(fired)
        assert result.already_delivered_count == len(fired)
        assert find_all(broker, topic=T, key_prefix="user:1:") == []
        assert broker.stats().topics[T].pending == 300 - len(due_by_now) - result.aborted
        with pytest.raises(UnknownTopic):
            broker.find_pending("never-sent")
        with pytest.raises(UnknownTopic):
            broker.abort_prefix("never-sent", "a")


def test_cluster_async_client_runs_the_same_calls(cluster_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(cluster_url, clock=clock) as broker:
        sent = broker.send_batch(
            [Message(T, b"x", key=f"order:{i}:close", delay_ms=10_000 + i) for i in range(60)]
        )

        async def body() -> tuple[Any, ...]:
            client = AsyncRedisBroker.from_url(cluster_url, clock=clock)
            try:
                moved = await client.reschedule(key="order:7:close", topic=T, delay_ms=1)
                page = await client.find_pending(T, key_prefix="order:7:")
                aborted = await client.abort_prefix(T, "order:1")  # 1, 10-19
                rest = await client.find_pending(T, limit=100)
                return moved, page, aborted, rest
            finally:
                await client.close()

        moved, page, aborted, rest = asyncio.run(body())
        assert (moved.status, moved.msg_id) == (RescheduleStatus.RESCHEDULED, sent[7].msg_id)
        assert [v.deliver_at_ms for v in page.messages] == [START_MS + 1]
        assert aborted.aborted == 11
        assert len(rest.messages) == 49 and rest.messages[0].key == "order:7:close"


# -- races with the real firer -----------------------------------------------------------


def test_reschedule_racing_the_real_firer_delivers_each_exactly_once(redis_url: str) -> None:
    rounds, per_round = 25, 20
    with (
        RedisBroker.from_url(redis_url) as firing,
        RedisBroker.from_url(redis_url, fire=False) as client,
    ):
        consumer = firing.consumer("g", [T])
        outcome: dict[str, RescheduleStatus] = {}
        rng = random.Random(7)
        for _ in range(rounds):
            sent = client.send_batch([Message(T, b"old", delay_ms=10) for _ in range(per_round)])
            time.sleep(rng.uniform(0, 0.02))  # straddles the fire time
            for r in sent:
                res = client.reschedule(r.msg_id, delay_ms=rng.randint(0, 15), body=b"new")
                assert res.msg_id == r.msg_id and res.status is not RescheduleStatus.NOT_FOUND
                outcome[r.msg_id] = res.status
        total = rounds * per_round
        got = pull_until(consumer, total, timeout=30, max_messages=256)
        for m in got:
            consumer.ack(m)
        time.sleep(0.2)  # a second delivery would show up by now
        got += consumer.pull(256, wait_ms=100)
    counts = Counter(m.msg_id for m in got)
    assert len(counts) == total and set(counts.values()) == {1}  # never lost, never twice
    for m in got:  # a moved message carries its new body, a delivered one its old
        moved = outcome[m.msg_id] is RescheduleStatus.RESCHEDULED
        assert m.body == (b"new" if moved else b"old")
    tally = Counter(outcome.values())
    assert tally[RescheduleStatus.RESCHEDULED] > 0 and tally[RescheduleStatus.ALREADY_DELIVERED] > 0


def test_abort_prefix_of_20000_keys_while_the_firer_fires_others(redis_url: str) -> None:
    with (
        RedisBroker.from_url(redis_url) as firing,
        RedisBroker.from_url(redis_url, fire=False) as client,
    ):
        consumer = firing.consumer("g", [T])
        for j in range(0, 20_000, 1_000):
            client.send_batch(
                [Message(T, b"b", key=f"bulk:{i}", delay_ms=3_600_000) for i in range(j, j + 1_000)]
            )
        others = client.send_batch(
            [Message(T, b"o", key=f"other:{i}", delay_ms=50 + 10 * i) for i in range(200)]
        )
        result: list[Any] = []
        aborter = threading.Thread(target=lambda: result.append(client.abort_prefix(T, "bulk:")))
        aborter.start()
        got = pull_until(consumer, 200, timeout=30, max_messages=64)
        aborter.join(60)
        assert not aborter.is_alive()
        assert result[0].aborted == 20_000 and result[0].already_delivered_count == 0
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in others)
        assert client.find_pending(T, key_prefix="bulk:").messages == []
        assert client.stats().topics[T].pending == 0
        assert client.abort_prefix(T, "bulk:").aborted == 0


# -- the key lex index -------------------------------------------------------------------


def lex_members(url: str, broker: RedisBroker) -> tuple[set[bytes], set[bytes]]:
    """The members of shard 0's key lex index and its trim queue."""
    client = redis.Redis.from_url(url)
    base = broker.keyspace.bases[0]
    try:
        kx: list[bytes] = client.zrange(base + "kx", 0, -1)  # type: ignore[assignment]
        kt: list[bytes] = client.zrange(base + "kt", 0, -1)  # type: ignore[assignment]
        return set(kx), set(kt)
    finally:
        client.close()


def test_the_key_lex_index_follows_send_abort_fire_and_retention(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    retention = 2_000  # real ms for Redis's TTLs, broker ms for the trim queue
    with RedisBroker.from_url(redis_url, clock=clock, retention_ms=retention) as broker:
        consumer = broker.consumer("g", [T])
        broker.send_batch([Message(T, b"x", key=f"k{i}", delay_ms=1_000) for i in range(4)])
        broker.send(Message(T, b"x", delay_ms=1_000))  # keyless: not indexed
        broker.abort(key="k3", topic=T)
        assert lex_members(redis_url, broker) == ({b"t\0k0", b"t\0k1", b"t\0k2"}, set())

        clock.advance(1_000)
        for m in pull_until(consumer, 4):
            consumer.ack(m)
        kx, kt = lex_members(redis_url, broker)
        assert kx == kt == {b"t\0k0", b"t\0k1", b"t\0k2"}  # fired: kept for retention
        broker.send(Message(T, b"again", key="k1", delay_ms=60_000))  # pending again

        # broker time passes the retention before Redis expires the entries: queued again
        clock.advance(retention)
        eventually(lambda: lex_members(redis_url, broker)[1] == {b"t\0k0", b"t\0k2"})
        assert lex_members(redis_url, broker)[0] == {b"t\0k0", b"t\0k1", b"t\0k2"}
        time.sleep(retention / 1000 + 0.2)  # Redis expires k0 and k2's entries
        clock.advance(retention + 100)
        eventually(lambda: lex_members(redis_url, broker) == ({b"t\0k1"}, set()))
        page = broker.find_pending(T, key_prefix="k")
        assert [v.key for v in page.messages] == ["k1"]
        assert broker.abort_prefix(T, "k").aborted == 1
        assert lex_members(redis_url, broker) == (set(), set())


def test_abort_prefix_drops_stale_index_members(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock, fire=False) as broker:
        broker.send(Message(T, b"x", key="p:1", delay_ms=1_000))
        base = broker.keyspace.bases[0]
        client = redis.Redis.from_url(redis_url)
        try:
            client.zadd(base + "kx", {"t\0p:0": 0})  # an entry whose k: expired unseen
            result = broker.abort_prefix(T, "p:")
            assert (result.aborted, result.already_delivered_count) == (1, 0)
            assert client.zcard(base + "kx") == 0
        finally:
            client.close()


# -- reschedule details -----------------------------------------------------------------


def test_reschedule_keeps_the_duplicate_rule_and_checks_size_with_properties(
    redis_url: str,
) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock, max_body_bytes=100) as broker:
        first = Message(
            T, b"x", key="order:1", deliver_at_ms=START_MS + 5_000, properties={"p": "v" * 40}
        )
        sent = broker.send(first)
        moved = broker.reschedule(key="order:1", topic=T, delay_ms=9_000)
        assert moved.deliver_at_ms == START_MS + 9_000
        again = broker.send(first)  # the occurrence its first send asked for
        assert (again.status, again.msg_id, again.deliver_at_ms) == (
            SendStatus.DUPLICATE,
            sent.msg_id,
            START_MS + 9_000,
        )
        with pytest.raises(MessageTooLarge):  # 60 B of body + the properties > 100
            broker.reschedule(sent.msg_id, delay_ms=1, body=b"y" * 60)
        view = broker.query(sent.msg_id)
        assert view is not None and (view.deliver_at_ms, view.body_size) == (START_MS + 9_000, 1)
        assert broker.reschedule("99-1", delay_ms=1).status is RescheduleStatus.NOT_FOUND
        assert broker.abort(sent.msg_id).msg_id == sent.msg_id
        assert broker.reschedule(key="order:1", topic=T, delay_ms=1).status is (
            RescheduleStatus.NOT_FOUND
        )


# -- find_pending cursors ------------------------------------------------------------------


def test_find_pages_through_equal_due_times_when_the_cursor_message_goes(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock, fire=False) as broker:
        due = START_MS + 5_000
        for j in range(0, 3_000, 1_000):
            broker.send_batch([Message(T, b"x", deliver_at_ms=due) for _ in range(j, j + 1_000)])
        seen: list[str] = []
        gone: set[str] = set()
        cursor = None
        while True:
            page = broker.find_pending(T, limit=100, cursor=cursor)
            seen.extend(v.msg_id for v in page.messages)
            if page.messages:  # the message the cursor names goes before the next page
                gone.add(page.messages[-1].msg_id)
                broker.abort(page.messages[-1].msg_id)
            cursor = page.cursor
            if cursor is None:
                break
    assert len(seen) == len(set(seen)) == 3_000  # none twice, none skipped


def test_find_by_a_prefix_matching_many_keys_walks_the_due_index(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    many = FIND_GATHER + 500
    with RedisBroker.from_url(redis_url, clock=clock, fire=False) as broker:
        broker.send_batch(
            [
                Message(T, b"x", key=f"{'a' if i % 2 else 'b'}:{i}", delay_ms=1_000 + i % 777)
                for i in range(2 * many)
            ]
        )
        found = find_all(broker, limit=200, topic=T, key_prefix="a:")
    assert len(found) == len({v.msg_id for v in found}) == many
    assert in_due_order(found) and all((v.key or "").startswith("a:") for v in found)


# -- rate limits and semaphores --------------------------------------------------------


def test_a_rate_limit_and_a_semaphore_hold_across_two_clients(redis_url: str) -> None:
    with (
        RedisBroker.from_url(redis_url, fire=False) as a,
        RedisBroker.from_url(redis_url, fire=False) as b,
    ):
        # 10 per minute: one permit per 6 s, a burst of 10, shared by both clients
        waits = [(a if i % 2 else b).acquire_rate("api", 10, 60_000) for i in range(16)]
        assert waits[:10] == [0] * 10
        assert all(5_000 < w <= 6_000 for w in waits[10:])
        client = redis.Redis.from_url(redis_url)
        try:
            assert 0 < client.pttl("cq:rl:api") <= 60_001  # an idle bucket vanishes

            assert a.acquire_slot("db", 2, "h1", 60_000)
            assert b.acquire_slot("db", 2, "h2", 60_000)
            assert not a.acquire_slot("db", 2, "h3", 60_000)
            assert b.acquire_slot("db", 2, "h1", 60_000)  # a holder renews its lease
            assert b.release_slot("db", "h1") and not a.release_slot("db", "h1")
            assert a.acquire_slot("db", 2, "h3", 60_000)

            assert a.acquire_slot("short", 1, "x", 150)
            assert not b.acquire_slot("short", 1, "y", 150)
            time.sleep(0.3)  # x's lease ran out: its slot frees itself
            assert not a.release_slot("short", "x")
            assert b.acquire_slot("short", 1, "y", 150)
            eventually(lambda: client.exists("cq:sem:short") == 0, timeout=5)
        finally:
            client.close()


def test_rate_limit_and_semaphore_on_the_cluster(cluster_url: str) -> None:
    with RedisBroker.from_url(cluster_url, fire=False) as broker:
        assert [broker.acquire_rate(f"b{i}", 1, 60_000) for i in range(20)] == [0] * 20
        assert all(broker.acquire_rate(f"b{i}", 1, 60_000) > 0 for i in range(20))
        assert all(broker.acquire_slot(f"s{i}", 1, "h", 60_000) for i in range(20))
        assert not any(broker.acquire_slot(f"s{i}", 1, "g", 60_000) for i in range(20))


# -- Sentinel: what the scripts wrote is on the promoted replica -------------------------


def test_runtime_changes_survive_a_sentinel_failover(tmp_path: Path) -> None:
    sentinel = RedisSentinelProcs(tmp_path / "sentinel").start()
    try:
        clock = ManualClock(START_MS)
        with RedisBroker.from_url(sentinel.url, clock=clock) as broker:
            sent = broker.send_batch(
                [Message(T, b"x", key=f"order:{i}", delay_ms=60_000) for i in range(10)]
            )
            broker.reschedule(key="order:3", topic=T, delay_ms=1_000, body=b"moved")
            assert broker.abort_prefix(T, "order:9").aborted == 1
            assert [broker.acquire_rate("api", 3, 60_000) for _ in range(3)] == [0, 0, 0]
            master = redis.Redis(host="127.0.0.1", port=sentinel.master.port)
            try:
                # the replica has it all
                master.execute_command("WAIT", 1, 5_000)  # type: ignore[no-untyped-call]
            finally:
                master.close()
            sentinel.master.kill()

            def promoted() -> bool:
                try:
                    return broker.find_pending(T, limit=100).cursor is None
                except Exception:  # noqa: BLE001 - ConnectionFailed until the promotion
                    return False

            eventually(promoted, timeout=60, what="a call after the failover")
            views = broker.find_pending(T, limit=100).messages
            assert len(views) == 9 and views[0].key == "order:3"
            assert broker.acquire_rate("api", 3, 60_000) > 0  # the bucket came along
            consumer = broker.consumer("g", [T])
            clock.advance(1_000)
            got = pull_until(consumer, 1)
            assert [(m.msg_id, m.body) for m in got] == [(sent[3].msg_id, b"moved")]
    finally:
        sentinel.stop()
