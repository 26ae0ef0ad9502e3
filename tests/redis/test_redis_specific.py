"""What the contract suite does not see: keyspace layout, wake-ups between
processes, many firers, script cache loss, URL options."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from redis.crc import key_slot

from broker_adapter import open_broker
from broker_adapter.base import DEFAULT_RETENTION_MS
from broker_adapter.clock import ManualClock
from broker_adapter.errors import InvalidArgument
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis import keys as K
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.listener import Listener
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.scripts import Scripts
from broker_adapter.results import AbortStatus, SendResult, SendStatus
from tests.conftest import START_MS
from tests.helpers import eventually, pull_until

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(120)]


@pytest.mark.parametrize("count", [1, 3, 12, 16, 64])
def test_shard_tags_fall_in_their_own_slot_band(count: int) -> None:
    tags = K.shard_tags(count)
    band = 16384 / count
    assert len(set(tags)) == count
    for i, tag in enumerate(tags):
        assert int(i * band) <= key_slot(tag.encode()) < int((i + 1) * band)


@pytest.mark.parametrize("bad", ["", "0", "12-1", "-1-1", "1-01", "1-", "a-1", "1-1x", "ü"])
def test_malformed_ids_do_not_parse(bad: str) -> None:
    assert K.parse_id(bad, 12) is None


def test_every_key_of_a_message_shares_its_shard_slot(redis_url: str) -> None:
    with RedisBroker.from_url(redis_url + "?shards=12", clock=ManualClock(START_MS)) as broker:
        c = broker.consumer("g", ["t"])
        r = broker.send(Message("t", b"x", key="order:1"))
        m = pull_until(c, 1)[0]
        assert c.nack(m, delay_ms=5_000)
        client = redis.Redis.from_url(redis_url)
        try:
            keys = [k.decode() for k in client.scan_iter("cq:*")]
        finally:
            client.close()
        base = broker.keyspace.bases[int(r.msg_id.split("-")[0])]
    mine = [k for k in keys if k.startswith(base)]
    key_entry = base + "k:t\0order:1"
    assert {base + "m:" + r.msg_id.split("-")[1], key_entry, base + "due"} <= set(mine)
    assert {key_slot(k.encode()) for k in mine} == {key_slot((base + "due").encode())}


@pytest.mark.parametrize("shards", [1, 12])
def test_many_firers_fire_each_message_once(redis_url: str, shards: int) -> None:
    clock = ManualClock(START_MS)
    brokers = [RedisBroker.from_url(f"{redis_url}?shards={shards}", clock=clock) for _ in range(3)]
    try:
        consumer = brokers[0].consumer("g", ["t"])
        sent = {
            r.msg_id
            for r in brokers[1].send_batch(
                [Message("t", b"%d" % i, delay_ms=1_000 + i % 7) for i in range(3_000)]
            )
        }
        clock.advance(2_000)  # all three firers wake at once and race on every shard
        got = []
        for _ in range(200):  # ack as we go: a consumer holds at most 1,000 by default
            batch = consumer.pull(max_messages=500, wait_ms=200)
            got.extend(batch)
            for m in batch:
                assert consumer.ack(m)
            if len(got) >= 3_000 and not batch:
                break
        counts = Counter(m.msg_id for m in got)
        assert set(counts) == sent and max(counts.values()) == 1
        assert brokers[2].stats().topics["t"].fired_total == 3_000
    finally:
        for b in brokers:
            b.close()


@dataclass
class FiringParts:
    """A firer run by hand and the listener that feeds it: one firing process's
    parts on the default keyspace, built as ``RedisBroker`` builds them."""

    client: redis.Redis
    clock: ManualClock
    keys: K.Keyspace
    news: ReadyNews
    firer: Firer
    listener: Listener


@pytest.fixture
def firing(redis_url: str) -> Iterator[FiringParts]:
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock(START_MS)
    keys = K.Keyspace.build(K.DEFAULT_PREFIX, K.SINGLE_SHARDS)
    scripts = Scripts(client)
    scripts.load()
    news = ReadyNews(client, keys.ready_channel)
    firer = Firer(
        scripts, client, keys, clock, news, lambda: None, retention_ms=DEFAULT_RETENTION_MS
    )
    listener = Listener(client, keys, firer, news)
    listener.start()
    try:
        yield FiringParts(client, clock, keys, news, firer, listener)
    finally:
        listener.close()
        client.close()


def test_a_send_from_another_process_wakes_the_firer(redis_url: str, firing: FiringParts) -> None:
    assert firing.firer.fire_once() == 0  # nothing due: the firer knows no due time
    assert firing.firer.next_due(0) == float("inf")
    with RedisBroker.from_url(redis_url + "?fire=0", clock=firing.clock) as sender:
        r = sender.send(Message("t", b"x", delay_ms=5_000))
        # the firer hears the new earliest due time on the wake channel
        eventually(
            lambda: firing.firer.next_due(0) == r.deliver_at_ms,
            what="the firer learned the new due time",
        )


def test_fired_messages_expire_after_retention_but_pending_ones_never(redis_url: str) -> None:
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url + "?retention_ms=600000", clock=clock) as broker:
        c = broker.consumer("g", ["t"])
        later = broker.send(Message("t", b"x", delay_ms=60_000))
        now = broker.send(Message("t", b"y"))
        pull_until(c, 1)
        client = redis.Redis.from_url(redis_url)
        try:

            def ttl(msg_id: str, kind: str) -> int:
                shard, n = msg_id.split("-")
                return int(client.pttl(f"{broker.keyspace.bases[int(shard)]}{kind}{n}"))

            def pending(msg_id: str) -> bool:
                shard, n = msg_id.split("-")
                bucket = f"{broker.keyspace.bases[int(shard)]}p:{int(n) // K.PENDING_BUCKET}"
                return bool(client.hexists(bucket, n))

            assert pending(later.msg_id)  # the pending record, in a hash without TTL
            assert client.pttl(f"{broker.keyspace.bases[0]}p:0") == -1
            assert ttl(later.msg_id, "m:") == -2  # no message hash until it fires
            assert 0 < ttl(now.msg_id, "m:") <= 600_000
            assert 0 < ttl(now.msg_id, "b:") <= 600_000
            assert not pending(now.msg_id)
        finally:
            client.close()


def test_lost_script_cache_is_reloaded(redis_url: str) -> None:
    with RedisBroker.from_url(redis_url, clock=ManualClock(START_MS)) as broker:
        client = redis.Redis.from_url(redis_url)
        try:
            client.script_flush()
        finally:
            client.close()
        results = broker.send_batch([Message("t", b"%d" % i) for i in range(30)])
        assert len({r.msg_id for r in results}) == 30
        assert broker.abort(results[0].msg_id).status.name in ("ABORTED", "ALREADY_DELIVERED")


def test_one_instance_has_one_shard_and_a_cluster_twelve_by_default(redis_url: str) -> None:
    with RedisBroker.from_url(redis_url, clock=ManualClock(START_MS)) as broker:
        assert len(broker.keyspace.bases) == K.SINGLE_SHARDS == 1
    assert K.DEFAULT_SHARDS == 12  # the cluster default: see test_cluster


@pytest.mark.parametrize("shards", [0, K.MAX_SHARDS + 1, True, "12"])
def test_shard_counts_outside_one_to_the_maximum_are_refused(shards: object) -> None:
    client = redis.Redis(host="127.0.0.1", port=1)  # refused before any connection
    try:
        with pytest.raises(InvalidArgument, match="shards"):
            RedisBroker(client, shards=shards)  # type: ignore[arg-type]
    finally:
        client.close()


def test_url_options_choose_prefix_and_shards(redis_url: str) -> None:
    broker = open_broker(redis_url + "?prefix=other&shards=4", clock=ManualClock(START_MS))
    try:
        assert isinstance(broker, RedisBroker)
        r = broker.send(Message("t", b"x", delay_ms=1_000))
        assert int(r.msg_id.split("-")[0]) < 4
        client = redis.Redis.from_url(redis_url)
        try:
            names = {k.decode() for k in client.scan_iter("*")}
        finally:
            client.close()
        assert names and all(n.startswith("other:{") for n in names)
    finally:
        broker.close()


def _fire_over_all_shards(
    broker: RedisBroker, clock: ManualClock, messages: list[Message]
) -> list[SendResult]:
    """Send ``messages`` to a 12-shard broker (they must spread over all 12 shards),
    then let the clock pass their due times and wait until all fired."""
    sent = broker.send_batch(messages)
    assert len({r.msg_id.split("-")[0] for r in sent}) == 12
    clock.advance(max(m.delay_ms or 0 for m in messages) + 1)
    eventually(lambda: broker.stats().topics["t"].fired_total == len(messages), what="all fired")
    return sent


def test_claims_past_the_limit_go_back_untouched(redis_url: str) -> None:
    """A pull claims in every shard at once; what it may not hand out (past
    ``max_messages``) goes back to ready without counting as a delivery."""
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url + "?shards=12", clock=clock) as broker:
        c = broker.consumer("g", ["t"])
        sent = _fire_over_all_shards(
            broker, clock, [Message("t", b"%d" % i, delay_ms=i) for i in range(24)]
        )
        got = []
        for _ in range(24):
            one = c.pull(max_messages=1, wait_ms=2_000)
            assert len(one) == 1
            got.extend(one)
            stats = broker.stats().groups["g"]
            assert (stats.inflight, stats.ready) == (len(got), 24 - len(got))
        assert [m.msg_id for m in got] == [r.msg_id for r in sent]  # fire (due) order
        assert {m.attempts for m in got} == {1}


def test_rediss_urls_make_tls_clients() -> None:
    """``rediss://`` is TLS all the way (no connection is made here)."""
    from redis.connection import SSLConnection

    from broker_adapter.redis.connect import open_client

    client, opts = open_client("rediss://127.0.0.1:6380/2?shards=6&ssl_cert_reqs=none")
    try:
        assert client.connection_pool.connection_class is SSLConnection
        assert client.connection_pool.connection_kwargs["db"] == 2
        assert opts == {"shards": 6}
    finally:
        client.close()


