"""AsyncRedisBroker: the awaitable client calls of the Redis broker, on ``redis.asyncio``.

It runs the scripts :class:`~broker_adapter.redis.broker.RedisBroker` runs, with the
same keys and arguments (both build them with
:mod:`~broker_adapter.redis.client_calls` and
:mod:`~broker_adapter.redis.runtime_calls`): a message it sends is one a sync broker
fires and delivers, a sync send is one it aborts, reschedules or queries. It sends,
changes pending messages and reads: firing and consuming stay with sync brokers
(dispatchers). A send or reschedule that makes a shard's head earlier wakes them as
a sync one does, by the script's publish on the wake channel.

One instance belongs to one event loop (its connections do). Concurrent sends share
script calls (:class:`~broker_adapter.redis.send_coalescer.SendCoalescer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from broker_adapter.async_base import AsyncAdapterBase
from broker_adapter.base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_RETENTION_MS,
    RESCHEDULE_PAST_TOLERANCE_MS,
)
from broker_adapter.checks import NewDue, check_int, check_positive_settings
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.async_scripts import AsyncScripts, open_async_client
from broker_adapter.redis.client_calls import (
    KEYLESS_SLICE_MS,
    abort_call,
    abort_result,
    message_keys,
    pending_calls,
    pending_views,
    plan_send,
    retry_groups,
    slice_counts,
    stat_keys,
)
from broker_adapter.redis.connect import parse_url
from broker_adapter.redis.dead_letters import (
    count_calls,
    counts_of,
    dead_calls,
    dead_page,
    settle_call,
    settle_calls,
)
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.runtime_calls import (
    PrefixAbort,
    find_calls,
    find_page,
    reschedule_call,
    reschedule_result,
)
from broker_adapter.redis.scripts import redis_errors
from broker_adapter.redis.send_coalescer import MAX_BATCH, SendCoalescer
from broker_adapter.redis.views import build_stats, build_view, record_view
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    DeadLetterPage,
    MessageView,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
    SendResult,
)

#: URL options of the sync broker that concern firing, which this client never does.
FIRING_OPTIONS = ("fire", "fire_chunk")


class AsyncRedisBroker(AsyncAdapterBase):
    """Send, abort, query, pending, stats, reschedule, abort_prefix and find_pending on
    Redis, awaited; see
    :class:`~broker_adapter.async_base.AsyncBrokerAdapter` for each call.

    :param client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (bytes
        replies), not yet used on another event loop.
    :param clock: time source; give it the clock the sync brokers on this prefix use.
    :param prefix: prefix of every key and channel (as the sync brokers').
    :param shards: due-index shards; every process on one prefix must agree. Default as
        :class:`~broker_adapter.redis.broker.RedisBroker`'s.
    :param max_body_bytes: largest body (plus properties) accepted.
    :param max_delay_ms: the furthest ahead a message may be due.
    :param retention_ms: how long an aborted message stays readable.
    :param max_batch: messages most coalesced script calls carry.
    :param closes: more ``redis.asyncio`` objects to close with the client (e.g. the
        ``Sentinel`` that names its master).
    :param keyless_slice_ms: on a cluster, where keyless messages go, as
        :class:`~broker_adapter.redis.broker.RedisBroker` places them (one master per
        due slice; ``0``: spread each batch evenly).
    :raises InvalidArgument: for a setting out of range.
    """

    def __init__(
        self,
        client: Any,
        *,
        clock: Clock | None = None,
        prefix: str = K.DEFAULT_PREFIX,
        shards: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        retention_ms: int = DEFAULT_RETENTION_MS,
        max_batch: int = MAX_BATCH,
        closes: Sequence[Any] = (),
        keyless_slice_ms: int = KEYLESS_SLICE_MS,
    ) -> None:
        keys = Keyspace.for_client(prefix, shards, cluster=isinstance(client, RedisCluster))
        check_positive_settings(
            max_body_bytes=max_body_bytes,
            max_delay_ms=max_delay_ms,
            retention_ms=retention_ms,
            max_batch=max_batch,
        )
        self.max_body_bytes = max_body_bytes
        self._body_limit = max_body_bytes
        self._max_delay_ms = max_delay_ms
        self._retention_ms = retention_ms
        self._client = client
        self._closes = tuple(closes)
        self._clock: Clock = clock or SystemClock()
        self._keys = keys
        self._scripts = AsyncScripts(client)
        self._slice_ms = check_int("keyless_slice_ms", keyless_slice_ms, minimum=0)
        self._rr = 0  # the shard the next keyless batch starts in (one loop: no lock)
        # keyless messages placed per due slice, and the shards of each master (learnt
        # at the first send: the slot map comes with the first command)
        self._slice_counts: dict[int, int] = {}
        self._masters: list[list[int]] | None = None
        self._sender = SendCoalescer(self._write, max_batch=max_batch)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncRedisBroker:
        """Open ``redis://``, ``rediss://``, ``redis+cluster://host:port`` (an entry node)
        or ``redis+sentinel://host:port[,host:port...]/service[/db]``: the URLs of
        :meth:`RedisBroker.from_url <broker_adapter.redis.broker.RedisBroker.from_url>`,
        with the same query parameters (``fire`` and ``fire_chunk`` are ignored: this
        client fires nothing). Keyword arguments (e.g. ``clock=``) override them.
        Nothing connects until the first call.

        :raises InvalidArgument: for a malformed parameter.
        """
        spec, opts = parse_url(url)
        for name in FIRING_OPTIONS:
            opts.pop(name, None)
        opts.update(kwargs)
        client, closes = open_async_client(spec)
        return cls(client, closes=closes, **opts)

    @property
    def keyspace(self) -> Keyspace:
        """Where this broker keeps its data (the sync broker's :attr:`keyspace`)."""
        return self._keys

    async def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        return await self._sender.send(messages)

    async def _write(self, messages: Sequence[Message]) -> list[SendResult]:
        """One ``send.lua`` batch, as :meth:`RedisBroker.send_batch` writes it."""
        keys = self._keys
        rr = self._rr
        self._rr = (rr + 1) % keys.shards
        with redis_errors("send"):
            if self._masters is None:
                await self._scripts.ready()
                self._masters = self._scripts.by_node(keys.due_keys)
        counts = slice_counts(self._slice_counts)
        plan = plan_send(
            messages,
            keys,
            self._clock.now_ms(),
            self._max_delay_ms,
            rr,
            self._masters,
            self._slice_ms,
            counts,
        )
        with redis_errors("send"):
            replies = await self._scripts.fan(
                "send", plan.due_keys, (keys.wake_channel,), plan.groups
            )
        return plan.results(replies)[0]  # the wake-ups went out on the wake channel

    async def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        call = abort_call(self._keys, msg_id, key, topic, self._retention_ms)
        if call is None:
            return AbortResult(AbortStatus.NOT_FOUND, msg_id)
        shard, (name, due_key, args) = call
        with redis_errors("abort"):
            reply = await self._scripts.call(name, due_key, args)
        return abort_result(shard, reply)

    async def _query(self, msg_id: str) -> MessageView | None:
        keys = self._keys
        parsed = K.parse_id(msg_id, keys.shards)
        if parsed is None:
            return None
        shard, n = parsed
        bucket_key, message_key, body_key = message_keys(keys, shard, n)
        with redis_errors("query"):
            await self._scripts.ready()
            pipe = self._client.pipeline(transaction=False)
            pipe.hget(bucket_key, n)
            pipe.hgetall(message_key)
            pipe.strlen(body_key)
            record, fields, body_size = await pipe.execute()
            if record is not None:
                return record_view(msg_id, record)
            if not fields:
                return None
            retry_due = {}
            for group in retry_groups(fields):
                score = await self._client.zscore(keys.due_keys[shard], f"{n}|{group}")
                if score is not None:
                    retry_due[group] = int(score)
        return build_view(msg_id, fields, retry_due, int(body_size))

    async def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        with redis_errors("pending"):
            replies = await self._scripts.pipeline(
                pending_calls(self._keys, topic, start_ms, end_ms, limit)
            )
        return pending_views(replies, limit)

    async def _stats(self) -> BrokerStats:
        with redis_errors("stats"):
            await self._scripts.ready()
            pipe = self._client.pipeline(transaction=False)
            for key in stat_keys(self._keys):
                pipe.hgetall(key)
            hashes = await pipe.execute()
        return build_stats(hashes)

    async def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        now = self._clock.now_ms()
        at = due.resolve(now, self._max_delay_ms, RESCHEDULE_PAST_TOLERANCE_MS)
        limit = self._body_limit
        call = reschedule_call(self._keys, msg_id, key, topic, at, body, limit, now)
        if call is None:
            return RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)
        shard, (name, due_key, args) = call
        with redis_errors("reschedule"):
            reply = await self._scripts.call(name, due_key, args)
        return reschedule_result(shard, msg_id, reply, limit)[0]  # firers hear the wake

    async def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        job = PrefixAbort(self._keys, topic, key_prefix, self._retention_ms)
        with redis_errors("abort_prefix"):
            while calls := job.calls():
                job.feed(await self._scripts.pipeline(calls))
        return job.result()

    async def _find_pending(
        self,
        topic: str | None,
        key_prefix: str | None,
        tag: str | None,
        start_ms: int | None,
        end_ms: int | None,
        limit: int,
        cursor: str | None,
        with_body: bool,
    ) -> PendingPage:
        calls = find_calls(
            self._keys, topic, key_prefix, tag, start_ms, end_ms, limit, cursor, with_body
        )
        with redis_errors("find_pending"):
            replies = await self._scripts.pipeline(calls)
        return find_page(replies, topic, limit, with_body)

    async def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        calls = dead_calls(self._keys, group, cursor, limit, with_body)
        with redis_errors("dead_letters"):
            replies = await self._scripts.pipeline(calls)
        return dead_page(replies, group, limit, with_body)

    async def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        return await self._settle_dead(group, "R", msg_ids, limit)

    async def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        return await self._settle_dead(group, "X", msg_ids, limit)

    async def _settle_dead(
        self, group: str, how: str, msg_ids: tuple[str, ...] | None, limit: int
    ) -> int:
        """As :meth:`RedisBroker._settle_dead <broker_adapter.redis.broker.RedisBroker>`."""
        keys, now = self._keys, self._clock.now_ms()
        with redis_errors("requeue_dead" if how == "R" else "purge_dead"):
            if msg_ids is not None:
                calls = settle_calls(keys, group, how, msg_ids, now, self._retention_ms)
                return sum(int(r) for r in await self._scripts.pipeline(calls))
            done = 0
            for shard in range(keys.shards):
                if done >= limit:
                    break
                call = settle_call(
                    keys, shard, group, how, limit - done, (), now, self._retention_ms
                )
                done += int(await self._scripts.call(*call))
            return done

    async def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        with redis_errors("count_pending"):
            replies = await self._scripts.pipeline(count_calls(self._keys, edges, topic))
        return counts_of(replies, len(edges) - 1, topic)

    async def _close(self) -> None:
        await self._sender.wait_idle()  # sends accepted before close are answered
        for resource in (self._client, *self._closes):
            try:
                await resource.aclose()
            except (RedisError, OSError):
                pass  # closing: a connection already gone is what we wanted


__all__ = ["AsyncRedisBroker"]
