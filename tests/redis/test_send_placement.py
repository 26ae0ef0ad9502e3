"""Where a send batch's messages go (``plan_send``, no Redis needed): keyed ones to
their key's shard; keyless ones in equal runs over every shard, or on a cluster to
the master of their due time's slice (issue 19)."""

from __future__ import annotations

import random

import pytest

from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.client_calls import SLICE_RUN, plan_send, sliced_shard

NOW = 1_700_000_000_000
#: 12 shards on 3 masters, as ``Scripts.by_node`` groups a fresh 3-master cluster's
MASTERS = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
KEYS = K.Keyspace.build("cq", 12)


def _shards(
    plan_dues: list[int], slice_ms: int, rr: int, masters: list[list[int]] | None
) -> list[int]:
    msgs = [Message("t", b"x", deliver_at_ms=d) for d in plan_dues]
    plan = plan_send(msgs, KEYS, NOW, 10**12, rr, masters, slice_ms)
    shard_of = [0] * len(msgs)
    for s, idx in zip(plan.shards, plan.indexes, strict=True):
        for i in idx:
            shard_of[i] = s
    return shard_of


def test_keyless_messages_of_one_slice_go_to_its_master_the_masters_in_turn() -> None:
    rng = random.Random(7)
    dues = [NOW + rng.randrange(60_000) for _ in range(400)]
    first = _shards(dues, 8, 0, MASTERS)
    for rr in range(12):
        shard_of = _shards(dues, 8, rr, MASTERS)
        # a slice's messages lie on ONE shard of its master (each master's turns take
        # its shards in turn), whatever the batch: a pass fires one shard, as on one
        # instance
        for due, s in zip(dues, shard_of, strict=True):
            assert s == MASTERS[(due // 8) % 3][(due // 8 // 3) % 4]
        assert shard_of == first
    assert set(first) == set(range(12))  # over time every shard takes its turns


def test_a_burst_due_in_one_slice_spreads_over_every_master_and_shard_a_run_each() -> None:
    due = (NOW // 8 + 5) * 8
    n = SLICE_RUN * 12 + 1
    shard_of = _shards([due] * n, 8, 1, MASTERS)
    first = (due // 8) % 3
    runs = [shard_of[r * SLICE_RUN] for r in range(13)]
    # masters in turn from the slice's own, then each master's next shard (from the
    # slice's own shard)
    own = (due // 8 // 3) % 4
    assert runs == [MASTERS[(first + r) % 3][(own + r // 3) % 4] for r in range(13)]
    assert sorted(set(runs[:12])) == list(range(12))
    assert all(shard_of[i] == runs[i // SLICE_RUN] for i in range(n))


def test_the_slice_counts_carry_over_batches_so_single_sends_spread_too() -> None:
    due = (NOW // 8 + 9) * 8
    counts: dict[int, int] = {}
    shard_of = []
    for i in range(SLICE_RUN * 3):  # one send at a time, as schedule() makes them
        msgs = [Message("t", b"x", deliver_at_ms=due)]
        plan = plan_send(msgs, KEYS, NOW, 10**12, i % 12, MASTERS, 8, counts)
        shard_of.append(plan.shards[0])
    master_of = {s: m for m, g in enumerate(MASTERS) for s in g}
    masters_used = [
        {master_of[s] for s in shard_of[r * SLICE_RUN : (r + 1) * SLICE_RUN]} for r in range(3)
    ]
    first = (due // 8) % 3
    assert masters_used == [{first}, {(first + 1) % 3}, {(first + 2) % 3}]
    assert counts == {due // 8: SLICE_RUN * 3}


@pytest.mark.parametrize(("slice_ms", "masters"), [(0, MASTERS), (8, None), (8, [list(range(12))])])
def test_keyless_batches_spread_evenly_without_slices_or_with_one_master(
    slice_ms: int, masters: list[list[int]] | None
) -> None:
    dues = [NOW + 1_000 + i for i in range(120)]
    shard_of = _shards(dues, slice_ms, 5, masters)
    assert [shard_of.count(s) for s in range(12)] == [10] * 12
    assert shard_of[:10] == [5] * 10  # equal runs from shard rr


def test_keyed_messages_go_to_their_key_shard_whatever_the_slices() -> None:
    msgs = [Message("t", b"x", key=f"k{i}", deliver_at_ms=NOW + 8 * i) for i in range(50)]
    plan = plan_send(msgs, KEYS, NOW, 10**12, 0, MASTERS, 8)
    for s, idx in zip(plan.shards, plan.indexes, strict=True):
        for i in idx:
            assert s == K.key_shard("t", f"k{i}", 12)


@pytest.mark.parametrize("masters", [MASTERS, [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11]]])
def test_a_batch_places_each_keyless_message_where_sliced_shard_says(
    masters: list[list[int]],
) -> None:
    # uneven masters (slots moved) too: a batch takes no shortcut sliced_shard does not
    rng = random.Random(3)
    dues = [NOW + rng.randrange(2_000) for _ in range(3_000)]  # ~12 per slice, some runs full
    dues += [NOW + 800] * (SLICE_RUN + 5)
    counts: dict[int, int] = {}
    expected = [sliced_shard(d, masters, 8, counts) for d in dues]
    assert _shards(dues, 8, 0, masters) == expected
