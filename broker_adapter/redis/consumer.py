"""RedisConsumer: one member of a consumer group of a Redis broker.

A pull with nothing to take fires the next due messages itself and claims them
in the same round trip (:meth:`Firer.take_duty
<broker_adapter.redis.firer.Firer.take_duty>`). A pull claims the head of the
group's ready set in every shard that may have messages (``claim.lua``, one pipeline: claims are atomic, so members of one group
never get the same delivery), merges them by fire order, and gives back
(``release.lua``) what it may not hand out: past ``max_messages`` or flow
control, or past fire order across shards. What a
consumer holds is tracked here for flow control; the truth (in flight, deadline,
deliveries) is in Redis, so a consumer process that dies loses nothing: its
deliveries come back when their invisible time passes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from broker_adapter.adapter import ConsumerLimits
from broker_adapter.base import Consumer
from broker_adapter.checks import (
    check_pull_args,
)
from broker_adapter.clock import Clock
from broker_adapter.errors import BrokerClosed
from broker_adapter.redis.acks import AckBatcher
from broker_adapter.redis.consumer_give_back import GiveBackMethods
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.scripts import Scripts, Step, redis_errors
from broker_adapter.results import NO_PROPERTIES, ReceivedMessage
from broker_adapter.timer_slack import tighten as tighten_timer_slack

log = logging.getLogger("chronoq.broker_adapter.RedisConsumer")
log.addHandler(logging.NullHandler())

#: Real seconds a waiting pull goes without news before it looks at every shard.
RECHECK_S = 0.1


def _text(value: Any) -> str | None:
    return value.decode() if value else None


class RedisConsumer(GiveBackMethods, Consumer):
    """A member of consumer ``group`` on ``topics``; see :meth:`BrokerAdapter.consumer`.

    It watches ``news`` (which marks the shards to look at) from construction on.

    :param group: the group (registered in every shard already).
    :param topics: the topics it reads.
    :param limits: its checked limits.
    :param scripts: the broker's scripts.
    :param keys: the broker's keyspace.
    :param clock: broker time.
    :param acks: writes acks in batches.
    :param firer: told of new due times and deadlines (retries, claims).
    :param news: the ready news pulls wait on.
    :param retention_ms: how long fired messages stay readable.
    :param check_open: raises ``BrokerClosed`` once the broker is closed.
    """

    def __init__(
        self,
        group: str,
        topics: tuple[str, ...],
        limits: ConsumerLimits,
        *,
        scripts: Scripts,
        keys: Keyspace,
        clock: Clock,
        acks: AckBatcher,
        firer: Firer,
        news: ReadyNews,
        retention_ms: int,
        check_open: Callable[[], None],
    ) -> None:
        self.group = group
        self.topics = topics
        self.invisible_ms = limits.invisible_ms
        self.max_attempts = limits.max_attempts
        self.max_inflight = limits.max_inflight
        self.max_inflight_bytes = limits.max_inflight_bytes
        self._scripts = scripts
        self._keys = keys
        self._clock = clock
        self._acks = acks
        self._firer = firer
        self._news = news
        self._retention_ms = retention_ms
        self._check_open = check_open
        self._topic_names: dict[bytes, str] = {}
        self.closed = False
        self._lock = threading.Lock()
        # receipt -> (invisible deadline, size); the bytes total alongside
        self._held: dict[bytes, tuple[int, int]] = {}
        self._held_bytes = 0
        # shard -> news generation; shards not here have nothing ready for us
        self._dirty: dict[int, int] = dict.fromkeys(range(keys.shards), 0)
        self._gen = 0
        self._backlog = False  # plan pulls from a peek while messages pile up
        self._masters = scripts.by_node(keys.due_keys)  # the shards of each master
        self._master_of = {s: m for m, g in enumerate(self._masters) for s in g}
        news.watch(self)

    def _check(self) -> None:
        if self.closed:
            raise BrokerClosed(f"consumer of group {self.group!r} is closed")
        self._check_open()

    def mark(self, shards: Iterable[int]) -> None:
        """Shards that may have news for this consumer (called by its :class:`ReadyNews`)."""
        with self._lock:
            self._gen += 1
            for s in shards:
                self._dirty[s] = self._gen

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`."""
        check_pull_args(max_messages, wait_ms)
        self._check()
        deadline = time.monotonic() + wait_ms / 1000
        news = self._news
        fire: list[int] = []
        while True:
            epoch = news.epoch
            got = self._take(max_messages, fire)
            if got:
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed:
                return got
            step = min(remaining, RECHECK_S)
            fire = self._await_fire(epoch, step)
            if fire:
                continue
            if not news.wait_changed(epoch, step):
                self.mark(range(self._keys.shards))  # no news for a while: look everywhere
            self._check()

    def _await_fire(self, epoch: int, step_s: float) -> list[int]:
        """Take the fire duty if something is due within ``step_s`` (only what is due
        already with a clock other than the system's), wait until it (unless news
        comes first), and return the shards to fire then (none: wait for news)."""
        firer = self._firer
        wall = firer.wall
        now = self._clock.now_ms()
        due = firer.take_duty(now + step_s * 1000 if wall else now)
        if due is None:
            return []
        fire: list[int] = []
        try:
            if wall:
                timeout = due / 1000 - time.time()  # the ms reading floors: wake at its start
                if timeout > 0:
                    tighten_timer_slack()
                    if self._news.wait_changed(epoch, timeout):
                        return []  # news first: look at it (_take) before waiting again
                self._check()
            fire = firer.pick_due(self._clock.now_ms())
            return fire
        finally:
            firer.end_duty(bool(fire))

    def _expire_held(self, now: int) -> None:
        for receipt, (deadline, size) in list(self._held.items()):
            if deadline <= now:
                del self._held[receipt]
                self._held_bytes -= size

    def _take(self, max_messages: int, fire: list[int]) -> list[ReceivedMessage]:
        """Claim up to ``max_messages`` (firing the shards ``fire`` first, in the same
        round trip)."""
        keys = self._keys
        now = self._clock.now_ms()
        with self._lock:
            self._expire_held(now)
            room = min(max_messages, self.max_inflight - len(self._held))
            if room <= 0 or self._held_bytes >= self.max_inflight_bytes:
                room = 0
            seen = dict(self._dirty)
        if fire and (room == 0 or self._backlog):
            self._trip(fire, now, None)  # nothing to claim with it, or a plan from a peek
            fire = []
        if room == 0 or not (seen or fire):
            return []
        shards = sorted(seen.keys() | set(fire))
        deadline = now + self.invisible_ms
        bounded = not self._backlog
        if self._backlog:
            shares = self._plan(shards, room)
            if not shares:
                return []
        else:
            # Steady state: claim a share of the room in each shard, in one round trip.
            # What lies past the end of a full share may be older than another shard's
            # claims, so only claims up to the earliest full share's last score are kept
            # (fire order holds across shards); the rest goes back, and the next pulls
            # plan from a peek until the backlog is gone.
            shares = dict.fromkeys(shards, max(1, room // len(shards)))
        claim: Step = (
            "claim",
            list(shares),
            (self.group, deadline, self._retention_ms),
            [(keys.bases[s], n) for s, n in shares.items()],
        )
        replies = self._trip(fire, now, claim)
        rows: list[tuple[int, int, int, list[Any]]] = []
        bound = None
        with self._lock:
            for (s, share), claimed in zip(shares.items(), replies, strict=True):
                # a short claim emptied the shard's ready set: no news, no look there
                if len(claimed) < share and s in seen and self._dirty.get(s) == seen[s]:
                    del self._dirty[s]
                if bounded and len(claimed) >= share and len(shares) > 1:
                    self._backlog = True
                    if bound is None or claimed[-1][9] < bound:
                        bound = claimed[-1][9]
                rows.extend((row[9], s, int(row[0]), row) for row in claimed)
        if not rows:
            return []
        rows.sort(key=lambda r: r[:3])
        keep: list[tuple[int, list[Any]]] = []
        back: dict[int, list[Any]] = {}
        total = self._held_bytes
        for score, s, _n, row in rows:
            size = len(row[2]) + (len(row[7]) if row[7] else 0)
            if (
                len(keep) >= room
                or (bound is not None and score > bound)
                or (keep and total + size > self.max_inflight_bytes)
            ):
                back.setdefault(s, []).extend((row[0], b"%d:%d" % (row[8], row[10]), score))
                continue
            total += size
            keep.append((s, row))
        if back:
            with redis_errors("pull"):
                self._scripts.pipeline(
                    [
                        ("release", keys.due_keys[s], (keys.bases[s], self.group, *triples))
                        for s, triples in back.items()
                    ]
                )
            self.mark(back)
        names = self._topic_names
        out: list[ReceivedMessage] = []
        with self._lock:
            for s, (n, topic, body, due, born, key, tags, props, att, _score, k) in keep:
                receipt = b"%d|%s|%d:%d" % (s, n, att, k)
                size = len(body) + (len(props) if props else 0)
                self._held[receipt] = (deadline, size)
                self._held_bytes += size
                tname = names.get(topic) or names.setdefault(topic, topic.decode())
                out.append(
                    ReceivedMessage(
                        f"{s}-{n.decode()}",
                        tname,
                        body,
                        due,
                        born,
                        att,
                        receipt,
                        _text(key),
                        _text(tags),
                        json.loads(props) if props else NO_PROPERTIES,
                    )
                )
        for s in {s for s, _ in keep}:
            self._firer.note_deadline(s, deadline)
        return out

    def _trip(self, fire: list[int], now: int, claim: Step | None) -> list[Any]:
        """One round trip (one ``pull.lua`` call per server): this group's queued acks,
        a firing pass over the shards ``fire`` (a pull's fire duty), then ``claim``.
        Returns the claim's replies (``[]`` without one); other consumers hear of what
        fired."""
        firer = self._firer
        scans = [False] * len(fire)  # invisible-time deadlines stay with the threads
        steps: list[Step] = []
        at = -1  # the fire step's index
        carry = None  # on a cluster: the acks of the masters this trip calls anyway
        if len(self._masters) > 1:
            calls = {self._master_of[s] for s in (*fire, *(claim[1] if claim else ()))}
            carry = {s for m in calls for s in self._masters[m]}
        try:
            with self._acks.carried(self.group, carry) as acks, redis_errors("pull"):
                if acks is not None:
                    steps.append(acks)
                if fire:
                    at = len(steps)
                    steps.append(firer.fire_step(fire, scans, now))
                if claim is not None:
                    steps.append(claim)
                replies = self._scripts.fan_steps(self._keys.due_keys, steps)
        except Exception:
            if fire:
                firer.not_fired(fire, scans)
            raise
        if fire:
            moved = firer.fired(fire, replies[at], now)
            if moved:
                self._news.tell(moved, skip=self)  # this pull claimed there already
        return replies[-1] if claim is not None else []

    def _plan(self, shards: list[int], room: int) -> dict[int, int]:
        """How many to claim in each shard so the pull takes the oldest ready messages
        across shards (from a peek of their ready scores); ends backlog mode when the
        peek shows less than a full pull. The byte limit is applied to what the claim
        returns (the excess goes back), so the peek reads no sizes."""
        keys = self._keys
        with redis_errors("pull"):
            peeks = self._scripts.fan(
                "peek",
                [keys.due_keys[s] for s in shards],
                (self.group, room),
                [(keys.bases[s],) for s in shards],
            )
        heads = sorted(
            (score, s) for s, scores in zip(shards, peeks, strict=True) for score in scores
        )
        if len(heads) < room:
            self._backlog = False
        shares: dict[int, int] = {}
        for _score, s in heads[:room]:
            shares[s] = shares.get(s, 0) + 1
        return shares

    def _parse(self, receipt: bytes) -> tuple[int, bytes, bytes] | None:
        """``(shard, n, b"deliveries:claim")`` of a receipt ``b"shard|n|deliveries:claim"``,
        or ``None`` if malformed."""
        try:
            shard_b, n, att = receipt.split(b"|")
            shard = int(shard_b)
        except (ValueError, AttributeError):
            return None
        return (shard, n, att) if 0 <= shard < self._keys.shards else None

    def _settle(self, receipt: bytes) -> tuple[int, bytes, bytes, bool] | None:
        """Forget a held receipt; ``(shard, n, deliveries, still in flight by what this
        consumer knows)``, or ``None`` if malformed."""
        parsed = self._parse(receipt)
        if parsed is None:
            return None
        shard, n, att = parsed
        with self._lock:
            entry = self._held.pop(receipt, None)
            full = len(self._held) + 1 >= self.max_inflight or (
                self._held_bytes >= self.max_inflight_bytes
            )
            if entry is not None:
                self._held_bytes -= entry[1]
        if entry is not None and full:
            self._news.tell(())  # a pull may be waiting for room
        return shard, n, att, entry is not None and entry[0] > self._clock.now_ms()

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        self._check()
        parsed = self._settle(message.receipt)
        if parsed is None:
            return False
        s, n, att, held = parsed
        if held:  # ours and visible to nobody else: answer now, write in the next batch
            self._acks.add(s, self.group, n, att)
            return True
        keys = self._keys
        with redis_errors("ack"):
            self._acks.flush()
            acked = self._scripts.fan(
                "ack_batch", [keys.due_keys[s]], (self.group,), [(keys.bases[s], 1, n, att)]
            )
            return bool(acked[0])

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`. With the broker closed already,
        its deliveries come back after their invisible time."""
        if self.closed:
            return
        self.closed = True
        self._news.unwatch(self)
        try:
            self._check_open()
        except BrokerClosed:
            return
        with self._lock:
            held = list(self._held)
        for receipt in held:
            try:
                self._give_back(receipt, 0, "consumer closed", dead=False)
            except Exception:  # closing must not fail; invisible time brings them back
                log.warning("could not release %r of group %s", receipt, self.group, exc_info=True)

    def __repr__(self) -> str:
        return f"<RedisConsumer group={self.group!r} topics={self.topics!r}>"
