"""WheelWakes: when the embedded broker's wheel thread sleeps, and what wakes it.

A mixin of :class:`~broker_adapter.embedded.core.BrokerCore` (its methods are the
core's): the thread sleeps until its next due time, the next invisible-time
deadline or a kick (the clock moved, something due sooner was sent, the broker
closes). A pull that waits for a due time to fire that chunk itself takes the
*fire duty* (issue 16): the wheel thread then sleeps :data:`FIRE_DUTY_GRACE_MS`
past that time and fires only what no pull did. The wake-up condition is a leaf
of the core's lock order.
"""

from __future__ import annotations

import threading
import time

#: How long the wheel thread sleeps past a due time a waiting pull fires itself
#: (:meth:`WheelWakes.take_fire_duty`): it fires then only if no pull did (the
#: dispatcher stopped pulling, e.g. every slot busy). Longer: fewer idle wakes
#: (at 1,000 jobs/s, 4 ms cost the wheel thread 35 us of CPU per job, 20 ms 10 us).
FIRE_DUTY_GRACE_MS = 20


class WheelWakes:
    """The wheel thread's sleep and wake-ups (a mixin: the class using it has
    :meth:`now`, broker time in ms, and calls :meth:`_init_wakes` once)."""

    def now(self) -> int:
        """Broker time in epoch ms (the core's)."""
        raise NotImplementedError

    def _init_wakes(self, wall: bool) -> None:
        self._wake = threading.Condition(threading.Lock())
        # The system clock's ms reading floors: the wheel thread reads time.time() to
        # wake at a due millisecond's start, not up to 1 ms after it (issue 16).
        self._wall = wall
        self._duty_ms = 0  # a pull fires what is due up to then itself (broker ms)
        self._kicked = False
        self._planned_wake = 0

    def kick(self) -> None:
        """Wake the wheel thread now (the clock moved, or the broker closes)."""
        with self._wake:
            self._kicked = True
            self._wake.notify()

    def wake_if_before(self, due_ms: int) -> None:
        """Wake the wheel thread if ``due_ms`` comes before the time it plans to wake at
        (something due sooner was scheduled while it sleeps)."""
        if due_ms < self._planned_wake:
            self.kick()

    @property
    def planned_wake_ms(self) -> int:
        """The broker time the sleeping wheel thread plans to wake at; 0 while it works."""
        return self._planned_wake

    @property
    def wall_clock(self) -> bool:
        """Whether the clock is the system's (then pulls may fire due messages
        themselves, see :meth:`take_fire_duty`; a manual clock leaves it to the wheel
        thread, which tests drive by moving the clock)."""
        return self._wall

    def seconds_until(self, at_ms: int) -> float:
        """Seconds from now to broker time ``at_ms`` (negative once past), to the
        sub-millisecond with the system clock."""
        delay = (at_ms - self.now()) / 1000
        if self._wall:  # never longer than the line above (a clock stepped back)
            delay = min(delay, at_ms / 1000 - time.time())
        return delay

    def take_fire_duty(self, due_ms: int) -> None:
        """A pull waits until ``due_ms`` to fire what is due then itself (one thread
        hand-off less per fired chunk, issue 16); the wheel thread then plans to
        wake :data:`FIRE_DUTY_GRACE_MS` later and fires only what no pull did."""
        # Unlocked: a racing smaller value only costs the wheel thread an early wake.
        self._duty_ms = max(self._duty_ms, due_ms)

    def wheel_wake_ms(self, due_ms: int) -> int:
        """When the wheel thread should wake for what is due at ``due_ms``: then, or
        :data:`FIRE_DUTY_GRACE_MS` later when a pull took the duty to fire it."""
        return due_ms + FIRE_DUTY_GRACE_MS if due_ms <= self._duty_ms else due_ms

    def wait_for_work(self, wake_ms: int, max_wait_s: float) -> None:
        """Sleep until broker time ``wake_ms`` (at most ``max_wait_s``) or a kick; for the
        wheel thread only."""
        self._planned_wake = wake_ms
        with self._wake:
            if not self._kicked:
                delay = self.seconds_until(wake_ms)
                if delay > 0:
                    self._wake.wait(min(delay, max_wait_s))
            self._kicked = False
        self._planned_wake = 0


__all__ = ["FIRE_DUTY_GRACE_MS", "WheelWakes"]
