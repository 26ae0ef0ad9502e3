"""RedisBroker: the ``BrokerAdapter`` contract on Redis, one instance or a Cluster.

The scale-out path: schedulers, dispatchers and firing processes on many machines
share one Redis (``redis://``, ``rediss://``) or Redis Cluster (``redis+cluster://``).
Every multi-key step is one Lua script on one shard (see
:mod:`broker_adapter.redis.keys` for the keyspace, each ``*.lua`` header for the
keys it touches). Time comes from the injected clock and enters every script as
an argument. Durability is Redis's: with ``appendonly yes`` and
``appendfsync always`` an acknowledged send survives a Redis crash.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import msgpack
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
from broker_adapter.errors import InvalidDelay
from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.acks import AckBatcher
from broker_adapter.redis.connect import open_client
from broker_adapter.redis.consumer import RedisConsumer
from broker_adapter.redis.firer import Firer, Listener
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.scripts import Call, Scripts, redis_errors
from broker_adapter.redis.views import build_stats, build_view, pending_view, record_view
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    MessageView,
    SendResult,
    SendStatus,
)

log = logging.getLogger("chronoq.broker_adapter.RedisBroker")
log.addHandler(logging.NullHandler())

_ABORT = {
    b"A": AbortStatus.ABORTED,
    b"D": AbortStatus.ALREADY_DELIVERED,
    b"N": AbortStatus.NOT_FOUND,
}


class RedisBroker(AdapterBase):
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
    ) -> None:
        if shards is None:
            shards = K.DEFAULT_SHARDS if isinstance(client, redis.RedisCluster) else K.SINGLE_SHARDS
        check_int("shards", shards, maximum=K.MAX_SHARDS)
        check_positive_settings(
            max_body_bytes=max_body_bytes,
            max_delay_ms=max_delay_ms,
            retention_ms=retention_ms,
            fire_chunk=fire_chunk,
        )
        self.max_body_bytes = max_body_bytes
        self._max_delay_ms = max_delay_ms
        self._retention_ms = retention_ms
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self._keys = keys = Keyspace.build(prefix, shards)
        self._scripts = Scripts(client)
        self._rr = 0  # the shard the next keyless batch starts in
        self._rr_lock = threading.Lock()
        with redis_errors("connect"):
            self._scripts.load()
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
        now = self._clock.now_ms()
        limit = now + self._max_delay_ms
        count = keys.shards
        with self._rr_lock:
            rr = self._rr
            self._rr = (rr + 1) % count
        pack = msgpack.Packer(use_bin_type=False).pack
        # per shard: message indexes, keyless counts per topic, the records
        per_shard: dict[int, tuple[list[int], dict[str, int], list[Any]]] = {}
        dues: list[int] = []
        keyless = sum(1 for m in messages if m.key is None) or 1
        j = 0
        for i, m in enumerate(messages):
            props = m.properties_bytes() if m.properties else b""
            at = m.deliver_at_ms
            due = max(now, at) if at is not None else m.deliver_at(now)
            if due > limit:
                raise InvalidDelay(
                    "delay",
                    due - now,
                    f"due after the broker's max delay of {self._max_delay_ms} ms",
                )
            dues.append(due)
            key = m.key
            if key is None:
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
                    b"%015d-" % due
                    + pack((m.topic, due, now, "", m.tags or "", props, m.body, due))
                )
            else:
                entry[2].append(
                    b"%015dk" % due
                    + pack(
                        (
                            m.topic,
                            due,
                            now,
                            key,
                            m.tags or "",
                            props,
                            m.body,
                            at if at is not None else due,
                        )
                    )
                )
        shards = list(per_shard)
        groups: list[list[Any]] = []
        for s in shards:
            _idx, topics, records = per_shard[s]
            group: list[Any] = [keys.bases[s], s, len(topics), len(records)]
            for topic, c in topics.items():
                group += (topic, c)
            group += records
            groups.append(group)
        with redis_errors("send"):
            replies = self._scripts.fan(
                "send", [keys.due_keys[s] for s in shards], (keys.wake_channel,), groups
            )
        results: list[SendResult] = [None] * len(messages)  # type: ignore[list-item]
        ok, duplicate = SendStatus.OK, SendStatus.DUPLICATE
        for s, (last, wake, dups) in zip(shards, replies, strict=True):
            idx = per_shard[s][0]
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
                self._firer.note_due(s, wake)
        return results

    def _flush(self, timeout_s: float) -> None:
        """See :meth:`BrokerAdapter.flush`; batched acks are written too."""
        super()._flush(timeout_s)
        with redis_errors("flush"):
            self._acks.flush()

    # -- aborting and reading --------------------------------------------------------------

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        keys = self._keys
        count = keys.shards
        if msg_id is not None:
            parsed = K.parse_id(msg_id, count)
            if parsed is None:
                return AbortResult(AbortStatus.NOT_FOUND, msg_id)
            shard, target, mode = parsed[0], parsed[1], "id"
        else:
            assert key is not None and topic is not None
            shard, target, mode = K.key_shard(topic, key, count), f"{topic}\0{key}", "key"
        with redis_errors("abort"):
            status, n = self._scripts.call(
                "abort", keys.due_keys[shard], (keys.bases[shard], mode, target, self._retention_ms)
            )
        if not n:
            return AbortResult(AbortStatus.NOT_FOUND, None)
        return AbortResult(_ABORT[status], K.make_id(shard, n.decode()))

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        keys = self._keys
        parsed = K.parse_id(msg_id, keys.shards)
        if parsed is None:
            return None
        shard, n = parsed
        base = keys.bases[shard]
        with redis_errors("query"):
            self._acks.flush()
            pipe = self._client.pipeline(transaction=False)
            # first: a fire may turn it into the hash
            pipe.hget(f"{base}{K.PENDING}{int(n) // K.PENDING_BUCKET}", n)
            pipe.hgetall(f"{base}{K.MESSAGE}{n}")
            pipe.strlen(f"{base}{K.BODY}{n}")
            record, fields, body_size = pipe.execute()
            if record is not None:
                return record_view(msg_id, record)
            if not fields:
                return None
            retry_due = {}
            for name, value in fields.items():
                if name[:1] == b"G" and value[:1] == b"P":
                    group = name[1:].decode()
                    score = self._client.zscore(keys.due_keys[shard], f"{n}|{group}")
                    if score is not None:
                        retry_due[group] = int(score)
        return build_view(msg_id, fields, retry_due, int(body_size))

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        lo = "-inf" if start_ms is None else str(int(start_ms))
        hi = "+inf" if end_ms is None else str(int(end_ms))
        calls: list[Call] = [
            ("pending", key, (base, lo, hi, limit, topic or ""))
            for base, key in zip(self._keys.bases, self._keys.due_keys, strict=True)
        ]
        with redis_errors("pending"):
            self._acks.flush()
            replies = self._scripts.pipeline(calls)
        rows = []
        for s, packed in enumerate(replies):
            for row in msgpack.unpackb(packed, raw=True):
                rows.append((row[1], s, int(row[0]), row))
        rows.sort(key=lambda r: r[:3])
        return [pending_view(K.make_id(s, row[0].decode()), row) for _, s, _, row in rows[:limit]]

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        with redis_errors("stats"):
            self._acks.flush()
            pipe = self._client.pipeline(transaction=False)
            for base in self._keys.bases:
                pipe.hgetall(base + K.STAT)
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
        except (redis.RedisError, OSError):
            log.debug("closing the Redis client failed", exc_info=True)
