"""The fire rate over the last minutes: :class:`RateSampler` reads
``broker.stats().fired_total`` every few seconds on a background thread and keeps
a bounded ring of samples, from which :meth:`RateSampler.rates` derives messages
fired per second between consecutive samples.

The broker keeps no history of its own, so the history starts when the dashboard
does; a failing ``stats()`` (a broker restarting) only leaves a gap.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

_log = logging.getLogger("chronoq.workers.dashboard.RateSampler")

#: Seconds between samples.
DEFAULT_INTERVAL_S = 2.0
#: Minutes of history kept.
HISTORY_MINUTES = 60


class RateSampler:
    """Samples a counter on a daemon thread into a bounded ring.

    :param read_total: returns the counter (``broker.stats().fired_total``).
    :param interval_s: seconds between samples.
    :param now_ms: the current time, epoch ms.
    """

    def __init__(
        self,
        read_total: Callable[[], int],
        interval_s: float = DEFAULT_INTERVAL_S,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._read = read_total
        self._interval = interval_s
        self._now_ms = now_ms
        size = int(HISTORY_MINUTES * 60 / interval_s) + 2
        self._ring: deque[tuple[int, int]] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take a first sample now and start the thread (once)."""
        if self._thread is not None:
            return
        self.sample()
        self._thread = threading.Thread(
            target=self._run, name="chronoq-dashboard-sampler", daemon=True
        )
        self._thread.start()

    def sample(self) -> None:
        """Take one sample (errors are logged: the next sample tries again)."""
        try:
            total = self._read()
        except Exception as e:  # noqa: BLE001 - a broker hiccup must not stop the history
            _log.warning("could not read the broker's stats: %s", e)
            return
        with self._lock:
            self._ring.append((self._now_ms(), total))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def rates(self, minutes: int) -> list[dict[str, float | int]]:
        """``[{"t_ms", "per_s"}]`` over the last ``minutes``, oldest first: the rate
        between each sample and the one before it."""
        with self._lock:
            samples = list(self._ring)
        since = self._now_ms() - minutes * 60_000
        out: list[dict[str, float | int]] = []
        for (t0, n0), (t1, n1) in itertools.pairwise(samples):
            if t1 >= since and t1 > t0:
                # A counter that went down (a broker restarted) reads as 0, not negative.
                out.append({"t_ms": t1, "per_s": round(max(n1 - n0, 0) * 1000 / (t1 - t0), 3)})
        return out

    def close(self) -> None:
        """Stop the thread (waits for it briefly)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval + 5)


__all__ = ["DEFAULT_INTERVAL_S", "HISTORY_MINUTES", "RateSampler"]
