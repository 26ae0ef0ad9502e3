"""The firing thread and the pub/sub listener of a :class:`RedisBroker`.

Every broker process fires (no leader): :class:`Firer` runs ``fire.lua`` on the
shards whose next due time or invisible-time deadline has come, in one pipeline,
and sleeps until the earliest time it knows of. It learns earlier times from
this process's own sends and nacks at once, and from other processes through
the ``wake`` channel (:class:`Listener`); a full sweep of every shard each
``sweep_s`` covers a lost notification. Claims are atomic in Redis, so many
firers never fire one entry twice, and one dying loses nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

if TYPE_CHECKING:
    from broker_adapter.redis.broker import RedisBroker

_NEVER = float("inf")


class Firer:
    """Fires due messages of one broker's shards on a background thread.

    :param broker: the broker whose shards to fire.
    :param chunk: most entries one shard fires per call.
    :param sweep_s: real seconds between full sweeps of every shard.
    :param tick_ms: least broker time between two passes (a pass fires every shard
        that is due, so under load one pass serves many shards).
    """

    def __init__(
        self, broker: RedisBroker, chunk: int = 1000, sweep_s: float = 1.0, tick_ms: int = 1
    ) -> None:
        self._b = broker
        self._chunk = chunk
        self._sweep_s = sweep_s
        self._tick_ms = tick_ms
        n = len(broker.bases)
        self._heads: list[float] = [0.0] * n  # 0: look at once
        self._deadlines: list[float] = [_NEVER] * n
        self._cond = threading.Condition(threading.Lock())
        self._kicked = False
        self._full = True
        self._planned = 0.0
        self._closed = False
        self._publish = True  # until the first sweep has counted the listeners
        self.log = logging.getLogger("chronoq.broker_adapter.Firer")
        self.log.addHandler(logging.NullHandler())
        self._thread = threading.Thread(target=self._run, name="chronoq-redis-firer", daemon=True)

    def start(self) -> None:
        """Start the firing thread."""
        self._thread.start()

    def note_due(self, shard: int, due_ms: int) -> None:
        """Shard ``shard`` has an entry due at ``due_ms``; wake up earlier if needed."""
        with self._cond:
            self._heads[shard] = min(self._heads[shard], due_ms)
            if due_ms < self._planned:
                self._kicked = True
                self._cond.notify()

    def note_deadline(self, shard: int, deadline_ms: int) -> None:
        """A delivery in ``shard`` becomes visible again at ``deadline_ms``."""
        with self._cond:
            self._deadlines[shard] = min(self._deadlines[shard], deadline_ms)
            if deadline_ms < self._planned:
                self._kicked = True
                self._cond.notify()

    def kick(self) -> None:
        """Sweep every shard now (the clock jumped)."""
        with self._cond:
            self._full = True
            self._kicked = True
            self._cond.notify()

    def close(self) -> None:
        """Stop the thread (waits for the current pass)."""
        self._closed = True
        self.kick()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _pick(self, now: int) -> tuple[list[int], list[bool], bool]:
        """The shards to fire now; for each whether to look at its in-flight deadlines
        too (on a full sweep, or when one this process knows of passed); and whether
        the pass may expire deliveries (any of them looks)."""
        with self._cond:
            full = self._full
            self._full = False
            shards: list[int] = []
            scans: list[bool] = []
            for s, (h, d) in enumerate(zip(self._heads, self._deadlines, strict=True)):
                if full or h <= now or d <= now:
                    scan = full or d <= now
                    shards.append(s)
                    scans.append(scan)
                    self._heads[s] = _NEVER
                    if scan:
                        self._deadlines[s] = _NEVER
        return shards, scans, any(scans)

    def _check_listeners(self) -> None:
        """Publish ready news only when another process listens (on a cluster, the
        subscribers of every node are summed). A process that subscribes later is heard
        from the next sweep on; until then its waiting pulls look every ``RECHECK_S``."""
        b = self._b
        try:
            if b.scripts.cluster:
                listeners = 0
                for node in b.client.get_nodes():
                    counts = b.client.pubsub_numsub(b.ready_channel, target_nodes=node)
                    listeners += int(counts[0][1]) if counts else 0
            else:
                counts = b.client.pubsub_numsub(b.ready_channel)
                listeners = int(counts[0][1]) if counts else 0
            self._publish = listeners != 1  # 0: not even ours yet, publish to be safe
        except RedisError:
            self._publish = True

    def fire_once(self) -> int:
        """One pass over the shards that need it; returns how many messages moved."""
        b = self._b
        now = b.now_ms()
        shards, scans, expiring = self._pick(now)
        if not shards:
            return 0
        if expiring:
            # This pass may expire deliveries: acks this process already answered
            # True for must land first, or an acked message would come back.
            b.acks.flush()
        try:
            results = b.scripts.fan(
                "fire",
                [b.due_keys[s] for s in shards],
                (
                    now,
                    self._chunk,
                    b.retention_ms,
                    b.ready_channel if self._publish else "",
                    b.origin,
                ),
                [(b.bases[s], s, 1 if scan else 0) for s, scan in zip(shards, scans, strict=True)],
            )
        except Exception:
            with self._cond:  # look at them again next time
                for s, scan in zip(shards, scans, strict=True):
                    self._heads[s] = 0.0
                    if scan:
                        self._deadlines[s] = 0.0
            raise
        moved_in: list[int] = []
        with self._cond:
            for s, (moved, head, deadline, more) in zip(shards, results, strict=True):
                if moved:
                    moved_in.append(s)
                head = now if more else head
                if head >= 0 and head < self._heads[s]:
                    self._heads[s] = head
                if deadline >= 0 and deadline < self._deadlines[s]:
                    self._deadlines[s] = deadline
        if moved_in:
            b.notify_ready(moved_in)  # other processes hear it from fire.lua
        return sum(r[0] for r in results)

    def _run(self) -> None:
        last_full = time.monotonic()
        while not self._closed:
            try:
                if time.monotonic() - last_full >= self._sweep_s:
                    last_full = time.monotonic()
                    self._check_listeners()
                    with self._cond:
                        self._full = True
                started = self._b.now_ms()
                self.fire_once()
                now = self._b.now_ms()
                with self._cond:
                    soonest = min(min(self._heads), min(self._deadlines))
                    if self._full or (soonest <= now and now >= started + self._tick_ms):
                        continue
                    soonest = max(soonest, started + self._tick_ms)
                    self._planned = soonest
                    if not self._kicked:
                        timeout = min(
                            (soonest - now) / 1000, self._sweep_s - (time.monotonic() - last_full)
                        )
                        if timeout > 0:
                            self._cond.wait(timeout)
                    self._kicked = False
                    self._planned = 0.0
            except Exception:  # the firer must keep going: log, back off, sweep again
                if self._closed:
                    return
                self.log.warning("firing pass failed; retrying", exc_info=True)
                time.sleep(0.2)
                with self._cond:
                    self._full = True


class Listener:
    """Listens on the broker's ``wake`` and ``ready`` channels (other processes' news).

    :param broker: the broker to tell.
    """

    def __init__(self, broker: RedisBroker) -> None:
        self._b = broker
        self._closed = False
        self._pubsub: Any = None
        self.log = logging.getLogger("chronoq.broker_adapter.Listener")
        self.log.addHandler(logging.NullHandler())
        self._thread = threading.Thread(target=self._run, name="chronoq-redis-listen", daemon=True)

    def start(self) -> None:
        """Subscribe (before returning, so no news after this is missed) and start."""
        self._subscribe()
        self._thread.start()

    def _subscribe(self) -> None:
        ps = self._b.client.pubsub(ignore_subscribe_messages=True)
        ps.subscribe(self._b.wake_channel, self._b.ready_channel)
        self._pubsub = ps

    def close(self) -> None:
        """Stop listening."""
        self._closed = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            if self._pubsub is not None:
                self._pubsub.close()
        except (RedisError, OSError):
            pass

    def _handle(self, channel: bytes, data: bytes) -> None:
        b = self._b
        if channel == b.wake_channel_b:
            shard, _, due = data.partition(b":")
            s = int(shard)
            if 0 <= s < len(b.bases):
                b.firer.note_due(s, int(due))
        else:
            origin, _, shards = data.rpartition(b":")
            if origin != b.origin_b:  # our own news was told in process already
                b.notify_ready([int(s) for s in shards.split(b",") if s])

    def _run(self) -> None:
        while not self._closed:
            try:
                if self._pubsub is None:
                    self._subscribe()
                    self._b.notify_ready(range(len(self._b.bases)))  # news may be lost
                    self._b.firer.kick()
                msg = self._pubsub.get_message(timeout=0.2)
                if msg is not None and msg.get("type") == "message":
                    ch = msg["channel"]
                    self._handle(ch if isinstance(ch, bytes) else ch.encode(), msg["data"])
            except Exception:
                if self._closed:
                    return
                self.log.warning(
                    "pub/sub listener lost its connection; resubscribing", exc_info=True
                )
                try:
                    if self._pubsub is not None:
                        self._pubsub.close()
                except (RedisError, OSError):
                    pass
                self._pubsub = None
                time.sleep(0.2)
