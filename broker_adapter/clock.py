"""Clocks: the system's, and a manual one tests advance by hand.

Brokers read time only through a :class:`Clock`, so tests never sleep for a
long delay: they advance a :class:`ManualClock` and the broker's timing wheel
wakes up at once (clocks tell listeners when they jump).

Clock jumps: due times are wall-clock epoch ms, but no firing loop sleeps until a
wall-clock time. Each waits in bounded slices (a fraction of a second) and reads
the clock again after every wake, so a step of the system clock (NTP, a VM
resumed) that nobody announces is seen within a slice: a forward step fires what
is now due at once, a backward step leaves nothing asleep for the step's length.
:meth:`ManualClock.jump` makes such steps in tests, announced or silent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Wall-clock time in epoch milliseconds."""

    def now_ms(self) -> int:
        """The current time, epoch ms."""
        ...

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever time jumps (never, for the system clock)."""
        ...

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``."""
        ...


class SystemClock:
    """The machine's wall clock (``time.time()``)."""

    def now_ms(self) -> int:
        """The current time, epoch ms."""
        return int(time.time() * 1000)

    def subscribe(self, listener: Callable[[], None]) -> None:
        """The system clock never jumps on purpose: nothing to subscribe to."""

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        """Nothing to unsubscribe."""


class ManualClock:
    """A clock that moves only when told; listeners hear every move.

    :param start_ms: the initial time, epoch ms.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        """The current (manual) time, epoch ms."""
        return self._now

    def advance(self, ms: int) -> int:
        """Move time forward by ``ms`` and wake listeners; returns the new time."""
        if ms < 0:
            raise ValueError("a ManualClock only moves forward")
        with self._lock:
            self._now += ms
            listeners = list(self._listeners)
        for listener in listeners:
            listener()
        return self._now

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms`` (not backwards) and wake listeners."""
        self.advance(now_ms - self._now)

    def jump(self, ms: int, *, notify: bool = True) -> int:
        """Step the clock by ``ms``, forward or (negative) back, as an NTP step or a
        resumed VM does; returns the new time.

        :param ms: the step, in ms (negative: backwards).
        :param notify: wake listeners, as :meth:`advance` does; ``False`` steps
            silently, as the system clock does, so only a loop that reads the
            clock again by itself sees the step.
        """
        with self._lock:
            self._now += ms
            listeners = list(self._listeners) if notify else []
        for listener in listeners:
            listener()
        return self._now

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every move."""
        with self._lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
