"""InvisibilityKeeper: a dispatch hook that keeps held messages invisible while held.

From the moment a job starts (queued for a worker, running, or handed to another
system such as Celery) until its message is settled, the message's invisible time
is extended (``Consumer.extend``, RocketMQ's changeInvisibleDuration) once half of
it has passed since the last extension. The keeper looks every quarter invisible
time (at most every second), so an extension never comes later than 3/4 of the
invisible time: a live dispatcher's message never comes back while its job waits
or runs, however long; a dead dispatcher's comes back after at most one
invisible time.
"""

from __future__ import annotations

import logging
import threading
import time

from broker_adapter.base import Consumer
from broker_adapter.errors import ChronoqError
from broker_adapter.results import ReceivedMessage
from workers.context import JobContext
from workers.hooks import DispatchHook
from workers.runs import Run
from workers.settlement import Settlement


class InvisibilityKeeper(DispatchHook):
    """Extends the invisible time of the started runs' messages; thread-safe.

    :param consumer: the consumer whose messages it extends.
    :param invisible_ms: how long a pulled message stays invisible to the group.
    :param log: where a failed extension is reported.
    """

    def __init__(self, consumer: Consumer, invisible_ms: int, log: logging.Logger) -> None:
        self._consumer = consumer
        self._invisible_s = invisible_ms / 1000
        self._log = log
        self._lock = threading.Lock()
        self._kept: dict[Run, float] = {}  # run -> when to extend it next (monotonic)
        self._next_look = 0.0

    def keep(self, run: Run) -> None:
        """Keep ``run``'s message invisible from now on (again: from now)."""
        with self._lock:
            self._kept[run] = time.monotonic() + self._invisible_s / 2

    def drop(self, run: Run) -> None:
        """Stop keeping ``run``'s message."""
        with self._lock:
            self._kept.pop(run, None)

    def __len__(self) -> int:
        return len(self._kept)

    # -- as a dispatch hook ---------------------------------------------------------------

    def before_start(self, run: Run, job: JobContext) -> None:
        """A job starts: its message is kept from now."""
        self.keep(run)

    def after_handoff(self, run: Run) -> None:
        """Handed off: kept from now, unless settled meanwhile (a timeout)."""
        with self._lock:
            # The settler sets ``settled`` before it drops, so a drop cannot come first.
            if not run.settled:
                self._kept[run] = time.monotonic() + self._invisible_s / 2

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        """Settled: no longer kept."""
        if run is not None:
            self.drop(run)

    def tick(self) -> int | None:
        """Extend the messages due for it; ms until the next look (at most 1 s), or
        ``None`` when it keeps none."""
        if not self._kept:
            return None
        now = time.monotonic()
        if now < self._next_look:
            return max(1, int((self._next_look - now) * 1000))
        half = self._invisible_s / 2
        with self._lock:
            due = [run for run, at in self._kept.items() if at <= now]
            for run in due:
                self._kept[run] = now + half
        if due:
            invisible_ms = int(self._invisible_s * 1000)
            for run in due:
                try:
                    self._consumer.extend(run.message, invisible_ms)
                except ChronoqError as e:  # it comes back after its invisible time: safe
                    self._log.warning("msg=%s: extend failed (%s)", run.message.msg_id, e)
        step = min(1.0, self._invisible_s / 4)
        self._next_look = now + step
        return max(1, int(step * 1000))


__all__ = ["InvisibilityKeeper"]
