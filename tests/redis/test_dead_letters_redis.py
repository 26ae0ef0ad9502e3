"""Dead letters and pending counts on Redis beyond the contract suite: five shards on
one instance, so every page is a merge of five shards' ``dead.lua`` answers and
"the oldest" is worked through shard after shard; the async client on the same data;
and the topic-share estimate of ``count_pending``."""

from __future__ import annotations

import asyncio

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.async_broker import AsyncRedisBroker
from broker_adapter.results import MessageState, MessageView
from tests.conftest import START_MS
from tests.helpers import pull_one, pull_until
from tests.redis_server import RedisClusterProcs

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(120)]

T = "t"
G = "g"


def _all_dead(broker: RedisBroker, limit: int) -> list[MessageView]:
    out: list[MessageView] = []
    cursor = None
    while True:
        page = broker.dead_letters(G, cursor=cursor, limit=limit)
        assert len(page.messages) <= limit
        out.extend(page.messages)
        cursor = page.cursor
        if cursor is None:
            return out


def test_five_shards_page_requeue_and_purge(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock, shards=5) as broker:
        consumer = broker.consumer(G, [T])
        killed = []
        for i in range(40):
            sent = broker.send(Message(T, b"x", key=f"order:{i}"))
            got = pull_one(consumer)
            assert got.msg_id == sent.msg_id and consumer.dead_letter(got, f"r{i}")
            killed.append(sent.msg_id)
            clock.advance(3 if i % 4 else 0)  # some deaths share a millisecond
        assert len({k.split("-")[0] for k in killed}) == 5  # every shard holds some

        listed = _all_dead(broker, 7)
        assert sorted(v.msg_id for v in listed) == sorted(killed)
        deaths = [v.deliver_at_ms for v in listed]
        assert deaths == sorted(deaths)
        assert {v.msg_id: v.error for v in listed} == {k: f"r{i}" for i, k in enumerate(killed)}
        assert broker.stats().groups[G].dead == 40

        assert broker.purge_dead(G, killed[:5]) == 5
        answers = []
        while (n := broker.requeue_dead(G, limit=8)) > 0:
            answers.append(n)
        assert sum(answers) == 35 and max(answers) <= 8
        back = pull_until(consumer, 35)
        assert sorted(m.msg_id for m in back) == sorted(killed[5:])
        assert {m.attempts for m in back} == {1}
        assert broker.stats().groups[G].dead == 0
        view = broker.query(killed[0])
        assert view is not None and view.groups[G] is MessageState.DONE

        async def from_async() -> list[int]:
            async with AsyncRedisBroker.from_url(redis_url, clock=clock, shards=5) as client:
                return (await client.count_pending([clock.now_ms(), clock.now_ms() + 1])).counts

        broker.send(Message(T, b"later", delay_ms=0 + 500))
        assert asyncio.run(from_async()) == [0]
        assert broker.count_pending([clock.now_ms(), clock.now_ms() + 1_000]).counts == [1]


def test_count_by_topic_is_exact_alone_and_an_estimate_among_others(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock) as broker:
        edges = [START_MS, START_MS + 1_000, START_MS + 10_000]
        broker.send_batch([Message(T, b"x", delay_ms=d) for d in (10, 20, 5_000)])
        alone = broker.count_pending(edges, topic=T)
        assert (alone.counts, alone.exact) == ([2, 1], True)
        broker.send_batch([Message("u", b"x", delay_ms=d) for d in (30, 6_000, 7_000)])
        mixed = broker.count_pending(edges, topic=T)
        assert not mixed.exact
        assert mixed.counts == [2, 2]  # half of each bucket's 4 and 3 (rounded)
        assert broker.count_pending(edges).counts == [3, 3]


def test_requeue_all_reaches_past_the_first_window_of_the_log(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock) as broker:
        consumer = broker.consumer(G, [T], max_inflight=1_000)
        sent = broker.send_batch([Message(T, b"x") for _ in range(300)])
        got = pull_until(consumer, 300, max_messages=100)
        assert len(got) == 300
        for m in got:
            assert consumer.dead_letter(m, "x")
        answers = []
        while (n := broker.requeue_dead(G, limit=20)) > 0:  # 4 x 20 + 100 < 300
            answers.append(n)
        assert sum(answers) == 300 and len(answers) == 15
        back = pull_until(consumer, 300, max_messages=100)
        assert sorted(m.msg_id for m in back) == sorted(r.msg_id for r in sent)


def test_on_a_cluster_each_script_stays_in_its_shards_slot(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    procs = RedisClusterProcs(tmp_path_factory.mktemp("dead-cluster"), masters=3).start()
    try:
        clock = ManualClock(START_MS)
        with RedisBroker.from_url(procs.url, clock=clock) as broker:
            assert broker.keyspace.shards == 12
            consumer = broker.consumer(G, [T], max_inflight=1_000)
            sent = broker.send_batch([Message(T, b"x", key=f"k{i}") for i in range(60)])
            assert len({r.msg_id.split("-")[0] for r in sent}) == 12
            for m in pull_until(consumer, 60, max_messages=60):
                assert consumer.dead_letter(m, "x")
            listed = _all_dead(broker, 9)
            assert sorted(v.msg_id for v in listed) == sorted(r.msg_id for r in sent)
            assert broker.purge_dead(G, [r.msg_id for r in sent[:12]]) == 12
            assert broker.requeue_dead(G, limit=1_000) == 48
            assert len(pull_until(consumer, 48, max_messages=48)) == 48
            edges = [START_MS, START_MS + 1_000]
            broker.send_batch([Message(T, b"x", delay_ms=500) for _ in range(30)])
            assert broker.count_pending(edges).counts == [30]
    finally:
        procs.stop()
