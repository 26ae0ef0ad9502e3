"""The client calls of the Redis broker as data: script arguments in, replies decoded out.

Send, abort, query, pending and stats put the same keys and arguments into Redis
whichever client makes the call; these pure functions are that part, shared by
:class:`~broker_adapter.redis.broker.RedisBroker` (blocking redis-py) and
:class:`~broker_adapter.redis.async_broker.AsyncRedisBroker` (``redis.asyncio``), so
a message one of them sends is indistinguishable from one the other sends. Each
broker only moves the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from broker_adapter.errors import InvalidDelay
from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.scripts import Call
from broker_adapter.redis.views import pending_view
from broker_adapter.results import AbortResult, AbortStatus, MessageView, SendResult, SendStatus

_ABORT = {
    b"A": AbortStatus.ABORTED,
    b"D": AbortStatus.ALREADY_DELIVERED,
    b"N": AbortStatus.NOT_FOUND,
}


@dataclass(frozen=True, slots=True)
class SendPlan:
    """One batch of messages cut into ``send.lua`` shard groups.

    Run it as ``fan("send", plan.due_keys, (keyspace.wake_channel,), plan.groups)``
    (see :meth:`~broker_adapter.redis.scripts.Scripts.fan`) and read the replies
    with :meth:`results`.

    :ivar shards: the shards the batch touches, in group order.
    :ivar due_keys: each group's due key (routing).
    :ivar groups: each group's ``send.lua`` arguments.
    :ivar indexes: each group's message positions in the batch.
    :ivar dues: each message's due time (ms).
    """

    shards: tuple[int, ...]
    due_keys: tuple[str, ...]
    groups: tuple[list[Any], ...]
    indexes: tuple[list[int], ...]
    dues: tuple[int, ...]

    def results(self, replies: Sequence[Any]) -> tuple[list[SendResult], list[tuple[int, int]]]:
        """The batch's results in input order, and ``(shard, due)`` of each shard whose
        head the batch made earlier (``send.lua`` has published it on the wake channel;
        a broker with a firer in process tells it too)."""
        results: list[SendResult] = [None] * len(self.dues)  # type: ignore[list-item]
        wakes: list[tuple[int, int]] = []
        ok, duplicate = SendStatus.OK, SendStatus.DUPLICATE
        dues = self.dues
        for s, idx, (last, wake, dups) in zip(self.shards, self.indexes, replies, strict=True):
            dup_at = {int(dups[k]) - 1: k for k in range(0, len(dups), 3)}
            n = int(last)
            for pos, i in enumerate(idx):
                k = dup_at.get(pos)
                if k is None:
                    n += 1
                    results[i] = SendResult(ok, f"{s}-{n}", dues[i])
                else:
                    results[i] = SendResult(
                        duplicate, f"{s}-{dups[k + 1].decode()}", int(dups[k + 2])
                    )
            if wake >= 0:
                wakes.append((s, int(wake)))
        return results, wakes


def plan_send(
    messages: Sequence[Message],
    keys: Keyspace,
    now: int,
    max_delay_ms: int,
    rr: int,
    masters: Sequence[Sequence[int]] | None = None,
    slice_ms: int = 0,
    placed: dict[int, int] | None = None,
) -> SendPlan:
    """Cut checked ``messages`` into ``send.lua`` shard groups: keyed ones go to their
    key's shard; keyless ones in equal runs over the shards starting at shard ``rr``,
    or, given ``masters`` (more than one) and ``slice_ms``, to the master of their due
    time's slice (:func:`sliced_shard`). Each message is one msgpack record packed
    here (``send.lua`` stores it as it is).

    :param masters: the shards each master of a cluster holds (a stale grouping only
        costs speed: every call goes where its keys are).
    :param slice_ms: the length of a due-time slice (``0``: equal runs).
    :param placed: keyless messages placed so far per slice, kept by the caller across
        batches (see :func:`sliced_shard`; updated); ``None``: counted in this batch only.
    :raises InvalidDelay: when a message is due after ``now + max_delay_ms``; nothing
        is sent then.
    """
    limit = now + max_delay_ms
    count = keys.shards
    by_due = masters if masters is not None and len(masters) > 1 and slice_ms > 0 else None
    if placed is None:
        placed = {}
    pack = msgpack.Packer(use_bin_type=False).pack
    # per shard: message indexes, keyless counts per topic, the records
    per_shard: dict[int, tuple[list[int], dict[str, int], list[Any]]] = {}
    dues: list[int] = []
    keyless = sum(1 for m in messages if m.key is None) or 1
    j = 0
    # the shard of each slice's first run, one turn of every (master, shard): what
    # sliced_shard says below SLICE_RUN, without its call per message (~0.3 us of ~3)
    turns = slice_turns(by_due) if by_due is not None else []
    n_turns = len(turns)
    for i, m in enumerate(messages):
        props = m.properties_bytes() if m.properties else b""
        at = m.deliver_at_ms
        due = max(now, at) if at is not None else m.deliver_at(now)
        if due > limit:
            raise InvalidDelay(
                "delay", due - now, f"due after the broker's max delay of {max_delay_ms} ms"
            )
        dues.append(due)
        key = m.key
        if key is None:
            if by_due is not None:
                sl = due // slice_ms
                k = placed.get(sl, 0)
                if k < SLICE_RUN and n_turns:
                    placed[sl] = k + 1
                    shard = turns[sl % n_turns]
                else:
                    shard = sliced_shard(due, by_due, slice_ms, placed)
            else:
                # keyless messages: the batch is cut into equal runs, one per shard
                shard = (rr + j * count // keyless) % count if count > 1 else 0
                j += 1
        else:
            shard = K.key_shard(m.topic, key, count)
        entry = per_shard.get(shard)
        if entry is None:
            entry = per_shard[shard] = ([], {}, [])
        entry[0].append(i)
        if key is None:
            entry[1][m.topic] = entry[1].get(m.topic, 0) + 1
            entry[2].append(
                b"%015d-" % due + pack((m.topic, due, now, "", m.tags or "", props, m.body, due))
            )
        else:
            asked = at if at is not None else due
            entry[2].append(
                b"%015dk" % due + pack((m.topic, due, now, key, m.tags or "", props, m.body, asked))
            )
    shards = tuple(per_shard)
    groups: list[list[Any]] = []
    for s in shards:
        _idx, topics, records = per_shard[s]
        group: list[Any] = [keys.bases[s], s, len(topics), len(records)]
        for topic, c in topics.items():
            group += (topic, c)
        group += records
        groups.append(group)
    return SendPlan(
        shards,
        tuple(keys.due_keys[s] for s in shards),
        tuple(groups),
        tuple(per_shard[s][0] for s in shards),
        tuple(dues),
    )


#: Default length (ms) of a due-time slice whose keyless messages go to one master
#: (:func:`sliced_shard`; ``bench/redis_cluster_fire.py --slices``).
KEYLESS_SLICE_MS = 8
#: Keyless messages of one slice that one master takes before the next master takes
#: the next run (so a burst due at one instant spreads over every master and its
#: shards: a master fires ~10k messages/s, and a run of 64 per 8 ms slice is 8k/s).
SLICE_RUN = 64


#: Due slices whose placement counts a client keeps before starting them afresh.
SLICES_KEPT = 4096


def slice_counts(counts: dict[int, int]) -> dict[int, int]:
    """``counts`` (a client's keyless messages placed per due slice, kept across its
    sends) ready for one more send: started afresh once they name more than
    :data:`SLICES_KEPT` slices (bounded; a restarted count only moves placement)."""
    if len(counts) > SLICES_KEPT:
        counts.clear()
    return counts


def slice_turns(masters: Sequence[Sequence[int]]) -> list[int]:
    """Where :func:`sliced_shard` puts the first :data:`SLICE_RUN` messages of slice
    ``s``: ``turns[s % len(turns)]`` (empty when the masters hold different numbers of
    shards: then ask :func:`sliced_shard` each time)."""
    n, m = len(masters), len(masters[0])
    if any(len(g) != m for g in masters):
        return []
    return [masters[x % n][(x // n) % m] for x in range(n * m)]


def sliced_shard(
    due: int, masters: Sequence[Sequence[int]], slice_ms: int, placed: dict[int, int]
) -> int:
    """The shard of a keyless message due at ``due`` when keyless messages are placed by
    due time (issue 19): the messages due in one ``slice_ms`` slice lie on ONE shard of
    ONE master (slices take the masters in turn, and each master's turns its shards), so
    a firing pass at a due millisecond waits for one redis-server, not for every master
    to get a CPU in that millisecond, and fires and claims one shard there, as on one
    instance (a shard costs each pass a fixed part: four shards of a master per pass
    cost that master ~35 % more CPU per message). A slice with more than
    :data:`SLICE_RUN` messages (a burst due at one instant) moves on to the next master
    every run, then to each master's next shard: such a burst is spread like the even
    placement. Every client places a slice alike, whatever its batches.

    :param placed: keyless messages placed so far per slice (updated).
    """
    s = due // slice_ms
    k = placed.get(s, 0)
    placed[s] = k + 1
    run, n = k // SLICE_RUN, len(masters)
    mine = masters[(s + run) % n]
    return mine[(s // n + run // n) % len(mine)]


def abort_call(
    keys: Keyspace, msg_id: str | None, key: str | None, topic: str | None, retention_ms: int
) -> tuple[int, Call] | None:
    """The shard and ``abort.lua`` call of an abort by ``msg_id``, or by ``key`` on
    ``topic``; ``None`` for an id that names no message of this keyspace (NOT_FOUND)."""
    count = keys.shards
    if msg_id is not None:
        parsed = K.parse_id(msg_id, count)
        if parsed is None:
            return None
        shard, target, mode = parsed[0], parsed[1], "id"
    else:
        assert key is not None and topic is not None  # the base checked the arguments
        shard, target, mode = K.key_shard(topic, key, count), f"{topic}\0{key}", "key"
    args = (keys.bases[shard], mode, target, retention_ms)
    return shard, ("abort", keys.due_keys[shard], args)


def abort_result(shard: int, reply: Sequence[bytes]) -> AbortResult:
    """The answer of an ``abort.lua`` reply ``(status, n)`` on ``shard``."""
    status, n = reply
    if not n:
        return AbortResult(AbortStatus.NOT_FOUND, None)
    return AbortResult(_ABORT[status], K.make_id(shard, n.decode()))


def message_keys(keys: Keyspace, shard: int, n: str) -> tuple[str, str, str]:
    """Where message ``n`` of ``shard`` lives: its pending bucket hash (field ``n``), its
    hash once fired or aborted, and its body string once fired or aborted. Read them in
    this order: a fire may move the record to the hash in between."""
    base = keys.bases[shard]
    return (
        f"{base}{K.PENDING}{int(n) // K.PENDING_BUCKET}",
        f"{base}{K.MESSAGE}{n}",
        f"{base}{K.BODY}{n}",
    )


def retry_groups(fields: Mapping[bytes, bytes]) -> list[str]:
    """The groups of a fired message's hash whose retry is pending (their due time is
    the score of ``"<n>|<group>"`` in the shard's due index)."""
    return [name[1:].decode() for name, v in fields.items() if name[:1] == b"G" and v[:1] == b"P"]


def pending_calls(
    keys: Keyspace, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
) -> list[Call]:
    """The ``pending.lua`` call of every shard."""
    lo = "-inf" if start_ms is None else str(int(start_ms))
    hi = "+inf" if end_ms is None else str(int(end_ms))
    return [
        ("pending", key, (base, lo, hi, limit, topic or ""))
        for base, key in zip(keys.bases, keys.due_keys, strict=True)
    ]


def pending_views(replies: Sequence[bytes], limit: int) -> list[MessageView]:
    """The first ``limit`` views, in due order, of every shard's ``pending.lua`` reply."""
    rows = []
    for s, packed in enumerate(replies):
        for row in msgpack.unpackb(packed, raw=True):
            rows.append((row[1], s, int(row[0]), row))
    rows.sort(key=lambda r: r[:3])
    return [pending_view(K.make_id(s, row[0].decode()), row) for _, s, _, row in rows[:limit]]


def stat_keys(keys: Keyspace) -> list[str]:
    """Every shard's ``stat`` hash (sum them with
    :func:`~broker_adapter.redis.views.build_stats`)."""
    return [base + K.STAT for base in keys.bases]
