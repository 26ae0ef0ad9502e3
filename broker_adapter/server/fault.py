"""Latency-based fault avoidance for producers with several endpoints (RocketMQ's
``MQFaultStrategy``, with chronoq's table).

After each send the producer records how long it took; a slow or failed
endpoint is *not available* for a while and round-robin skips it:

====================  ======  =====  ======  ======  ======  =======  =======
latency at least (ms)     50    100     550    1800    3000     5000    15000
not available (ms)         0      0    2000    5000    6000    10000    30000
====================  ======  =====  ======  ======  ======  =======  =======

A failed send counts as 30,000 ms (so 30 s out). When every endpoint is out,
the one that comes back soonest is used anyway: a send is never refused only
because all endpoints were slow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
#: The latency a failed send counts as.
ISOLATION_LATENCY_MS = 30_000


def not_available_ms(latency_ms: float) -> int:
    """How long an endpoint is skipped after a send that took ``latency_ms``."""
    for threshold, window in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS), strict=True):
        if latency_ms >= threshold:
            return window
    return 0


class FaultTolerance:
    """Round-robin over ``n`` endpoints, skipping those in a not-available window.

    :param n: number of endpoints.
    :param clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, n: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._n = n
        self._clock = clock
        self._lock = threading.Lock()
        self._turn = 0
        self._until = [0.0] * n  # monotonic s until which endpoint i is out
        self.latency_ms = [0.0] * n

    def update(self, index: int, latency_ms: float, failed: bool = False) -> None:
        """Record a send to endpoint ``index`` that took ``latency_ms`` (or ``failed``)."""
        latency = ISOLATION_LATENCY_MS if failed else latency_ms
        with self._lock:
            self.latency_ms[index] = latency
            self._until[index] = self._clock() + not_available_ms(latency) / 1000

    def available(self, index: int) -> bool:
        """Whether endpoint ``index`` is outside its not-available window."""
        return self._clock() >= self._until[index]

    def pick(self, avoid: int | None = None) -> int:
        """The next endpoint in round-robin order that is available and not ``avoid``
        (the one that just failed); else the one available soonest."""
        with self._lock:
            now = self._clock()
            start = self._turn
            self._turn = (self._turn + 1) % self._n
            for i in range(self._n):
                index = (start + i) % self._n
                if index != avoid and now >= self._until[index]:
                    return index
            candidates = [i for i in range(self._n) if i != avoid] or [avoid or 0]
            return min(candidates, key=lambda i: (self._until[i], self.latency_ms[i]))
