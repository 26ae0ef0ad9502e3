"""LoopWatchdog: one WARNING when an event loop stops turning (a blocking call in an
async job), naming what it was running.

asyncio's debug mode logs callbacks slower than ``slow_callback_duration``, but
only after they return, and debug mode slows every step. The watchdog does it
from outside: the loop updates a heartbeat every quarter of the threshold, and a
thread of the watchdog looks at it every half threshold. When the heartbeat is
older than the threshold, the loop is blocked; the watchdog logs one WARNING for
that stall, naming the task that runs (via ``describe``, e.g. the job's name and
message id), and the next for the next stall, once the loop has turned again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

#: Default threshold: a loop that did not turn for this long is reported, s.
DEFAULT_BLOCKED_WARN_S = 0.1


class LoopWatchdog:
    """Watches one event loop for stalls longer than ``threshold_s``.

    :param loop: the loop (running in another thread, or about to).
    :param threshold_s: how long the loop may go without turning, s (> 0).
    :param describe: names a running task for the warning (called in the
        watchdog's thread with the loop's current task, or ``None`` when the loop
        is blocked outside a task); must be quick and must not raise.
    :param log: where the warning goes.
    :raises ValueError: for a threshold <= 0.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        threshold_s: float,
        describe: Callable[[asyncio.Task[object] | None], str],
        log: logging.Logger,
    ) -> None:
        if not threshold_s > 0:
            raise ValueError(f"threshold_s must be > 0, got {threshold_s!r}")
        self.threshold_s = threshold_s
        self._loop = loop
        self._describe = describe
        self._log = log
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Stalls reported so far.
        self.warnings = 0

    def start(self) -> None:
        """Start the heartbeat (on the loop) and the watching thread; idempotent."""
        if self._thread is not None:
            return
        self._beat = time.monotonic()
        self._loop.call_soon_threadsafe(self._heartbeat)
        self._thread = threading.Thread(
            target=self._watch, name="chronoq-loop-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the heartbeat stops with the loop); idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _heartbeat(self) -> None:  # on the loop
        self._beat = time.monotonic()
        if not self._stop.is_set():
            self._loop.call_later(self.threshold_s / 4, self._heartbeat)

    def _watch(self) -> None:  # the watchdog's thread
        reported = -1.0  # the heartbeat of the stall already reported
        while not self._stop.wait(self.threshold_s / 2):
            beat = self._beat
            blocked_s = time.monotonic() - beat
            if blocked_s <= self.threshold_s or beat == reported or self._loop.is_closed():
                continue
            reported = beat
            self.warnings += 1
            task = asyncio.current_task(self._loop)
            self._log.warning(
                "event loop blocked for over %.0f ms by %s: a blocking call in an async "
                "job stalls every async job; await it (asyncio.to_thread(...) for sync code) "
                "or make the job a plain def",
                blocked_s * 1000,
                self._describe(task),
            )


__all__ = ["DEFAULT_BLOCKED_WARN_S", "LoopWatchdog"]
