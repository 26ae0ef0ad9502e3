"""``pull.lua``'s parts share what the fire part fired: the claim part leaves those
messages' TTLs as the fire set them in the same call (two commands less per message),
and sets them as before for anything else (issue 16)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker_adapter.clock import ManualClock
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.keys import DEFAULT_PREFIX, Keyspace
from broker_adapter.redis.scripts import SOURCES, Scripts, Step

T0 = 1_700_000_000_000
HOUR = 3_600_000


@pytest.fixture
def setup(redis_url: str) -> Iterator[tuple[RedisBroker, Scripts, Keyspace, redis.Redis]]:
    # A broker on a manual clock sends and registers the group; nothing fires by itself.
    broker = RedisBroker.from_url(redis_url, clock=ManualClock(T0), shards=1)
    client = redis.Redis.from_url(redis_url)
    try:
        broker.consumer("g", ["t"])
        yield broker, Scripts(client), Keyspace.build(DEFAULT_PREFIX, 1), client
    finally:
        client.close()
        broker.close()


def fire_and_claim(
    scripts: Scripts, keys: Keyspace, now: int, fire_retention: int, claim_retention: int
) -> list[Any]:
    """One ``pull.lua`` call that fires shard 0 at ``now`` and claims up to 10 there."""
    steps: list[Step] = [
        ("fire", [0], (now, 1000, fire_retention, "", "test"), [(keys.bases[0], 0, 0)]),
        ("claim", [0], ("g", now + 60_000, claim_retention), [(keys.bases[0], 10)]),
    ]
    return scripts.fan_steps(keys.due_keys, steps)


def ttls(client: redis.Redis, keys: Keyspace, n: bytes) -> tuple[int, int]:
    base = keys.bases[0]
    return (
        int(client.pttl(f"{base}m:{n.decode()}")),
        int(client.pttl(f"{base}b:{n.decode()}")),
    )


def test_the_pull_script_shares_one_state_and_flushes_it_once() -> None:
    # each part alone makes its state and writes its counters; pull.lua does both once
    state = "\nlocal fresh, stats = {}, {}\n"
    for name in ("fire", "claim", "ack_batch"):
        assert SOURCES[name].count(state) == 1
        assert SOURCES[name].count("flush_stats() --@alone") == 1
    assert SOURCES["pull"].count(state) == 1
    assert SOURCES["pull"].count("\nflush_stats()\n") == 1
    assert "flush_stats() --@alone" not in SOURCES["pull"]


def test_a_message_fired_and_claimed_in_one_call_keeps_the_fire_ttls(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis],
) -> None:
    # Given three messages due at T0 + 10
    broker, scripts, keys, client = setup
    broker.send_batch([Message("t", b"body%d" % i, deliver_at_ms=T0 + 10) for i in range(3)])
    # When one pull.lua call fires and claims them, with one retention
    fired, claimed = fire_and_claim(scripts, keys, T0 + 10, HOUR, HOUR)
    # Then all three fired and were claimed, first deliveries with claim number 1
    assert fired[0][0] == 3
    rows = claimed[0]
    assert sorted(r[2] for r in rows) == [b"body0", b"body1", b"body2"]
    assert [(r[8], r[10]) for r in rows] == [(1, 1)] * 3
    # And every hash and body keeps the retention's TTL (set once, by the fire)
    for r in rows:
        m_ttl, b_ttl = ttls(client, keys, r[0])
        assert HOUR - 60_000 < m_ttl <= HOUR
        assert HOUR - 60_000 < b_ttl <= HOUR
    # And they are in flight until the claim's deadline
    inf = client.zrange(f"{keys.bases[0]}inf:g", 0, -1, withscores=True)
    assert sorted(inf) == sorted((r[0], float(T0 + 10 + 60_000)) for r in rows)


def test_a_claim_with_another_retention_sets_the_ttls_again(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis],
) -> None:
    # Given a message due at T0 + 10, fired with a short retention in the same call
    broker, scripts, keys, client = setup
    broker.send(Message("t", b"x", deliver_at_ms=T0 + 10))
    _fired, claimed = fire_and_claim(scripts, keys, T0 + 10, 5_000, HOUR)
    # Then the claim gave hash and body its own, longer retention
    (row,) = claimed[0]
    m_ttl, b_ttl = ttls(client, keys, row[0])
    assert m_ttl > 5_000 and b_ttl > 5_000


def test_a_claim_after_the_fire_call_sets_the_ttls_again(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis],
) -> None:
    # Given a message fired by one call, its TTLs shortened since
    broker, scripts, keys, client = setup
    broker.send(Message("t", b"x", deliver_at_ms=T0 + 10))
    steps: list[Step] = [
        ("fire", [0], (T0 + 10, 1000, HOUR, "", "test"), [(keys.bases[0], 0, 0)]),
    ]
    assert scripts.fan_steps(keys.due_keys, steps)[0][0][0] == 1
    ready: list[bytes] = client.zrange(f"{keys.bases[0]}rdy:g", 0, -1)  # type: ignore[assignment]
    (n,) = ready
    client.pexpire(f"{keys.bases[0]}m:{n.decode()}", 5_000)
    client.pexpire(f"{keys.bases[0]}b:{n.decode()}", 5_000)
    # When a later call claims it (nothing fired there)
    claim: Step = ("claim", [0], ("g", T0 + 60_000, HOUR), [(keys.bases[0], 10)])
    (rows,) = scripts.fan_steps(keys.due_keys, [claim])[0]
    # Then its TTLs are the retention again
    assert [r[0] for r in rows] == [n]
    m_ttl, b_ttl = ttls(client, keys, n)
    assert m_ttl > 5_000 and b_ttl > 5_000


def test_claim_numbers_count_on_across_a_release(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis],
) -> None:
    # Given a message claimed once (claim number 1)
    broker, scripts, keys, client = setup
    broker.send(Message("t", b"x", deliver_at_ms=T0 + 10))
    (first,) = fire_and_claim(scripts, keys, T0 + 10, HOUR, HOUR)[1][0]
    assert (first[8], first[10]) == (1, 1)
    # When it is released (given back uncounted) and claimed again
    base = keys.bases[0]
    assert scripts.call("release", keys.due_keys[0], (base, "g", first[0], b"1:1", first[9])) == 1
    claim: Step = ("claim", [0], ("g", T0 + 60_000, HOUR), [(base, 10)])
    (second,) = scripts.fan_steps(keys.due_keys, [claim])[0][0]
    # Then it is the same delivery count with the next claim number
    assert (second[0], second[8], second[10]) == (first[0], 1, 2)
    assert client.hget(f"{base}m:{first[0].decode()}", "Kg") == b"2"


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"key": "order:1", "tags": "urgent", "properties": {"a": "1"}},
        {"key": "order:2", "body": b""},
    ],
)
def test_a_claim_from_the_fire_part_returns_what_a_read_back_returns(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis], fields: dict[str, Any]
) -> None:
    # Given two messages alike but for their key, due at T0 + 10 and T0 + 20
    broker, scripts, keys, client = setup
    body = fields.pop("body", b"payload")
    key = fields.pop("key", None)
    for i, due in enumerate((T0 + 10, T0 + 20)):
        k = f"{key}-{i}" if key else None
        broker.send(Message("t", body, key=k, deliver_at_ms=due, **fields))
    # When the first is fired and claimed in one call (claimed from the fire's record)
    (fresh,) = fire_and_claim(scripts, keys, T0 + 10, HOUR, HOUR)[1][0]
    # and the second fired by one call and claimed by the next (read back from Redis)
    fire: Step = ("fire", [0], (T0 + 20, 1000, HOUR, "", "test"), [(keys.bases[0], 0, 0)])
    assert scripts.fan_steps(keys.due_keys, [fire])[0][0][0] == 1
    claim: Step = ("claim", [0], ("g", T0 + 60_000, HOUR), [(keys.bases[0], 10)])
    (read,) = scripts.fan_steps(keys.due_keys, [claim])[0][0]

    # Then both rows say the same but for number, due, ready score and key
    def same(row: list[Any]) -> list[Any]:
        return [row[1], row[2], row[4], row[6], row[7], row[8], row[10]]

    assert same(fresh) == same(read)
    assert (fresh[3], fresh[9], read[3], read[9]) == (T0 + 10, T0 + 10, T0 + 20, T0 + 20)
    assert (fresh[5], read[5]) == (
        (f"{key}-0".encode(), f"{key}-1".encode()) if key else (False, False)
    )
    # And both hashes hold the same delivery state
    for row in (fresh, read):
        h = client.hgetall(f"{keys.bases[0]}m:{row[0].decode()}")
        assert (h[b"Gg"], h[b"Kg"]) == (b"I1:1", b"1")


@pytest.mark.parametrize(("due", "later"), [(0, 1), (3, 2), (7, 1), (8, 0), (8, 3), (20, 2)])
def test_a_firing_pass_fires_what_is_due_and_names_the_next_head(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis], due: int, later: int
) -> None:
    # Given `due` messages due by T0 + 10 and `later` due from T0 + 500 on
    broker, scripts, keys, _client = setup
    dues = [T0 + 1 + i % 10 for i in range(due)] + [T0 + 500 + i for i in range(later)]
    broker.send_batch([Message("t", b"x", deliver_at_ms=d) for d in dues])
    # When one pass fires at T0 + 10 (a head peek holds 8 entries; then a full look)
    fire: Step = ("fire", [0], (T0 + 10, 1000, HOUR, "", "test"), [(keys.bases[0], 0, 0)])
    ((moved, head, _deadline, more),) = scripts.fan_steps(keys.due_keys, [fire])[0]
    # Then every due one fired, the head is the first later one, and nothing more is due
    assert (moved, head, more) == (due, T0 + 500 if later else -1, 0)


def test_a_firing_pass_stops_at_its_chunk_and_says_more(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis],
) -> None:
    # Given 12 messages due, fired in chunks of 5 and of 3 (below the peek's 8)
    broker, scripts, keys, _client = setup
    broker.send_batch([Message("t", b"x", deliver_at_ms=T0 + 1 + i) for i in range(12)])
    for chunk, moved_then, head_then in ((5, 5, T0 + 6), (3, 3, T0 + 9), (5, 4, -1)):
        fire: Step = ("fire", [0], (T0 + 20, chunk, HOUR, "", "test"), [(keys.bases[0], 0, 0)])
        ((moved, head, _deadline, more),) = scripts.fan_steps(keys.due_keys, [fire])[0]
        # Then each pass fires one chunk, names the next head, says if it took a full one
        assert (moved, head, more) == (moved_then, head_then, 1 if moved_then == chunk else 0)


def test_counters_of_a_pull_that_acks_fires_and_claims_are_written_once_and_add_up(
    setup: tuple[RedisBroker, Scripts, Keyspace, redis.Redis],
) -> None:
    # Given 3 messages due at T0 + 10 and 2 at T0 + 20
    broker, scripts, keys, client = setup
    dues = [T0 + 10] * 3 + [T0 + 20] * 2
    broker.send_batch([Message("t", b"x", deliver_at_ms=d) for d in dues])
    base = keys.bases[0]
    stat = f"{base}stat"
    # When one call fires and claims the first 3: ready +3 -3 is never written
    (_fired, (first,)) = fire_and_claim(scripts, keys, T0 + 10, HOUR, HOUR)
    assert client.hget(stat, "r|g|t") in (None, b"0")
    s = broker.stats()
    assert (s.topics["t"].pending, s.topics["t"].fired_total) == (2, 3)
    assert (s.groups["g"].ready, s.groups["g"].inflight, s.groups["g"].acked_total) == (0, 3, 0)
    # And a second call acks those 3, fires and claims the other 2
    acks: list[Any] = [base, 3]
    for row in first:
        acks += [row[0], b"%d:%d" % (row[8], row[10])]
    steps: list[Step] = [
        ("ack_batch", [0], ("g",), [acks]),
        ("fire", [0], (T0 + 20, 1000, HOUR, "", "test"), [(base, 0, 0)]),
        ("claim", [0], ("g", T0 + 60_000, HOUR), [(base, 10)]),
    ]
    (acked,), _fired2, (second,) = scripts.fan_steps(keys.due_keys, steps)
    # Then the counters add up as if each part had run alone
    assert (acked, len(second)) == (3, 2)
    s = broker.stats()
    assert (s.topics["t"].pending, s.topics["t"].fired_total) == (0, 5)
    assert (s.groups["g"].ready, s.groups["g"].inflight, s.groups["g"].acked_total) == (0, 2, 3)