def test_ready_news_is_published_only_while_another_process_listens(
    redis_url: str, firing: FiringParts
) -> None:
    firer = firing.firer
    firer.check_listeners()  # a full sweep counts the listeners first
    assert firer.publishing is False  # alone: only its own listener
    with RedisBroker.from_url(redis_url + "?fire=0", clock=firing.clock) as other:
        c = other.consumer("g", ["t"])
        other.send(Message("t", b"x", delay_ms=1_000))
        firer.check_listeners()  # the next sweep hears the second listener
        assert firer.publishing is True
        watch = firing.client.pubsub(ignore_subscribe_messages=True)
        try:
            watch.subscribe(firing.keys.ready_channel)
            firing.clock.advance(1_000)
            assert firer.fire_once() == 1
            news = eventually(lambda: watch.get_message(timeout=0.2), what="ready news")
            assert news["data"] == f"{firing.news.origin}:0".encode()  # told by fire.lua
        finally:
            watch.close()
        assert [m.body for m in c.pull(max_messages=5, wait_ms=5_000)] == [b"x"]
    eventually(lambda: firer.check_listeners() or not firer.publishing, what="alone again: no news")


def test_key_index_entries_expire_after_retention_and_keep_the_duplicate_rule(
    redis_url: str,
) -> None:
    """A key's entry has no TTL while its message is pending, and ``retention_ms`` once
    it fired or was aborted: within it the duplicate rule holds as on every adapter;
    after it the entry is gone, so the index never outgrows pending + retained keys."""
    clock = ManualClock(START_MS)
    client = redis.Redis.from_url(redis_url)
    # retention is Redis TTL (real time): long enough for the checks made within it
    with RedisBroker.from_url(redis_url + "?retention_ms=4000", clock=clock) as broker:
        c = broker.consumer("g", ["t"])
        base = broker.keyspace.bases[0]

        def entry_ttl(key: str) -> int:
            return int(client.pttl(f"{base}k:t\0{key}"))

        due = START_MS + 1_000
        fired = broker.send(Message("t", b"a", key="fire", deliver_at_ms=due))
        aborted = broker.send(Message("t", b"b", key="abort", deliver_at_ms=due))
        assert (
            broker.send(Message("t", b"a2", key="fire", deliver_at_ms=due + 5)).status
            is SendStatus.DUPLICATE
        )  # pending: any due time
        assert entry_ttl("fire") == -1 and entry_ttl("abort") == -1
        assert broker.abort(key="abort", topic="t").status is AbortStatus.ABORTED
        clock.advance(1_000)
        assert [m.msg_id for m in pull_until(c, 1)] == [fired.msg_id]
        assert 0 < entry_ttl("fire") <= 4_000 and 0 < entry_ttl("abort") <= 4_000
        # fired, same asked ms: a duplicate; aborted: not
        again = broker.send(Message("t", b"a3", key="fire", deliver_at_ms=due))
        assert (again.status, again.msg_id) == (SendStatus.DUPLICATE, fired.msg_id)
        assert broker.abort(key="abort", topic="t").status is AbortStatus.ABORTED
        # after retention every entry is gone; the index holds nothing for these keys
        eventually(
            lambda: entry_ttl("fire") == -2 and entry_ttl("abort") == -2,
            timeout=30,
            what="key entries expired",
        )
        assert not list(client.scan_iter(f"{base}k:*"))
        # due later than now, so the firer cannot fire it (and set a TTL) before we look
        reborn = broker.send(Message("t", b"a4", key="fire", deliver_at_ms=due + 60_000))
        assert reborn.status is SendStatus.OK and reborn.msg_id != fired.msg_id
        assert entry_ttl("fire") == -1  # pending again: no TTL
        assert aborted.status is SendStatus.OK
    client.close()


