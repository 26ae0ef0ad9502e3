"""The Redis keyspace of :class:`~broker_adapter.redis.broker.RedisBroker`.

Everything lives under ``<prefix>:{<tag>}:`` where ``<tag>`` names one of the
``N`` *shards* (default 12 on Redis Cluster, 1 on one instance). A shard's keys share one hash tag, so in Redis
Cluster every shard sits in one slot and every script touches one slot only.
Tags are chosen so shard ``i`` falls in the ``i``-th of ``N`` equal slot bands:
on a cluster made by ``redis-cli --cluster create`` (equal slot ranges) the
shards spread evenly over the masters. Per shard (``B`` = ``<prefix>:{<tag>}:``)::

    B due            zset   member "<n>" (first fire) or "<n>|<group>" (a group's retry),
                            score = due time (epoch ms): the shard's timing wheel
    B n              string counter: the last message number handed out in this shard
    B p:<n // 1024>  hash   pending messages: field "<n>" = the record packed by the sender,
                            15 digits of due ms, "k" (keyed) or "-", then msgpack [topic,
                            due, born, key, tags, props, body, asked due] ("" for none).
                            1,024 numbers share a hash (no key per pending message; a
                            batch is one HSET); a record becomes m:<n> and b:<n> when it
                            fires or is aborted.
    B b:<n>          string a fired or aborted message's body (apart, so the hash stays a
                            small listpack)
    B m:<n>          hash   a fired or aborted message: t topic, d due, o born, s state
                            (F fired, X aborted), k key, g tags, p props (JSON);
                            per group: G<group> = "<R|I|P|D|X><deliveries>" (ready,
                            in flight, pending retry, dead, done; I and X add
                            ":<claim>", the receipt's delivery), K<group> = claims so
                            far (each delivery's own number), C<group> = the topic it
                            counts under when not ``t`` (retry/DLQ topic), E<group> = last
                            error. Fired and aborted messages expire after ``retention_ms``.
    B k:<topic>\\0<key> string "<n>|<asked due ms>|<due ms>": the key index entry. No TTL
                            while its message is pending; ``retention_ms`` once it fired
                            or was aborted, so the index is bounded by the pending keyed
                            messages plus those of the last ``retention_ms``. A keyed send
                            is a DUPLICATE while the entry's message is pending, or fired
                            (not aborted) with the same asked due ms: for a fired one,
                            that holds for ``retention_ms`` after it fired.
    B groups         set    consumer groups with state in this shard
    B subs:<topic>   set    groups reading <topic>
    B log:<topic>    zset   fired messages of <topic> (score = due), kept ``retention_ms``
                            by broker time, so a new group starts at the oldest retained one
    B rdy:<group>    zset   fired, not yet pulled by <group> (score = due: fire order)
    B inf:<group>    zset   pulled by <group>, not acked (score = invisible-time deadline)
    B stat           hash   counters: "p|<topic>" pending, "f|<topic>" fired,
                            "r|<group>|<topic>" ready, "i|<group>|<topic>" in flight,
                            "a|<group>" acked, "d|<group>" dead. A topic is *known*
                            (``abort_prefix``/``find_pending`` do not raise UnknownTopic)
                            when some shard has its "p|" or "f|" field: every send writes
                            it and nothing deletes it, so the check costs the hot path
                            nothing.
    B kx             zset   the key lex index: score 0, member "<topic>\0<key>" of every
                            key whose entry ``k:`` names a pending or fired message (not
                            an aborted one), so ``ZRANGEBYLEX [<topic>\0<prefix>
                            (<topic>\0<prefix>\xff`` finds a topic's keys under a prefix
                            without SCAN. Written by send (a new keyed message), removed
                            by abort and abort_prefix, and by fire's trim once the
                            entry's retention ran out (stale members met by a reader are
                            skipped, and removed by abort_prefix).
    B kt             zset   the trim queue of ``kx``: member "<topic>\0<key>" of a fired
                            keyed message, score = when its ``k:`` entry expires (broker
                            time). ``fire.lua`` takes the members whose time has come:
                            an entry gone leaves ``kx``; one still alive (the clocks of
                            Redis and the broker differ) is queued again at its PTTL; one
                            pending again (re-sent) just leaves the queue.
    <prefix>:rl:<bucket>  string  a rate limit (``acquire_rate``): the GCRA's theoretical
                            arrival time (epoch ms, fractional); expires when the bucket
                            is full again, so idle buckets vanish.
    <prefix>:sem:<name>   zset    a semaphore (``acquire_slot``): member = holder, score =
                            its lease's end (epoch ms); expired leases are removed by
                            each call, and the key expires with its last lease.
                            Rate and semaphore scripts touch this one key, so on a
                            cluster each call is in one slot whatever the name.

Keyed messages go to shard ``crc32(topic NUL key) mod N`` (so the key index
and the message share a slot); others rotate over the shards. A message id is
``"<shard>-<n>"``. Pub/sub channels (not keys): ``<prefix>:wake`` carries
``"<shard>:<due ms>"`` when a send makes a shard's head earlier (firing
processes wake up), ``<prefix>:ready`` carries ``"<shard>,<shard>..."`` after a
fire (consumers wake up), prefixed by ``"<origin>:"`` (the broker instance that
fired, which skips its own news).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from broker_adapter.checks import check_int

#: Default prefix of every key and channel.
DEFAULT_PREFIX = "cq"
#: Default number of due-index shards on Redis Cluster (divides evenly over 1, 2, 3, 4 or
#: 6 masters).
DEFAULT_SHARDS = 12
#: Default number of shards on one instance: Redis runs one script at a time, so more
#: shards buy no parallelism and cost a fixed amount of work per shard in every pass.
SINGLE_SHARDS = 1
MAX_SHARDS = 1024

DUE = "due"
COUNTER = "n"
PENDING = "p:"
#: Message numbers per pending hash (``p:<n // PENDING_BUCKET>``); the scripts agree.
PENDING_BUCKET = 1024
MESSAGE = "m:"
KEY = "k:"
BODY = "b:"
GROUPS = "groups"
SUBS = "subs:"
LOG = "log:"
READY = "rdy:"
INFLIGHT = "inf:"
STAT = "stat"
KEY_LEX = "kx"
KEY_TRIM = "kt"
RATE = "rl:"
SEMAPHORE = "sem:"
WAKE_CHANNEL = "wake"
READY_CHANNEL = "ready"

_ID = re.compile(r"(\d{1,4})-([1-9]\d{0,15})")


@lru_cache(maxsize=64)
def shard_tags(count: int) -> tuple[str, ...]:
    """Hash tags for ``count`` shards; tag ``i`` hashes into slot band ``i`` of ``count``."""
    band = REDIS_CLUSTER_HASH_SLOTS / count
    tags: list[str] = []
    for i in range(count):
        lo, hi = int(i * band), int((i + 1) * band)
        j = 0
        while True:  # bounded: about 16384 / band tries on average
            tag = f"s{i}.{j}"
            if lo <= key_slot(tag.encode()) < hi:
                tags.append(tag)
                break
            j += 1
    return tuple(tags)


def shard_bases(prefix: str, count: int) -> tuple[str, ...]:
    """The key base ``<prefix>:{<tag>}:`` of each shard."""
    return tuple(f"{prefix}:{{{tag}}}:" for tag in shard_tags(count))


@dataclass(frozen=True, slots=True)
class Keyspace:
    """The keys and channels of one broker's prefix and shard count.

    :ivar prefix: the prefix of every key and channel.
    :ivar bases: each shard's key base ``<prefix>:{<tag>}:``.
    :ivar due_keys: each shard's due index (the key every script is called with).
    :ivar wake_channel: where a send tells firing processes of an earlier head.
    :ivar ready_channel: where a fire tells consumers of new ready messages.
    """

    prefix: str
    bases: tuple[str, ...]
    due_keys: tuple[str, ...]
    wake_channel: str
    ready_channel: str

    @classmethod
    def build(cls, prefix: str, shards: int) -> Keyspace:
        """The keyspace of ``shards`` shards under ``prefix``."""
        bases = shard_bases(prefix, shards)
        return cls(
            prefix,
            bases,
            tuple(base + DUE for base in bases),
            f"{prefix}:{WAKE_CHANNEL}",
            f"{prefix}:{READY_CHANNEL}",
        )

    @classmethod
    def for_client(cls, prefix: str, shards: int | None, *, cluster: bool) -> Keyspace:
        """The keyspace a broker on a Redis client uses: ``shards`` shards, by default
        :data:`DEFAULT_SHARDS` on a cluster and :data:`SINGLE_SHARDS` on one instance.

        :raises InvalidArgument: for ``shards`` not an int from 1 to :data:`MAX_SHARDS`.
        """
        if shards is None:
            shards = DEFAULT_SHARDS if cluster else SINGLE_SHARDS
        return cls.build(prefix, check_int("shards", shards, maximum=MAX_SHARDS))

    @property
    def shards(self) -> int:
        """The number of shards."""
        return len(self.bases)

    def rate_key(self, bucket: str) -> str:
        """The key of rate limit ``bucket``."""
        return f"{self.prefix}:{RATE}{bucket}"

    def slot_key(self, name: str) -> str:
        """The key of semaphore ``name``."""
        return f"{self.prefix}:{SEMAPHORE}{name}"


def key_shard(topic: str, key: str, count: int) -> int:
    """The shard of a keyed message (its key index lives there too)."""
    return zlib.crc32(f"{topic}\0{key}".encode()) % count


def make_id(shard: int, n: int | str) -> str:
    """The message id of message number ``n`` of ``shard``."""
    return f"{shard}-{n}"


def parse_id(msg_id: object, count: int) -> tuple[int, str] | None:
    """``(shard, n)`` of a well-formed id, else ``None``."""
    if not isinstance(msg_id, str):
        return None
    m = _ID.fullmatch(msg_id)
    if m is None or int(m.group(1)) >= count:
        return None
    return int(m.group(1)), m.group(2)
