"""A 3-master Redis Cluster on loopback ports: a subset of the conformance suite
passes on it unchanged, and messages spread evenly over the masters."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker_adapter.base import DEFAULT_RETENTION_MS
from broker_adapter.clock import ManualClock
from broker_adapter.errors import ConnectionFailed, InvalidArgument
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis import keys as K
from broker_adapter.redis.client_calls import KEYLESS_SLICE_MS
from broker_adapter.redis.connect import open_client
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.scripts import Scripts
from tests.conformance import test_broker_contract as contract
from tests.conformance.conftest import Harness
from tests.conftest import START_MS
from tests.helpers import pull_until
from tests.redis_server import RedisClusterProcs

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(180)]

#: Contract tests that take only the harness: sends, keys, aborts, every consumer path.
SUBSET = [
    "test_send_returns_ok_with_id_and_due_time",
    "test_message_is_delivered_at_its_time_with_all_its_fields",
    "test_sent_messages_are_durable_across_reopen",
    "test_send_with_a_pending_key_is_a_duplicate_of_the_first",
    "test_resending_a_fired_occurrence_at_the_same_ms_is_a_duplicate",
    "test_concurrent_sends_of_one_key_store_exactly_one",
    "test_send_batch_answers_in_input_order",
    "test_send_batch_repeated_key_is_a_duplicate_of_the_first",
    "test_abort_by_key_and_topic_cancels_a_pending_message",
    "test_abort_by_key_targets_the_pending_message_after_key_reuse",
    "test_aborted_messages_are_never_delivered_when_racing_the_fire_time",
    "test_pending_lists_messages_not_yet_due_in_due_time_order",
    "test_messages_of_a_topic_come_in_fire_order",
    "test_invisible_time_expiry_redelivers_with_same_id_and_attempts_plus_one",
    "test_nack_default_backoff_is_10s_then_30s",
    "test_nack_on_the_last_attempt_makes_the_message_dead",
    "test_dead_letter_topic_can_be_consumed_by_another_group",
    "test_members_of_one_group_share_messages_without_overlap",
    "test_group_created_after_messages_fired_still_gets_them",
    "test_query_state_is_the_least_finished_group_state",
    "test_stats_counts_pending_fired_ready_inflight_dead_acked",
    "test_consumer_close_releases_inflight_messages_at_once",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    procs = RedisClusterProcs(tmp_path_factory.mktemp("cluster"), masters=3)
    try:
        yield procs.start()
    finally:
        procs.stop()


class ClusterFactory:
    """RedisBrokers on the cluster; ``cleanup`` flushes every master."""

    can_reopen = True

    def __init__(self, cluster: RedisClusterProcs) -> None:
        self.cluster = cluster

    def open(self, clock: ManualClock) -> RedisBroker:
        return RedisBroker.from_url(self.cluster.url, clock=clock)

    def cleanup(self) -> None:
        for node in self.cluster.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port)
            try:
                client.flushall()
            finally:
                client.close()


@pytest.fixture
def cluster_harness(cluster: RedisClusterProcs) -> Iterator[Harness]:
    factory = ClusterFactory(cluster)
    factory.cleanup()
    h = Harness("redis-cluster", factory, ManualClock(START_MS))
    try:
        yield h
    finally:
        h.close()
        factory.cleanup()


@pytest.mark.parametrize("name", SUBSET)
def test_contract_subset_on_a_3_master_cluster(cluster_harness: Harness, name: str) -> None:
    getattr(contract, name)(cluster_harness)


def _due_per_master(cluster: RedisClusterProcs, prefix: str) -> list[int]:
    counts = []
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port)
        try:
            counts.append(sum(int(client.zcard(k)) for k in client.scan_iter(f"{prefix}:*due")))
        finally:
            client.close()
    return counts


def test_shards_and_pending_messages_spread_evenly_over_the_masters(
    cluster_harness: Harness, cluster: RedisClusterProcs
) -> None:
    broker = cluster_harness.broker
    # Given: each master owns an equal slot range, and the shard tags are slot-banded
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        owners = [
            rc.get_node_from_key(b + K.DUE).port for b in K.shard_bases("cq", K.DEFAULT_SHARDS)
        ]
    finally:
        rc.close()
    assert sorted(owners.count(n.port) for n in cluster.nodes) == [K.DEFAULT_SHARDS // 3] * 3
    # When: 6,000 keyless messages due over a minute and 3,000 keyed ones are sent
    for b in range(30):
        broker.send_batch(
            [Message("spread", b"x", delay_ms=60_000 + (b * 200 + i) * 10) for i in range(200)]
        )
    broker.send_batch(
        [Message("spread", b"k", key=f"order:{i}", delay_ms=60_000) for i in range(3_000)]
    )
    # Then: every master holds about a third, the largest within 1.2x the smallest
    counts = _due_per_master(cluster, "cq")
    assert sum(counts) == 9_000
    assert max(counts) <= 1.2 * min(counts), counts
    assert broker.stats().topics["spread"].pending == 9_000


def test_cluster_delivers_across_every_master(cluster_harness: Harness) -> None:
    broker = cluster_harness.broker
    c = broker.consumer("g", ["spread"])
    # batch b is due in slice b: slices take the masters in turn, and each master's
    # turns its shards, so 12 slices in a row cover every (master, shard) pair
    at = (START_MS // KEYLESS_SLICE_MS + 1) * KEYLESS_SLICE_MS
    ids = {
        r.msg_id
        for b in range(12)
        for r in broker.send_batch(
            [Message("spread", b"x", deliver_at_ms=at + b * KEYLESS_SLICE_MS) for _ in range(50)]
        )
    }
    cluster_harness.clock.advance(200)
    got = pull_until(c, 600, timeout=30, max_messages=100)
    assert {m.msg_id for m in got} == ids
    assert {m.msg_id.split("-")[0] for m in got} == {str(s) for s in range(K.DEFAULT_SHARDS)}


def hand_firer(
    client: Any,
    keys: K.Keyspace,
    clock: ManualClock,
    *,
    groups: list[list[int]] | None = None,
    scripts: Scripts | None = None,
) -> Firer:
    """A firer that the test fires by hand (``fire_once``), in its own process."""
    return Firer(
        scripts or Scripts(client),
        client,
        keys,
        clock,
        ReadyNews(client, keys.ready_channel),
        lambda: None,
        retention_ms=DEFAULT_RETENTION_MS,
        groups=groups,
    )


def _evalsha_calls(cluster: RedisClusterProcs) -> list[int]:
    calls = []
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port)
        try:
            calls.append(
                int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
            )
        finally:
            client.close()
    return calls


@pytest.fixture
def quiet(cluster: RedisClusterProcs) -> Iterator[tuple[RedisBroker, Any, ManualClock]]:
    """A broker that does not fire, on a cluster client and a clock the test holds too
    (flushed before and after): nothing calls scripts unless the test does."""
    factory = ClusterFactory(cluster)
    factory.cleanup()
    client, _opts = open_client(cluster.url)
    clock = ManualClock(START_MS)
    # keyless batches spread evenly over every shard (the tests below count on it)
    broker = RedisBroker(client, clock=clock, fire=False, keyless_slice_ms=0)
    try:
        yield broker, client, clock
    finally:
        broker.close()
        factory.cleanup()


def test_a_firing_pass_is_one_script_call_per_master_covering_every_shard(
    quiet: tuple[RedisBroker, Any, ManualClock], cluster: RedisClusterProcs
) -> None:
    broker, client, clock = quiet
    keys = broker.keyspace
    # fired by hand below, in the test's own firing process
    firer = hand_firer(client, keys, clock)
    c = broker.consumer("g", ["spread"])
    ids = {
        r.msg_id
        for r in broker.send_batch([Message("spread", b"x", delay_ms=1_000) for _ in range(240)])
    }
    assert {i.split("-")[0] for i in ids} == {str(s) for s in range(K.DEFAULT_SHARDS)}
    before = _evalsha_calls(cluster)
    clock.advance(1_000)
    assert firer.fire_once() == 240  # a full sweep: every shard of every master
    assert [a - b for a, b in zip(_evalsha_calls(cluster), before, strict=True)] == [1, 1, 1]
    got = pull_until(c, 240, timeout=30, max_messages=240)
    assert {m.msg_id for m in got} == ids
    # acks are batched one call per master too (ack_batch.lua), and all land
    for m in got:
        assert c.ack(m)
    broker.flush()
    assert broker.stats().groups["g"].acked_total == 240
    assert broker.stats().groups["g"].inflight == 0


def test_each_master_has_its_own_firing_thread_whose_pass_calls_that_master_only(
    quiet: tuple[RedisBroker, Any, ManualClock], cluster: RedisClusterProcs
) -> None:
    broker, client, clock = quiet
    keys = broker.keyspace
    scripts = Scripts(client)
    groups = scripts.by_node(keys.due_keys)
    # Given 12 shards on 3 masters: three groups of four, each group on one master
    assert sorted(len(g) for g in groups) == [4, 4, 4]
    assert sorted(s for g in groups for s in g) == list(range(K.DEFAULT_SHARDS))
    masters = [{client.get_node_from_key(keys.due_keys[s]).port for s in g} for g in groups]
    assert all(len(m) == 1 for m in masters)
    firer = hand_firer(client, keys, clock, groups=groups, scripts=scripts)
    assert firer.groups == 3
    c = broker.consumer("g", ["spread"])
    broker.send_batch([Message("spread", b"x", delay_ms=1_000) for _ in range(240)])
    clock.advance(1_000)
    ports = [n.port for n in cluster.nodes]
    fired = 0
    for g, (port,) in zip(range(3), masters, strict=True):
        # When group g passes, Then only its master runs a script, firing its shards
        before = _evalsha_calls(cluster)
        fired += firer.fire_once(g)
        delta = [a - b for a, b in zip(_evalsha_calls(cluster), before, strict=True)]
        assert delta == [1 if p == port else 0 for p in ports]
    assert fired == 240
    got = pull_until(c, 240, timeout=30, max_messages=240)
    assert {m.msg_id.split("-")[0] for m in got} == {str(s) for s in range(K.DEFAULT_SHARDS)}


@pytest.mark.parametrize(("per_master", "threads"), [(False, 1), (True, 3)])
def test_a_cluster_broker_fires_on_one_thread_or_one_per_master(
    cluster: RedisClusterProcs, per_master: bool, threads: int
) -> None:
    def firing() -> set[str]:
        return {t.name for t in threading.enumerate() if t.name.startswith("chronoq-redis-fir")}

    before = firing()
    broker = RedisBroker.from_url(cluster.url, fire_per_master=per_master)
    try:
        assert len(firing() - before) == threads
        c = broker.consumer("g", ["t"])
        sent = broker.send_batch([Message("t", b"%d" % i) for i in range(24)])  # every shard
        got = pull_until(c, 24, timeout=30, max_messages=24)
        assert {m.msg_id for m in got} == {r.msg_id for r in sent}
    finally:
        broker.close()
        ClusterFactory(cluster).cleanup()
    assert firing() == before


@pytest.mark.parametrize("groups", [[[0, 1], [1, 2]], [[0, 1]], [[0, 1, 2, 3]]])
def test_firing_groups_must_cover_every_shard_once(
    quiet: tuple[RedisBroker, Any, ManualClock], groups: list[list[int]]
) -> None:
    _broker, client, clock = quiet
    keys = K.Keyspace.build("cq", 3)
    with pytest.raises(InvalidArgument, match="firing groups"):
        hand_firer(client, keys, clock, groups=groups)


def _set_slot_owner(cluster: RedisClusterProcs, slot: int, node_id: str) -> None:
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port)
        try:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id)
        finally:
            client.close()


def test_a_shard_whose_slot_moved_to_another_master_is_still_sent_to_and_fired(
    quiet: tuple[RedisBroker, Any, ManualClock], cluster: RedisClusterProcs
) -> None:
    broker, client, clock = quiet
    keys = broker.keyspace
    # Given a broker that looked up (and cached) every shard's master, then shard 0's
    # slot (empty yet) moved to another master
    slot = client.keyslot(keys.due_keys[0])
    old = client.get_node_from_key(keys.due_keys[0])
    ids: dict[int, str] = {}
    for port in _ports(cluster):
        with redis.Redis(host="127.0.0.1", port=port) as one:
            ids[port] = one.cluster("myid")
    new = next(p for p in ids if p != old.port)
    _set_slot_owner(cluster, slot, ids[new])
    try:
        c = broker.consumer("g", ["moved"])
        # When a batch goes to every shard and fires, Then each message is stored
        # once, in its shard's slot on the new master, and fires
        sent = broker.send_batch([Message("moved", b"x", delay_ms=1_000) for _ in range(24)])
        assert len({r.msg_id for r in sent}) == 24
        with redis.Redis(host="127.0.0.1", port=new) as on_new:
            assert on_new.zcard(keys.due_keys[0]) == 2
        firer = hand_firer(client, keys, clock, groups=Scripts(client).by_node(keys.due_keys))
        clock.advance(1_000)
        assert firer.fire_once() == 24
        got = pull_until(c, 24, timeout=30, max_messages=24)
        assert {m.msg_id for m in got} == {r.msg_id for r in sent}
    finally:
        ClusterFactory(cluster).cleanup()
        _set_slot_owner(cluster, slot, ids[old.port])


def _ports(cluster: RedisClusterProcs) -> list[int]:
    return [n.port for n in cluster.nodes]


def test_lost_script_caches_on_the_masters_are_reloaded(
    cluster_harness: Harness, cluster: RedisClusterProcs
) -> None:
    broker = cluster_harness.broker
    c = broker.consumer("g", ["t"])
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port)
        try:
            client.script_flush()
        finally:
            client.close()
    sent = broker.send_batch([Message("t", b"%d" % i) for i in range(60)])  # every shard
    assert len({r.msg_id for r in sent}) == 60
    got = pull_until(c, 60, timeout=30, max_messages=60)
    assert {m.msg_id for m in got} == {r.msg_id for r in sent}


def test_a_send_whose_reply_is_lost_is_not_sent_again(
    quiet: tuple[RedisBroker, Any, ManualClock], cluster: RedisClusterProcs
) -> None:
    broker, client, _clock = quiet
    broker.send_batch([Message("t", b"warm", delay_ms=60_000) for _ in range(24)])
    # Given: every master's pooled connection loses the next reply after sending
    conns = []
    for node in client.get_primaries():
        pool = client.get_redis_connection(node).connection_pool
        conns.extend(pool._available_connections)

    def lose(*args: object, **kwargs: object) -> object:
        for conn in conns:
            del conn.read_response  # once
        raise redis.ConnectionError("reply lost")

    for conn in conns:
        conn.read_response = lose
    before = _evalsha_calls(cluster)
    # When: a batch over every shard is sent
    with pytest.raises(ConnectionFailed):
        broker.send_batch([Message("t", b"x", delay_ms=60_000) for _ in range(120)])
    # Then: each call went out once and was not repeated; what ran is stored once
    after = _evalsha_calls(cluster)
    assert [x - y for x, y in zip(after, before, strict=True)] == [1, 1, 1]  # one per master
    assert broker.stats().topics["t"].pending == 24 + 120


def test_keyless_messages_due_in_one_slice_lie_on_one_master_and_a_pass_calls_it_alone(
    cluster: RedisClusterProcs,
) -> None:
    ClusterFactory(cluster).cleanup()
    client, _opts = open_client(cluster.url)
    clock = ManualClock(START_MS)
    broker = RedisBroker(client, clock=clock, fire=False)
    try:
        keys = broker.keyspace
        masters = Scripts(client).by_node(keys.due_keys)
        port_of = [client.get_node_from_key(keys.due_keys[g[0]]).port for g in masters]
        slice0 = START_MS // KEYLESS_SLICE_MS + 10
        c = broker.consumer("g", ["sl"])
        # Given: batches of keyless messages due over 6 slices, each slice in every batch
        sent = []
        for b in range(6):  # 60 per slice in all: below SLICE_RUN, so no slice spills
            sent += broker.send_batch(
                [
                    Message("sl", b"%d" % i, deliver_at_ms=(slice0 + i % 6) * KEYLESS_SLICE_MS + b)
                    for i in range(60)
                ]
            )
        # Then: slice k's messages all lie on master k % 3 (in turn), on ONE shard of
        # it, whichever batch sent them
        master_of = {s: m for m, g in enumerate(masters) for s in g}
        shards_of: dict[int, set[int]] = {}
        for r in sent:
            k = r.deliver_at_ms // KEYLESS_SLICE_MS - slice0
            shard = int(r.msg_id.split("-")[0])
            assert master_of[shard] == (slice0 + k) % 3, (r, k)
            shards_of.setdefault(k, set()).add(shard)
        assert [len(shards_of[k]) for k in range(6)] == [1] * 6
        firer = hand_firer(client, keys, clock)
        assert firer.fire_once() == 0  # the first pass sweeps every shard: learns the heads
        ports = _ports(cluster)
        fired = 0
        for k in range(6):
            # When: a pass runs at the end of slice k, Then it calls that slice's master only
            clock.set((slice0 + k) * KEYLESS_SLICE_MS + KEYLESS_SLICE_MS - 1)
            before = _evalsha_calls(cluster)
            fired += firer.fire_once()
            delta = [a - b for a, b in zip(_evalsha_calls(cluster), before, strict=True)]
            assert delta == [1 if p == port_of[(slice0 + k) % 3] else 0 for p in ports]
        assert fired == 360
        got = pull_until(c, 360, timeout=30, max_messages=480)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in sent)
    finally:
        broker.close()
        ClusterFactory(cluster).cleanup()
