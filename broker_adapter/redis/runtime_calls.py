"""The runtime calls of the Redis broker as data: reschedule, abort by key prefix, find
pending, rate limits and semaphores.

As :mod:`~broker_adapter.redis.client_calls` does for send and abort, these pure
functions build the script calls and decode their replies, so
:class:`~broker_adapter.redis.broker.RedisBroker` and
:class:`~broker_adapter.redis.async_broker.AsyncRedisBroker` make exactly the same
calls and each only moves the bytes. Every call is one Lua script on one shard
(``reschedule.lua``, ``abort_prefix.lua``, ``find.lua``) or on one key (``rate.lua``,
``slot.lua``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgpack

from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import InvalidArgument, MessageTooLarge, UnknownTopic
from broker_adapter.redis import keys as K
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.scripts import Call
from broker_adapter.redis.views import pending_view
from broker_adapter.results import (
    MAX_REPORTED_KEYS,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)

#: Most keys one round of ``abort_prefix.lua`` calls takes over all shards still going
#: (~15 us of Redis time each): a firer's call waits behind at most one round's share
#: of its Redis node, a few ms.
ABORT_CHUNK = 200
#: Fewest keys one call takes in one shard.
ABORT_MIN_CHUNK = 20
#: Most due-index entries one ``find.lua`` call looks at in one shard.
FIND_WORK = 1000
#: Most keys under a prefix ``find.lua`` gathers and sorts by due time; above that it
#: walks the due index and filters by key instead.
FIND_GATHER = 1000

_RESCHEDULE = {
    b"R": RescheduleStatus.RESCHEDULED,
    b"D": RescheduleStatus.ALREADY_DELIVERED,
    b"N": RescheduleStatus.NOT_FOUND,
}
_CURSOR = re.compile(r"(\d{1,16}):(\d{1,4}):([0-9A-Za-z_.|%-]{1,300})")

#: A position in the merged due order: (due ms, shard, due-index member).
Position = tuple[int, int, bytes]


# -- reschedule ------------------------------------------------------------------------


def reschedule_call(
    keys: Keyspace,
    msg_id: str | None,
    key: str | None,
    topic: str | None,
    due_ms: int,
    body: bytes | None,
    max_body_bytes: int,
    now_ms: int,
) -> tuple[int, Call] | None:
    """The shard and ``reschedule.lua`` call that moves a message by ``msg_id``, or by
    ``key`` on ``topic``, to ``due_ms`` at broker time ``now_ms`` (a message due by
    then is left to the firer: ``ALREADY_DELIVERED``); ``None`` for an id of no
    message here."""
    count = keys.shards
    if msg_id is not None:
        parsed = K.parse_id(msg_id, count)
        if parsed is None:
            return None
        shard, target, mode = parsed[0], parsed[1], "id"
    else:
        assert key is not None and topic is not None  # the base checked the arguments
        shard, target, mode = K.key_shard(topic, key, count), f"{topic}\0{key}", "key"
    args = (
        keys.bases[shard],
        mode,
        target,
        due_ms,
        "0" if body is None else "1",
        b"" if body is None else body,
        max_body_bytes,
        keys.wake_channel,
        shard,
        now_ms,
    )
    return shard, ("reschedule", keys.due_keys[shard], args)


def reschedule_result(
    shard: int, by_id: str | None, reply: Sequence[Any], max_body_bytes: int
) -> tuple[RescheduleResult, int]:
    """The answer of a ``reschedule.lua`` reply, and the shard's new head (``-1``: the
    head did not move earlier). ``by_id`` is the id asked for (``None``: by key).

    :raises MessageTooLarge: when the new body plus the message's properties is over
        ``max_body_bytes`` (the script changed nothing).
    """
    if reply[0] == b"T":
        raise MessageTooLarge(int(reply[1]), max_body_bytes)
    status, n, due, wake = reply
    outcome = _RESCHEDULE[status]
    if outcome is RescheduleStatus.NOT_FOUND:
        return RescheduleResult(outcome, by_id, None), -1
    return RescheduleResult(outcome, K.make_id(shard, n.decode()), int(due)), int(wake)


# -- abort by key prefix -----------------------------------------------------------------


class PrefixAbort:
    """The rounds of one ``abort_prefix``: each round is one ``abort_prefix.lua`` call
    per shard not yet done (``chunk`` keys shared among them, at least
    :data:`ABORT_MIN_CHUNK` each); feed the replies back until :meth:`calls` is empty,
    then read :meth:`result`.

    :param keys: the broker's keyspace.
    :param topic: the topic (checked).
    :param prefix: the key prefix (non-empty).
    :param retention_ms: how long aborted messages stay readable.
    :param chunk: most keys per round, shared by the shards still going.
    """

    def __init__(
        self, keys: Keyspace, topic: str, prefix: str, retention_ms: int, chunk: int = ABORT_CHUNK
    ) -> None:
        self._keys = keys
        self._topic = topic
        self._prefix = prefix
        self._retention = retention_ms
        self._chunk = chunk
        self._after: dict[int, bytes] = dict.fromkeys(range(keys.shards), b"")
        self._first = True
        self.aborted = 0
        # each shard answers its keys in key order: its first MAX_REPORTED_KEYS suffice
        self._fired: dict[int, list[bytes]] = {s: [] for s in self._after}
        self._fired_count = 0

    def calls(self) -> list[Call]:
        """The next round's calls, one per shard still going (``[]``: done)."""
        keys = self._keys
        per_shard = max(ABORT_MIN_CHUNK, self._chunk // max(1, len(self._after)))
        return [
            (
                "abort_prefix",
                keys.due_keys[s],
                (keys.bases[s], self._topic, self._prefix, after, per_shard, self._retention),
            )
            for s, after in self._after.items()
        ]

    def feed(self, replies: Sequence[Any]) -> None:
        """Take the replies of :meth:`calls` (same order).

        :raises UnknownTopic: after the first round, when no shard ever had a message
            of the topic (nothing was changed then: no key of it is indexed).
        """
        shards = list(self._after)
        known = False
        for s, (shard_known, aborted, fired, last, more) in zip(shards, replies, strict=True):
            known = known or bool(shard_known)
            self.aborted += int(aborted)
            self._fired_count += len(fired)
            kept = self._fired[s]
            kept.extend(fired[: MAX_REPORTED_KEYS - len(kept)])
            if int(more):
                self._after[s] = last
            else:
                del self._after[s]
        if self._first and not known:
            raise UnknownTopic(self._topic)
        self._first = False

    def result(self) -> PrefixAbortResult:
        """What the whole call did."""
        names = sorted(k for kept in self._fired.values() for k in kept)[:MAX_REPORTED_KEYS]
        return PrefixAbortResult(self.aborted, tuple(k.decode() for k in names), self._fired_count)


# -- find pending ------------------------------------------------------------------------


def encode_cursor(pos: Position) -> str:
    """The cursor of a position in the merged due order."""
    due, shard, member = pos
    return f"{due}:{shard}:{member.decode()}"


def decode_cursor(cursor: str, shards: int) -> Position:
    """The position a cursor of :func:`encode_cursor` records.

    :raises InvalidArgument: for a cursor this broker did not make.
    """
    m = _CURSOR.fullmatch(cursor)
    if m is None or int(m.group(2)) >= shards:
        raise InvalidArgument(
            f"cursor {cursor!r} is not one of this broker's find_pending cursors; pass "
            "back a page's cursor unchanged, or None for the first page"
        )
    return int(m.group(1)), int(m.group(2)), m.group(3).encode()


def find_calls(
    keys: Keyspace,
    topic: str | None,
    prefix: str | None,
    tag: str | None,
    start_ms: int | None,
    end_ms: int | None,
    limit: int,
    cursor: str | None,
    with_body: bool,
) -> list[Call]:
    """One ``find.lua`` call per shard (in shard order) for the page after ``cursor``.

    :raises InvalidArgument: for a malformed cursor.
    """
    pos = None if cursor is None else decode_cursor(cursor, keys.shards)
    # Each shard's rows beyond the earliest place any shard stopped are thrown away: ask
    # each for about twice its share, so a page is mostly full without reading (and
    # dropping) up to shards x limit rows. Pages may be short then; the cursor is exact.
    per_shard = min(limit, FIND_WORK, -(-2 * limit // keys.shards) + 4)
    common = (
        "+inf" if end_ms is None else end_ms,
        per_shard,
        FIND_WORK,
        topic or "",
        prefix or "",
        tag or "",
        "1" if with_body else "0",
        FIND_GATHER,
    )
    calls: list[Call] = []
    for s, (base, due_key) in enumerate(zip(keys.bases, keys.due_keys, strict=True)):
        calls.append(("find", due_key, (base, *resume_where(pos, s, start_ms), *common)))
    return calls


def resume_where(pos: Position | None, shard: int, start_ms: int | None = None) -> tuple[Any, ...]:
    """Where ``shard`` reads on after the merged position ``pos`` (``None``: from
    ``start_ms`` or the start): ``(mode, due, member)`` of ``find.lua``/``dead.lua``."""
    if pos is None or (start_ms is not None and start_ms > pos[0]):
        return (0, "-inf" if start_ms is None else start_ms, "")
    if shard < pos[1]:
        return (1, pos[0], "")  # this shard's entries at the position's due came before
    if shard > pos[1]:
        return (0, pos[0], "")
    return (2, pos[0], pos[2])


def merge_rows(
    replies: Sequence[bytes], limit: int
) -> tuple[bool, list[tuple[int, int, bytes, Any]], Position | None]:
    """Merge every shard's ``find.lua``/``dead.lua`` reply (shard order): whether any
    shard knows the topic, the rows ``(due, shard, member, row)`` up to the earliest
    position a shard stopped at (what lies beyond it is not known to be in order yet),
    the first ``limit`` of them, and the position the next page starts after."""
    known = False
    stops: list[Position] = []
    rows: list[tuple[int, int, bytes, Any]] = []
    for s, packed in enumerate(replies):
        shard_known, exhausted, due, member, shard_rows = msgpack.unpackb(packed, raw=True)
        known = known or bool(shard_known)
        if not exhausted:
            stops.append((int(due), s, member))
        rows.extend((int(row[1]), s, row[0], row) for row in shard_rows)
    stop = min(stops) if stops else None
    if stop is not None:
        rows = [r for r in rows if r[:3] <= stop]
    rows.sort(key=lambda r: r[:3])
    next_pos: Position | None = stop
    if len(rows) > limit:
        rows = rows[:limit]
        next_pos = rows[-1][:3]
    return known, rows, next_pos


def find_page(
    replies: Sequence[bytes], topic: str | None, limit: int, with_body: bool
) -> PendingPage:
    """Merge every shard's ``find.lua`` reply (shard order) into one page: the rows up
    to the earliest position a shard stopped at (what lies beyond it is not known to
    be in order yet), the first ``limit`` of them, and the cursor of that position.

    :raises UnknownTopic: for a ``topic`` no shard ever had a message of.
    """
    known, rows, next_pos = merge_rows(replies, limit)
    if topic is not None and not known:
        raise UnknownTopic(topic)
    messages = [
        pending_view(K.make_id(s, n.decode()), row, row[8] if with_body else None)
        for _, s, n, row in rows
    ]
    return PendingPage(messages, None if next_pos is None else encode_cursor(next_pos))


# -- rate limits and semaphores ------------------------------------------------------------


def limit_now(clock: Clock) -> int | str:
    """The time argument of ``rate.lua``/``slot.lua``: ``""`` (the Redis server's TIME,
    one clock for every client) with the system clock, else the injected clock's now
    (a test's ``ManualClock`` moves rate limits and leases as it moves due times)."""
    return "" if isinstance(clock, SystemClock) else clock.now_ms()


def rate_call(keys: Keyspace, bucket: str, limit: int, period_ms: int, clock: Clock) -> Call:
    """The ``rate.lua`` call taking one permit of ``bucket``."""
    key = keys.rate_key(bucket)
    return ("rate", key, (limit, period_ms, limit_now(clock)))


def slot_call(
    keys: Keyspace, op: str, name: str, holder: str, limit: int, lease_ms: int, clock: Clock
) -> Call:
    """The ``slot.lua`` call that acquires (``op="acquire"``) or releases a slot."""
    return ("slot", keys.slot_key(name), (op, holder, limit, lease_ms, limit_now(clock)))


__all__ = [
    "ABORT_CHUNK",
    "FIND_GATHER",
    "FIND_WORK",
    "PrefixAbort",
    "decode_cursor",
    "encode_cursor",
    "find_calls",
    "find_page",
    "limit_now",
    "rate_call",
    "reschedule_call",
    "reschedule_result",
    "slot_call",
]
