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
import os
import threading
import weakref
from collections.abc import Iterable, Sequence
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
from broker_adapter.checks import check_positive_settings
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import InvalidArgument, InvalidDelay
from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.acks import AckBatcher
from broker_adapter.redis.connect import open_client
from broker_adapter.redis.consumer import RedisConsumer
from broker_adapter.redis.firer import Firer, Listener
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
        check_positive_settings(
            shards=shards,
            max_body_bytes=max_body_bytes,
            max_delay_ms=max_delay_ms,
            retention_ms=retention_ms,
            fire_chunk=fire_chunk,
        )
        if shards > K.MAX_SHARDS:
            raise InvalidArgument(f"shards must be at most {K.MAX_SHARDS}, got {shards}")
        self.log = logging.getLogger("chronoq.broker_adapter.RedisBroker")
        self.log.addHandler(logging.NullHandler())
        self.client = client
        self.clock: Clock = clock or SystemClock()
        self.prefix = prefix
        self.bases = K.shard_bases(prefix, shards)
        self.due_keys = tuple(base + K.DUE for base in self.bases)
        self.wake_channel = f"{prefix}:{K.WAKE_CHANNEL}"
        self.wake_channel_b = self.wake_channel.encode()
        self.ready_channel = f"{prefix}:{K.READY_CHANNEL}"
        self.origin = os.urandom(6).hex()
        self.origin_b = self.origin.encode()
        self.max_body_bytes = max_body_bytes
        self.max_delay_ms = max_delay_ms
        self.retention_ms = retention_ms
        self.topic_names: dict[bytes, str] = {}
        self.scripts = Scripts(client)
        self._rr = 0
        self._rr_lock = threading.Lock()
        self._ready = threading.Condition(threading.Lock())
        self.ready_epoch = 0
        self._consumers: weakref.WeakSet[RedisConsumer] = weakref.WeakSet()
        with redis_errors("connect"):
            self.scripts.load()
        self.acks = AckBatcher(self)
        self.firer = Firer(self, chunk=fire_chunk)
        self._listener = Listener(self)
        with redis_errors("subscribe"):
            self._listener.start()
        self._fire = fire
        if fire:
            self.firer.start()
            self.clock.subscribe(self.firer.kick)

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

    # -- helpers used by the consumer, firer and listener --------------------------------

    def now_ms(self) -> int:
        """Broker time (the injected clock), epoch ms."""
        return self.clock.now_ms()

    def notify_ready(self, shards: Iterable[int]) -> None:
        """Wake this process's pulls; ``shards`` may have new ready messages."""
        shards = list(shards)
        if shards:
            for c in list(self._consumers):
                c.mark(shards)
        with self._ready:
            self.ready_epoch += 1
            self._ready.notify_all()

    def announce_ready(self, shards: list[int]) -> None:
        """Tell pulls here and in every other process that ``shards`` have news."""
        self.notify_ready(shards)
        try:
            self.client.publish(self.ready_channel, f"{self.origin}:{','.join(map(str, shards))}")
        except redis.RedisError:
            self.log.warning("could not publish ready news", exc_info=True)

    def wait_ready(self, epoch: int, timeout_s: float) -> bool:
        """Wait until news after ``epoch`` (``True``) or ``timeout_s`` passed (``False``)."""
        with self._ready:
            if self.ready_epoch == epoch:
                self._ready.wait(timeout_s)
            return self.ready_epoch != epoch

    def forget(self, consumer: RedisConsumer) -> None:
        """A consumer closed."""
        self._consumers.discard(consumer)

    # -- sending ---------------------------------------------------------------------------

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`. One script call (one per master on a
        cluster) for every shard of the batch; every check is made before anything is
        written. Each message goes as one
        msgpack record packed here (``send.lua`` stores it as it is)."""
        now = self.now_ms()
        limit = now + self.max_delay_ms
        count = len(self.bases)
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
                    f"due after the broker's max delay of {self.max_delay_ms} ms",
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
            group: list[Any] = [self.bases[s], s, len(topics), len(records)]
            for topic, c in topics.items():
                group += (topic, c)
            group += records
            groups.append(group)
        with redis_errors("send"):
            replies = self.scripts.fan(
                "send", [self.due_keys[s] for s in shards], (self.wake_channel,), groups
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
                self.firer.note_due(s, wake)
        return results

    def _flush(self, timeout_s: float) -> None:
        """See :meth:`BrokerAdapter.flush`; batched acks are written too."""
        super()._flush(timeout_s)
        with redis_errors("flush"):
            self.acks.flush()

    # -- aborting and reading --------------------------------------------------------------

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        count = len(self.bases)
        if msg_id is not None:
            parsed = K.parse_id(msg_id, count)
            if parsed is None:
                return AbortResult(AbortStatus.NOT_FOUND, msg_id)
            shard, target, mode = parsed[0], parsed[1], "id"
        else:
            assert key is not None and topic is not None
            shard, target, mode = K.key_shard(topic, key, count), f"{topic}\0{key}", "key"
        with redis_errors("abort"):
            status, n = self.scripts.call(
                "abort", self.due_keys[shard], (self.bases[shard], mode, target, self.retention_ms)
            )
        if not n:
            return AbortResult(AbortStatus.NOT_FOUND, None)
        return AbortResult(_ABORT[status], K.make_id(shard, n.decode()))

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        parsed = K.parse_id(msg_id, len(self.bases))
        if parsed is None:
            return None
        shard, n = parsed
        base = self.bases[shard]
        with redis_errors("query"):
            self.acks.flush()
            pipe = self.client.pipeline(transaction=False)
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
                    score = self.client.zscore(self.due_keys[shard], f"{n}|{group}")
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
            for base, key in zip(self.bases, self.due_keys, strict=True)
        ]
        with redis_errors("pending"):
            self.acks.flush()
            replies = self.scripts.pipeline(calls)
        rows = []
        for s, packed in enumerate(replies):
            for row in msgpack.unpackb(packed, raw=True):
                rows.append((row[1], s, int(row[0]), row))
        rows.sort(key=lambda r: r[:3])
        return [pending_view(K.make_id(s, row[0].decode()), row) for _, s, _, row in rows[:limit]]

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        with redis_errors("stats"):
            self.acks.flush()
            pipe = self.client.pipeline(transaction=False)
            for base in self.bases:
                pipe.hgetall(base + K.STAT)
            hashes = pipe.execute()
        return build_stats(hashes)

    def _consumer(self, group: str, names: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`."""
        subscribed = (*names, retry_topic(group))
        with redis_errors("consumer"):
            self.scripts.pipeline(
                [
                    ("register", key, (base, group, *subscribed))
                    for base, key in zip(self.bases, self.due_keys, strict=True)
                ]
            )
        c = RedisConsumer(
            self,
            group,
            names,
            invisible_ms=limits.invisible_ms,
            max_attempts=limits.max_attempts,
            max_inflight=limits.max_inflight,
            max_inflight_bytes=limits.max_inflight_bytes,
        )
        self._consumers.add(c)
        return c

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        if self._fire:
            self.clock.unsubscribe(self.firer.kick)
        self.firer.close()
        self._listener.close()
        self.acks.close()
        for c in list(self._consumers):
            c.closed = True
        self.notify_ready(())
        try:
            self.client.close()
        except (redis.RedisError, OSError):
            self.log.debug("closing the Redis client failed", exc_info=True)
