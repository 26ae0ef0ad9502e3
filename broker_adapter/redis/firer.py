"""The firing threads of a Redis broker.

Every broker process fires (no leader): :class:`Firer` runs ``fire.lua`` on the
shards whose next due time or invisible-time deadline has come, in one pipeline,
and sleeps until the earliest time it knows of (on Redis Cluster optionally one
thread per master, a *group* of shards, whose pass waits for that master only). It
learns earlier times from this process's own sends and nacks at once, and from
other processes through the ``wake`` channel
(:class:`~broker_adapter.redis.listener.Listener`); a full sweep of every shard
each ``sweep_s`` covers a lost notification. Claims are atomic in Redis, so many
firers never fire one entry twice, and one dying loses nothing.

A pull with nothing to take does not wait for the thread: it takes the *fire duty*
(:meth:`Firer.take_duty`), waits until the earliest due time itself, and fires and
claims in one round trip (issue 16: one thread hand-off and one round trip less per
due millisecond). The threads then leave due messages to pulls for
:data:`DUTY_GRACE_MS` and keep the rest: invisible-time deadlines, sweeps, and due
messages no pull came for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import InvalidArgument
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.news import ReadyNews, others_listen
from broker_adapter.redis.scripts import Scripts, Step
from broker_adapter.timer_slack import tighten as tighten_timer_slack

_NEVER = float("inf")
#: Longest the firer sleeps before it reads the clock again (a step of the system
#: clock tells nobody: a forward one is seen within this, then fires what is due).
CLOCK_SLICE_S = 0.25
#: Broker ms the firing threads leave due messages to pulls once a pull fired them
#: (:meth:`Firer.take_duty`): while pulls keep firing, a thread wakes about this often
#: instead of once per due millisecond; when they stop (a dispatcher with no room),
#: a due message waits at most this long for a thread.
DUTY_GRACE_MS = 20


class Firer:
    """Fires due messages of one broker's shards on a background thread.

    :param scripts: the broker's scripts (``fire.lua``).
    :param client: its Redis client (to count the listeners of the ``ready`` channel).
    :param keys: its keyspace: the shards to fire.
    :param clock: broker time.
    :param news: told which shards got ready messages; its origin tags published news.
    :param flush_acks: writes the acks answered so far (before a pass expires deliveries).
    :param retention_ms: how long fired messages stay readable.
    :param chunk: most entries one shard fires per call.
    :param sweep_s: real seconds between full sweeps of every shard.
    :param tick_ms: least broker time between two passes (a pass fires every shard
        that is due, so under load one pass serves many shards).
    :param groups: the shards each firing thread serves (default: one thread, every
        shard); every shard in exactly one group. A stale grouping (slots moved) only
        costs parallelism: each call still goes where its keys are.
    :raises InvalidArgument: for groups that do not cover every shard exactly once.
    """

    def __init__(
        self,
        scripts: Scripts,
        client: Any,
        keys: Keyspace,
        clock: Clock,
        news: ReadyNews,
        flush_acks: Callable[[], None],
        *,
        retention_ms: int,
        chunk: int = 1000,
        sweep_s: float = 1.0,
        tick_ms: int = 1,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self._scripts = scripts
        self._client = client
        self._keys = keys
        self._clock = clock
        self._news = news
        self._flush_acks = flush_acks
        self._retention_ms = retention_ms
        self._chunk = chunk
        self._sweep_s = sweep_s
        self._tick_ms = tick_ms
        # The system clock's ms reading floors (issue 16): sleep by time.time() instead.
        self._wall = isinstance(clock, SystemClock)
        n = keys.shards
        self._heads: list[float] = [0.0] * n  # 0: look at once
        self._deadlines: list[float] = [_NEVER] * n
        self._groups = [list(g) for g in groups] if groups else [list(range(n))]
        self._group_of = [-1] * n
        for i, g in enumerate(self._groups):
            for s in g:
                if not 0 <= s < n or self._group_of[s] >= 0:
                    raise InvalidArgument(f"shard {s} in firing groups {groups!r}: not once")
                self._group_of[s] = i
        if -1 in self._group_of:
            raise InvalidArgument(f"firing groups {groups!r} miss a shard of {n}")
        lock = threading.Lock()  # one lock: every group's state is read by each pass
        self._cond = threading.Condition(lock)  # group 0's; _conds[i] wakes group i
        self._conds = [self._cond] + [threading.Condition(lock) for _ in self._groups[1:]]
        k = len(self._groups)
        self._kicked = [False] * k
        self._full = [True] * k
        self._planned = [0.0] * k
        self._closed = False
        self._active = False  # threads started: pulls may fire too
        self._duty: float | None = None  # the due time a waiting pull will fire
        self._pull_fired = -float(DUTY_GRACE_MS)  # broker ms of the last pull's firing
        # A thread's pass hides its shards' heads until it ends; a pull refused the duty
        # meanwhile is owed news then (else it slept until the grace ran out: ~20 ms).
        self._passing = 0
        self._owed = False
        self._publish = True  # until the first sweep has counted the listeners
        self.log = logging.getLogger("chronoq.broker_adapter.Firer")
        self.log.addHandler(logging.NullHandler())
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(i,),
                name="chronoq-redis-firer" + (f"-{i}" if i else ""),
                daemon=True,
            )
            for i in range(k)
        ]

    @property
    def groups(self) -> int:
        """How many firing threads (shard groups) there are."""
        return len(self._groups)

    def start(self) -> None:
        """Start the firing threads."""
        self._active = True
        for t in self._threads:
            t.start()

    @property
    def wall(self) -> bool:
        """Whether broker time is the system clock (a waiting pull may sleep until a
        due time; with another clock it fires only what is due already)."""
        return self._wall

    def take_duty(self, by_ms: float) -> float | None:
        """A waiting pull offers to fire: the earliest due time this firer knows of, if
        it is at or before ``by_ms`` and no other pull has the duty (the caller then
        waits until it, calls :meth:`pick_due` and :meth:`end_duty`); else ``None``."""
        with self._cond:
            if not self._active or self._closed or self._duty is not None:
                return None
            soonest = min(self._heads)
            if soonest > by_ms:
                if self._passing:
                    self._owed = True
                return None
            self._duty = soonest
            return soonest

    def end_duty(self, fired: bool) -> None:
        """The pull holding the duty is done; without ``fired`` (news came first) the
        threads plan again, as if no pull had offered."""
        with self._cond:
            self._duty = None
            if not fired:
                self._pull_fired = -float(DUTY_GRACE_MS)
                for g, cond in enumerate(self._conds):
                    self._kicked[g] = True
                    cond.notify()

    def pick_due(self, now: int) -> list[int]:
        """The shards due at ``now``, for a pull to fire (:meth:`fire_step`, then
        :meth:`fired`); the threads leave them alone until then."""
        heads = self._heads
        with self._cond:
            shards = [s for s, h in enumerate(heads) if h <= now]
            for s in shards:
                heads[s] = _NEVER
            if self._wall:  # a manual clock's tests expect the threads to fire as always
                self._pull_fired = now
        return shards

    def fire_step(self, shards: list[int], scans: list[bool], now: int) -> Step:
        """The ``fire.lua`` step for ``shards`` (for :meth:`Scripts.fan_steps`)."""
        keys = self._keys
        return (
            "fire",
            shards,
            (
                now,
                self._chunk,
                self._retention_ms,
                keys.ready_channel if self._publish else "",
                self._news.origin,
            ),
            [(keys.bases[s], s, 1 if scan else 0) for s, scan in zip(shards, scans, strict=True)],
        )

    def fired(self, shards: list[int], results: list[Any], now: int) -> list[int]:
        """Note the replies of a fire step (next due times, deadlines); the shards where
        anything moved."""
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
            # A pull may have taken the duty while this pass hid these shards' heads,
            # for a later head it could see: it sleeps until that one, and the threads
            # leave the due shards to it meanwhile (a 100 ms stall with due slices).
            duty = self._duty
            earlier = duty is not None and min(self._heads[s] for s in shards) < duty
        if earlier:
            self._news.tell(())  # the pull holding the duty looks again
        return moved_in

    def not_fired(self, shards: list[int], scans: list[bool]) -> None:
        """A fire step failed: look at its shards again next time."""
        with self._cond:
            for s, scan in zip(shards, scans, strict=True):
                self._heads[s] = 0.0
                if scan:
                    self._deadlines[s] = 0.0

    def _wake(self, shard: int, at_ms: float) -> None:
        """Kick the group of ``shard`` if it plans to sleep past ``at_ms`` (lock held)."""
        g = self._group_of[shard]
        if at_ms < self._planned[g]:
            self._kicked[g] = True
            self._conds[g].notify()

    def note_due(self, shard: int, due_ms: int) -> None:
        """Shard ``shard`` has an entry due at ``due_ms``; wake up earlier if needed."""
        with self._cond:
            self._heads[shard] = min(self._heads[shard], due_ms)
            self._wake(shard, due_ms)
            duty = self._duty
        if duty is not None and due_ms < duty:
            self._news.tell(())  # the pull waiting to fire at ``duty`` looks again

    def next_due(self, shard: int) -> float:
        """The earliest due time this firer knows of in ``shard`` (``0``: look at once,
        ``inf``: none known until the next sweep)."""
        with self._cond:
            return self._heads[shard]

    @property
    def publishing(self) -> bool:
        """Whether a pass publishes ready news (another process listens, as of the last
        :meth:`check_listeners`)."""
        return self._publish

    def note_deadline(self, shard: int, deadline_ms: int) -> None:
        """A delivery in ``shard`` becomes visible again at ``deadline_ms``."""
        with self._cond:
            self._deadlines[shard] = min(self._deadlines[shard], deadline_ms)
            self._wake(shard, deadline_ms)

    def kick(self) -> None:
        """Sweep every shard now (the clock jumped)."""
        with self._cond:
            for g, cond in enumerate(self._conds):
                self._full[g] = True
                self._kicked[g] = True
                cond.notify()

    def close(self) -> None:
        """Stop the threads (waits for their current passes)."""
        self._closed = True
        self.kick()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=10)

    def _pick(self, now: int, group: int | None) -> tuple[list[int], list[bool], bool]:
        """The shards to fire now; for each whether to look at its in-flight deadlines
        too (on a full sweep, or when one this process knows of passed); and whether
        the pass may expire deliveries (any of them looks)."""
        heads, deadlines = self._heads, self._deadlines
        with self._cond:
            picked = range(len(self._groups)) if group is None else (group,)
            full_in = set()
            for g in picked:
                if self._full[g]:
                    full_in.add(g)
                    self._full[g] = False
            shards: list[int] = []
            scans: list[bool] = []
            pulls = group is not None and self._pulls_fire(now)
            for g in picked:
                full = g in full_in
                for s in self._groups[g]:
                    h, d = heads[s], deadlines[s]
                    if not (full or (h <= now and not pulls) or d <= now):
                        continue
                    scan = full or d <= now
                    shards.append(s)
                    scans.append(scan)
                    heads[s] = _NEVER
                    if scan:
                        deadlines[s] = _NEVER
            if shards:
                self._passing += 1  # until fire_once's pass ends (_pass_ended)
        return shards, scans, any(scans)

    def _pass_ended(self) -> None:
        """A thread's pass (picked by :meth:`_pick`) is over: its shards' heads are known
        again, so a pull refused the duty meanwhile looks again."""
        with self._cond:
            self._passing -= 1
            owed = self._owed and not self._passing
            if owed:
                self._owed = False
        if owed:
            self._news.tell(())

    def _pulls_fire(self, now: float) -> bool:
        """Whether due messages are left to pulls now (lock held)."""
        return self._duty is not None or now < self._pull_fired + DUTY_GRACE_MS

    def check_listeners(self) -> None:
        """Publish ready news only when another process listens (see
        :func:`~broker_adapter.redis.news.others_listen`). Each sweep checks again, so
        a process that subscribes later is heard from the next sweep on; until then its
        waiting pulls look every ``RECHECK_S``."""
        self._publish = others_listen(self._client, self._keys.ready_channel, self._scripts.cluster)

    def fire_once(self, group: int | None = None) -> int:
        """One pass over the shards that need it (of ``group`` only, or of every group);
        returns how many messages moved."""
        keys = self._keys
        now = self._clock.now_ms()
        shards, scans, expiring = self._pick(now, group)
        if not shards:
            return 0
        try:
            if expiring:
                # This pass may expire deliveries: acks this process already answered
                # True for must land first, or an acked message would come back.
                self._flush_acks()
            name, _, common, per = self.fire_step(shards, scans, now)
            try:
                results = self._scripts.fan(name, [keys.due_keys[s] for s in shards], common, per)
            except Exception:
                self.not_fired(shards, scans)
                raise
            moved_in = self.fired(shards, results, now)
        finally:
            self._pass_ended()
        if moved_in:
            self._news.tell(moved_in)  # other processes hear it from fire.lua
        return sum(r[0] for r in results)

    def _run(self, g: int) -> None:
        """Group ``g``'s thread: pass, then sleep until its earliest known time."""
        tighten_timer_slack()  # wake at a due millisecond, not 50 us after it (Linux)
        last_full = time.monotonic()
        mine, cond = self._groups[g], self._conds[g]
        while not self._closed:
            try:
                if time.monotonic() - last_full >= self._sweep_s:
                    last_full = time.monotonic()
                    if g == 0:
                        self.check_listeners()
                    with self._cond:
                        self._full[g] = True
                started = self._clock.now_ms()
                self.fire_once(g)
                now = self._clock.now_ms()
                with self._cond:
                    head = min(self._heads[s] for s in mine)
                    if self._pulls_fire(now):  # pulls fire these: look back after the grace
                        head = max(head, self._pull_fired + DUTY_GRACE_MS)
                    soonest = min(head, min(self._deadlines[s] for s in mine))
                    if self._full[g] or (soonest <= now and now >= started + self._tick_ms):
                        continue
                    soonest = max(soonest, started + self._tick_ms)
                    self._planned[g] = soonest
                    if not self._kicked[g]:
                        timeout = min(
                            (soonest - now) / 1000,
                            self._sweep_s - (time.monotonic() - last_full),
                            CLOCK_SLICE_S,
                        )
                        if self._wall:  # the ms reading floors: wake at the ms's start
                            timeout = min(timeout, soonest / 1000 - time.time())
                        if timeout > 0:
                            cond.wait(timeout)
                    self._kicked[g] = False
                    self._planned[g] = 0.0
            except Exception:  # the firer must keep going: log, back off, sweep again
                if self._closed:
                    return
                self.log.warning("firing pass failed; retrying", exc_info=True)
                time.sleep(0.2)
                with self._cond:
                    self._full[g] = True
