"""Dead letters and pending counts of the Redis broker as data.

As :mod:`~broker_adapter.redis.runtime_calls` does for the runtime calls, these pure
functions build the script calls and decode their replies, so
:class:`~broker_adapter.redis.broker.RedisBroker` and
:class:`~broker_adapter.redis.async_broker.AsyncRedisBroker` make the same calls:

* ``dead_letters``: one ``dead.lua`` per shard, merged by (death time, shard,
  member) exactly as ``find_pending``'s pages are (same positions and cursors);
* ``requeue_dead``/``purge_dead``: ``settle_dead.lua``, one call per shard holding
  named ids; for "the oldest", shard after shard with what ``limit`` leaves (each
  shard's own oldest: across shards the order is by shard, not by death time);
* ``count_pending``: ``count.lua`` per shard, a ``ZCOUNT`` of the due index per
  bucket (first sends and retries), added up: exact. With a topic, Redis keeps no
  per-topic due index: each shard's counts are scaled by the topic's share of that
  shard's pending messages (its ``p|<topic>`` counter over all ``p|`` counters,
  retries counted in the total only), which is exact when the shard has nothing
  else pending, else an estimate (``exact=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker_adapter.redis import keys as K
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.runtime_calls import (
    decode_cursor,
    encode_cursor,
    merge_rows,
    resume_where,
)
from broker_adapter.redis.scripts import Call
from broker_adapter.redis.views import dead_view
from broker_adapter.results import DeadLetterPage, PendingCounts

#: Most dead-letter log entries one ``dead.lua`` call looks at in one shard.
DEAD_WORK = 1000


def dead_calls(
    keys: Keyspace, group: str, cursor: str | None, limit: int, with_body: bool
) -> list[Call]:
    """One ``dead.lua`` call per shard (in shard order) for the page after ``cursor``.

    :raises InvalidArgument: for a malformed cursor.
    """
    pos = None if cursor is None else decode_cursor(cursor, keys.shards)
    per_shard = min(limit, DEAD_WORK, -(-2 * limit // keys.shards) + 4)
    common = (per_shard, DEAD_WORK, "1" if with_body else "0")
    return [
        ("dead", due_key, (base, group, *resume_where(pos, s), *common))
        for s, (base, due_key) in enumerate(zip(keys.bases, keys.due_keys, strict=True))
    ]


def dead_page(replies: Sequence[bytes], group: str, limit: int, with_body: bool) -> DeadLetterPage:
    """Every shard's ``dead.lua`` reply (shard order) merged into one page."""
    _known, rows, next_pos = merge_rows(replies, limit)
    messages = [dead_view(K.make_id(s, n.decode()), group, row, with_body) for _, s, n, row in rows]
    return DeadLetterPage(messages, None if next_pos is None else encode_cursor(next_pos))


def settle_calls(
    keys: Keyspace,
    group: str,
    how: str,
    msg_ids: tuple[str, ...],
    now_ms: int,
    retention_ms: int,
) -> list[Call]:
    """``settle_dead.lua`` calls for named ids (``how``: ``"R"`` requeue, ``"X"`` purge),
    one per shard holding some; malformed ids and ids of no shard are left out."""
    by_shard: dict[int, list[str]] = {}
    for msg_id in msg_ids:
        parsed = K.parse_id(msg_id, keys.shards)
        if parsed is not None:
            by_shard.setdefault(parsed[0], []).append(parsed[1])
    return [
        settle_call(keys, s, group, how, len(ns), ns, now_ms, retention_ms)
        for s, ns in sorted(by_shard.items())
    ]


def settle_call(
    keys: Keyspace,
    shard: int,
    group: str,
    how: str,
    limit: int,
    numbers: Sequence[str],
    now_ms: int,
    retention_ms: int,
) -> Call:
    """One ``settle_dead.lua`` call in ``shard``: the message ``numbers`` (none: the
    ``limit`` oldest of the shard)."""
    args: tuple[Any, ...] = (
        keys.bases[shard],
        group,
        how,
        now_ms,
        limit,
        keys.wake_channel,
        shard,
        retention_ms,
        *numbers,
    )
    return ("settle_dead", keys.due_keys[shard], args)


def count_calls(keys: Keyspace, edges: tuple[int, ...], topic: str | None) -> list[Call]:
    """One ``count.lua`` call per shard."""
    return [
        ("count", due_key, (base, topic or "", *edges))
        for base, due_key in zip(keys.bases, keys.due_keys, strict=True)
    ]


def counts_of(replies: Sequence[Any], buckets: int, topic: str | None) -> PendingCounts:
    """Every shard's ``count.lua`` reply added up (see the module docstring)."""
    total = [0.0] * buckets
    exact = True
    for counts, mine, everyone in replies:
        share = 1.0
        if topic is not None:
            share = int(mine) / int(everyone) if int(everyone) else 0.0
            exact = exact and int(mine) == int(everyone)  # nothing else pending there
        for i, n in enumerate(counts):
            total[i] += int(n) * share
    return PendingCounts([round(x) for x in total], exact)


__all__ = [
    "DEAD_WORK",
    "count_calls",
    "counts_of",
    "dead_calls",
    "dead_page",
    "settle_call",
    "settle_calls",
]