def test_pending_records_across_hash_buckets(redis_url: str) -> None:
    """Pending records share a hash per 1,024 message numbers; a batch, an abort, a
    query, pending() and the fire all find them across bucket edges."""
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url, clock=clock) as broker:
        c = broker.consumer("g", ["t"])
        sent = broker.send_batch(
            [Message("t", b"%d" % i, delay_ms=1_000 + i % 50) for i in range(2_100)]
        )
        numbers = {int(r.msg_id.split("-")[1]): r.msg_id for r in sent}
        assert min(numbers) == 1 and max(numbers) == 2_100  # buckets 0, 1 and 2
        edges = [numbers[n] for n in (1_023, 1_024, 1_025, 2_047, 2_048)]
        for msg_id in edges:
            view = broker.query(msg_id)
            assert view is not None and view.state.name == "PENDING"
            assert broker.abort(msg_id).status is AbortStatus.ABORTED
            view = broker.query(msg_id)
            assert view is not None and view.state.name == "ABORTED"
        assert len(broker.pending("t", limit=5_000)) == 2_100 - len(edges)
        clock.advance(1_050)
        got = []
        for _ in range(100):
            batch = c.pull(max_messages=500, wait_ms=500)
            got.extend(batch)
            for m in batch:
                assert c.ack(m)
            if len(got) >= 2_100 - len(edges) and not batch:
                break
        assert {m.msg_id for m in got} == set(numbers.values()) - set(edges)
        assert broker.pending("t") == []


def test_a_backlog_over_many_shards_comes_in_fire_order_within_the_byte_limit(
    redis_url: str,
) -> None:
    """Backlog mode plans a pull from the ready scores of every shard; the byte limit
    is applied to what the claim returns, and what goes back is not a delivery."""
    clock = ManualClock(START_MS)
    with RedisBroker.from_url(redis_url + "?shards=12", clock=clock) as broker:
        c = broker.consumer("g", ["t"], max_inflight_bytes=1_000)
        sent = _fire_over_all_shards(
            broker, clock, [Message("t", b"x" * 100, delay_ms=1 + i) for i in range(120)]
        )
        got = []
        for _ in range(60):
            batch = c.pull(max_messages=100, wait_ms=2_000)
            assert sum(len(m.body) for m in batch) <= 1_000
            got.extend(batch)
            for m in batch:
                assert c.ack(m)
            if len(got) == 120:
                break
        assert [m.msg_id for m in got] == [r.msg_id for r in sent]  # fire (due) order
        assert {m.attempts for m in got} == {1}
