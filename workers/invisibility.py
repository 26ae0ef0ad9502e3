"""InvisibilityKeeper: a dispatcher's held messages stay invisible while it holds them.

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
from typing import Protocol

from broker_adapter.base import Consumer
from broker_adapter.errors import ChronoqError
from broker_adapter.results import ReceivedMessage


class Held(Protocol):
    """What the keeper needs of a run: its message."""

    message: ReceivedMessage


class InvisibilityKeeper:
    """Extends the invisible time of the messages it is told to keep; safe across threads.

    :param log: where a failed extension is reported.
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._kept: dict[Held, float] = {}  # run -> when to extend it next (monotonic)
        self._next_look = 0.0
        self._consumer: Consumer | None = None
        self._invisible_s = 60.0

    def open(self, consumer: Consumer, invisible_ms: int) -> None:
        """Extend through ``consumer``, whose messages are invisible for ``invisible_ms``."""
        self._consumer = consumer
        self._invisible_s = invisible_ms / 1000

    def keep(self, run: Held) -> None:
        """Keep ``run``'s message invisible from now on (again: from now)."""
        with self._lock:
            self._kept[run] = time.monotonic() + self._invisible_s / 2

    def drop(self, run: Held) -> None:
        """Stop keeping ``run``'s message (it is settled)."""
        with self._lock:
            self._kept.pop(run, None)

    def __len__(self) -> int:
        return len(self._kept)

    def tick(self) -> int:
        """Extend the messages due for it; ms until the next look (at most 1 s)."""
        now = time.monotonic()
        if now < self._next_look:
            return max(1, int((self._next_look - now) * 1000))
        half = self._invisible_s / 2
        with self._lock:
            due = [run for run, at in self._kept.items() if at <= now]
            for run in due:
                self._kept[run] = now + half
        if due and self._consumer is not None:
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
