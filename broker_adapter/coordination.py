"""Rate limits and semaphores held in one process: the state behind ``acquire_rate``,
``acquire_slot`` and ``release_slot`` of the brokers that live in one process (the
embedded broker, ``memory://``). A broker server answers these calls from its
broker, so the process that owns the data owns this state too and every client
shares it.

:class:`RateBuckets` is a GCRA (generic cell rate algorithm, the leaky bucket as a
meter): per bucket it keeps one number, the *theoretical arrival time* (TAT). With
``limit`` permits per ``period_ms`` the emission interval is ``T = period_ms / limit``
and the burst tolerance ``period_ms - T``: a permit is allowed when
``TAT - now <= period_ms - T`` (and then TAT moves to ``max(TAT, now) + T``), so an
idle bucket allows a burst of ``limit`` and then one permit every ``T``.

:class:`LeaseSemaphores` keeps, per semaphore, its holders and when each lease
expires; an expired lease counts as released (its holder died).

Both read time from a :class:`~broker_adapter.clock.Clock` (a ``ManualClock`` in
tests), are safe to call from several threads, and keep memory bounded: a bucket
whose TAT has passed is the same as a fresh one, and a semaphore whose leases all
expired the same as an empty one, so both are dropped by a sweep that runs once the
number of entries has doubled since the last one (amortised O(1) per call).
"""

from __future__ import annotations

import threading

from broker_adapter.clock import Clock

#: Entries kept before the first sweep for idle ones (then twice what the last sweep left).
SWEEP_FLOOR = 1_024
_NS = 1_000_000  # ns per ms


class RateBuckets:
    """GCRA rate limits by bucket name, in memory.

    :param clock: the time source (the broker's).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tat: dict[str, int] = {}  # bucket -> TAT in epoch ns
        self._sweep_at = SWEEP_FLOOR

    def acquire(self, bucket: str, limit: int, period_ms: int) -> int:
        """Take one permit of ``bucket`` (at most ``limit`` per ``period_ms``, bursts up to
        ``limit``): ``0`` when taken, else the ms to wait before one is free (nothing is
        taken). Arguments are checked by the caller (ints >= 1)."""
        # Integer nanoseconds: float epoch ms drift, and a drift of 1e-9 would refuse
        # the last permit of a burst.
        period = period_ms * _NS
        interval = max(period // limit, 1)
        tolerance = period - interval
        now = self._clock.now_ms() * _NS
        with self._lock:
            tat = max(self._tat.get(bucket, now), now)
            wait = tat - tolerance - now
            if wait > 0:
                return -(-wait // _NS)  # ceil: asking again then succeeds
            self._tat[bucket] = tat + interval
            if len(self._tat) >= self._sweep_at:
                self._sweep(now)
            return 0

    def __len__(self) -> int:
        """Buckets held (idle ones not swept yet included)."""
        return len(self._tat)

    def _sweep(self, now: int) -> None:
        """Drop the buckets that are full again (lock held)."""
        self._tat = {name: tat for name, tat in self._tat.items() if tat > now}
        self._sweep_at = max(SWEEP_FLOOR, 2 * len(self._tat))


class LeaseSemaphores:
    """Counting semaphores by name whose slots are leases that expire, in memory.

    :param clock: the time source (the broker's).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # name -> holder -> the broker time its lease ends at
        self._held: dict[str, dict[str, int]] = {}
        self._sweep_at = SWEEP_FLOOR

    def acquire(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """Take one of ``limit`` slots of ``name`` for ``holder`` until ``lease_ms`` from
        now: ``True`` when taken or when ``holder`` held one (its lease is renewed),
        ``False`` when ``limit`` unexpired leases are held by others."""
        now = self._clock.now_ms()
        with self._lock:
            holders = self._live(name, now)
            if holder not in holders and len(holders) >= limit:
                return False
            holders[holder] = now + lease_ms
            self._held[name] = holders
            if len(self._held) >= self._sweep_at:
                self._sweep(now)
            return True

    def release(self, name: str, holder: str) -> bool:
        """Give back ``holder``'s slot of ``name``: ``True`` when it held an unexpired
        lease, else ``False`` (nothing changes)."""
        now = self._clock.now_ms()
        with self._lock:
            holders = self._live(name, now)
            found = holders.pop(holder, None) is not None
            if not holders:
                self._held.pop(name, None)
            return found

    def holders(self, name: str) -> list[str]:
        """The holders of unexpired leases of ``name`` (for tools and tests)."""
        now = self._clock.now_ms()
        with self._lock:
            return sorted(self._live(name, now))

    def __len__(self) -> int:
        """Semaphores held (ones whose leases all expired, not swept yet, included)."""
        return len(self._held)

    def _live(self, name: str, now: int) -> dict[str, int]:
        """The unexpired leases of ``name``, expired ones dropped (lock held)."""
        holders = self._held.get(name)
        if holders is None:
            return {}
        if any(end <= now for end in holders.values()):
            holders = {h: end for h, end in holders.items() if end > now}
            if holders:
                self._held[name] = holders
            else:
                del self._held[name]
        return holders

    def _sweep(self, now: int) -> None:
        """Drop the semaphores whose leases all expired (lock held)."""
        self._held = {
            name: holders
            for name, holders in self._held.items()
            if any(end > now for end in holders.values())
        }
        self._sweep_at = max(SWEEP_FLOOR, 2 * len(self._held))


__all__ = ["SWEEP_FLOOR", "LeaseSemaphores", "RateBuckets"]
