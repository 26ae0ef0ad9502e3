"""RedisBroker: the ``BrokerAdapter`` contract on Redis, one instance or a Cluster.

The scale-out path: schedulers, dispatchers and firing processes on many machines
share one Redis (``redis://``, ``rediss://``) or Redis Cluster (``redis+cluster://``).
Every multi-key step is one Lua script on one shard (see
:mod:`broker_adapter.redis.keys` for the keyspace, each ``*.lua`` header for the
keys it touches). Time comes from the injected clock and enters every script as
an argument (rate limits and semaphores on the system clock use the Redis server's
``TIME`` instead: one clock for all clients). Durability is Redis's: with ``appendonly yes`` and
``appendfsync always`` an acknowledged send survives a Redis crash.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import redis

from broker_adapter.adapter import AdapterBase, ConsumerLimits
from broker_adapter.base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_RETENTION_MS,
    Consumer,
    retry_topic,
)
from broker_adapter.checks import check_int, check_positive_settings
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.acks import AckBatcher
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
from broker_adapter.redis.connect import open_client
from broker_adapter.redis.consumer import RedisConsumer
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.listener import Listener
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.persistence import check_persistence
from broker_adapter.redis.runtime_methods import RedisRuntimeMethods
from broker_adapter.redis.scripts import Scripts, redis_errors
from broker_adapter.redis.views import build_stats, build_view, record_view
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    MessageView,
    SendResult,
)

log = logging.getLogger("chronoq.broker_adapter.RedisBroker")
log.addHandler(logging.NullHandler())


class RedisBroker(RedisRuntimeMethods, AdapterBase):
    """Timed messages on Redis; see :mod:`broker_adapter.redis.keys` for the keyspace.

    :param client: a ``redis.Redis`` or ``redis.RedisCluster`` (bytes replies).
    :param clock: time source (a ``ManualClock`` in tests).
    :param prefix: prefix of every key and channel.
    :param shards: due-index shards; every process on one prefix must agree. Default:
        :data:`~broker_adapter.redis.keys.DEFAULT_SHARDS` on a Redis Cluster (spread over
        the masters), :data:`~broker_adapter.redis.keys.SINGLE_SHARDS` on one instance,
        where scripts run one at a time anyway and every extra shard only adds a fixed
        cost to each firing pass, pull and ack batch.
    :param max_body_bytes: largest body (plus properties) accepted.
    :param max_delay_ms: the furthest ahead a message may be due.
    :param retention_ms: how long fired messages stay readable (Redis TTL, and the
        log new groups start from, by broker time).
    :param fire: run a firing thread in this process (default); ``False`` for
        processes that only send.
    :param fire_chunk: most entries one shard fires per script call.
    :param fire_per_master: on a cluster, one firing thread per master, whose passes
        wait for that master only. Off by default: on 2 shared cores it cost ~30 % more
        client CPU per message for no lateness gain (``bench/redis_cluster_fire.py
        --per-master``), and while consumers pull, their pulls fire the due messages
        (:meth:`Firer.take_duty <broker_adapter.redis.firer.Firer.take_duty>`): the
        threads keep deadlines, sweeps and what no pull comes for.
    :param keyless_slice_ms: on a cluster, keyless messages due within one slice of
        this many ms all go to one master, the masters in turn
        (:func:`~broker_adapter.redis.client_calls.sliced_shard`): a firing pass then
        waits for one redis-server instead of every master; a burst of one slice
        moves on to the next master every
        :data:`~broker_adapter.redis.client_calls.SLICE_RUN` messages. ``0``: spread
        each batch evenly over every shard (the placement before issue 19). Keyed
        messages go to their key's shard either way.
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
        fire: bool = True,
        fire_chunk: int = 1000,
        fire_per_master: bool = False,
        keyless_slice_ms: int = KEYLESS_SLICE_MS,
    ) -> None:
        keys = Keyspace.for_client(prefix, shards, cluster=isinstance(client, redis.RedisCluster))
        check_positive_settings(
            max_body_bytes=max_body_bytes,
            max_delay_ms=max_delay_ms,
            retention_ms=retention_ms,
            fire_chunk=fire_chunk,
        )
        self._slice_ms = check_int("keyless_slice_ms", keyless_slice_ms, minimum=0)
        self.max_body_bytes = max_body_bytes
        self._body_limit = max_body_bytes
        self._max_delay_ms = max_delay_ms
        self._retention_ms = retention_ms
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self._keys = keys
        self._scripts = Scripts(client)
        self._rr = 0  # the shard the next keyless batch starts in
        self._rr_lock = threading.Lock()
        # keyless messages placed per due slice, across batches (client_calls.sliced_shard)
        self._slice_counts: dict[int, int] = {}
        with redis_errors("connect"):
            self._scripts.load()
            # the shards of each master (one group on one instance); slots that move
            # later only cost speed, every call still goes where its keys are
            self._masters = self._scripts.by_node(keys.due_keys)
        check_persistence(client)  # one line per server and process if a crash loses sends
        self._news = ReadyNews(client, keys.ready_channel)
        self._acks = AckBatcher(self._scripts, keys)
        self._firer = Firer(
            self._scripts,
            client,
            keys,
            self._clock,
            self._news,
            self._acks.flush,
            retention_ms=retention_ms,
            chunk=fire_chunk,
            groups=self._masters if fire_per_master else None,
        )
        self._listener = Listener(client, keys, self._firer, self._news)
        with redis_errors("subscribe"):
            self._listener.start()
        self._fire = fire
        if fire:
            self._firer.start()
            self._clock.subscribe(self._firer.kick)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisBroker:
        """Open ``redis://``, ``rediss://``, ``redis+cluster://host:port`` (an entry node)
        or ``redis+sentinel://host:port[,host:port...]/service[/db]`` (the master Sentinel
        names, followed across failovers).

        Query parameters ``prefix``, ``shards``, ``max_body_bytes``, ``max_delay_ms``,
        ``retention_ms``, ``fire`` (0/1) and ``fire_chunk`` go to the broker; the rest to
        redis-py. Keyword arguments (e.g. ``clock=``) override them.

        :raises InvalidArgument: for a malformed parameter.
        :raises ConnectionFailed: when Redis cannot be reached.
        """
        client, opts = open_client(url)
        opts.update(kwargs)
        return cls(client, **opts)

    @property
    def keyspace(self) -> Keyspace:
        """Where this broker keeps its data: key bases, due keys and channels of each
        shard (for tools that look at Redis directly)."""
        return self._keys

    # -- sending ---------------------------------------------------------------------------

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`. One script call (one per master on a
        cluster) for every shard of the batch; every check is made before anything is
        written. Each message goes as one
        msgpack record packed here (``send.lua`` stores it as it is)."""
        keys = self._keys
        with self._rr_lock:
            rr = self._rr
            self._rr = (rr + 1) % keys.shards
        now = self._clock.now_ms()
        counts = slice_counts(self._slice_counts)
        plan = plan_send(
            messages, keys, now, self._max_delay_ms, rr, self._masters, self._slice_ms, counts
        )
        with redis_errors("send"):
            replies = self._scripts.fan("send", plan.due_keys, (keys.wake_channel,), plan.groups)
        results, wakes = plan.results(replies)
        for shard, due in wakes:
            self._firer.note_due(shard, due)
        return results

    def _flush(self, timeout_s: float) -> None:
        """See :meth:`BrokerAdapter.flush`; batched acks are written too."""
        super()._flush(timeout_s)
        with redis_errors("flush"):
            self._acks.flush()

    # -- aborting and reading --------------------------------------------------------------

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        call = abort_call(self._keys, msg_id, key, topic, self._retention_ms)
        if call is None:
            return AbortResult(AbortStatus.NOT_FOUND, msg_id)
        shard, (name, due_key, args) = call
        with redis_errors("abort"):
            reply = self._scripts.call(name, due_key, args)
        return abort_result(shard, reply)

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        keys = self._keys
        parsed = K.parse_id(msg_id, keys.shards)
        if parsed is None:
            return None
        shard, n = parsed
        bucket_key, message_key, body_key = message_keys(keys, shard, n)
        with redis_errors("query"):
            self._acks.flush()
            pipe = self._client.pipeline(transaction=False)
            pipe.hget(bucket_key, n)
            pipe.hgetall(message_key)
            pipe.strlen(body_key)
            record, fields, body_size = pipe.execute()
            if record is not None:
                return record_view(msg_id, record)
            if not fields:
                return None
            retry_due = {}
            for group in retry_groups(fields):
                score = self._client.zscore(keys.due_keys[shard], f"{n}|{group}")
                if score is not None:
                    retry_due[group] = int(score)
        return build_view(msg_id, fields, retry_due, int(body_size))

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        with redis_errors("pending"):
            self._acks.flush()
            replies = self._scripts.pipeline(
                pending_calls(self._keys, topic, start_ms, end_ms, limit)
            )
        return pending_views(replies, limit)

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        with redis_errors("stats"):
            self._acks.flush()
            pipe = self._client.pipeline(transaction=False)
            for key in stat_keys(self._keys):
                pipe.hgetall(key)
            hashes = pipe.execute()
        return build_stats(hashes)

    def _consumer(self, group: str, names: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`."""
        subscribed = (*names, retry_topic(group))
        keys = self._keys
        with redis_errors("consumer"):
            self._scripts.pipeline(
                [
                    ("register", key, (base, group, *subscribed))
                    for base, key in zip(keys.bases, keys.due_keys, strict=True)
                ]
            )
        return RedisConsumer(
            group,
            names,
            limits,
            scripts=self._scripts,
            keys=keys,
            clock=self._clock,
            acks=self._acks,
            firer=self._firer,
            news=self._news,
            retention_ms=self._retention_ms,
            check_open=self.check_open,
        )

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        if self._fire:
            self._clock.unsubscribe(self._firer.kick)
        self._firer.close()
        self._listener.close()
        self._acks.close()
        for c in self._news.watchers():
            if isinstance(c, RedisConsumer):
                c.close()  # the broker is closed: only marks it closed
        self._news.tell(())  # waiting pulls see that
        try:
            self._client.close()
            pool = getattr(self._client, "connection_pool", None)  # none on a cluster client
            manager = getattr(pool, "sentinel_manager", None)
            if manager is not None:  # a Sentinel's master: its Sentinel clients hold sockets
                for sentinel in manager.sentinels:
                    sentinel.close()
            if isinstance(self._client, redis.RedisCluster):
                # RedisCluster.close leaves its nodes' pooled sockets open (redis-py 8)
                for node in self._client.get_nodes():  # type: ignore[no-untyped-call]
                    if node.redis_connection is not None:
                        node.redis_connection.connection_pool.disconnect()
        except (redis.RedisError, OSError):
            log.debug("closing the Redis client failed", exc_info=True)
