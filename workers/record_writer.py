"""RecordWriter: the thread that publishes a dispatcher's keyed records
(:mod:`scheduler.keyed_records`) every few seconds, and once more on leaving.

Shared by :class:`~workers.schedule_runs.RunLog` (the schedules' last runs) and
:class:`~workers.job_stats.JobStatsLog` (the job stats): the hook only updates
memory per job; this thread calls its ``flush`` (which writes only when something
changed) off the job threads and off the pull loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable


def owner_id() -> str:
    """A name for this dispatcher in its records' keys: ``<host>:<pid>:<8 hex>``
    (no ``:`` in the host part, so the key stays parseable)."""
    host = socket.gethostname().replace(":", "_")
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RecordWriter:
    """Calls ``flush`` every ``period_s`` seconds on a thread of its own, and once more
    on :meth:`stop`.

    :param flush: writes what changed; must not raise (log instead).
    :param period_s: seconds between calls.
    :param name: the thread's name.
    :param log: where the time each write took goes (DEBUG).
    :param aligned: wake just after each multiple of ``period_s`` of the wall
        clock, so every dispatcher's writes cover the same intervals.
    :param last: what :meth:`stop` calls at the end; ``flush`` by default.
    """

    def __init__(
        self,
        flush: Callable[[], None],
        period_s: float,
        *,
        name: str,
        log: logging.Logger,
        aligned: bool = False,
        last: Callable[[], None] | None = None,
    ) -> None:
        self._flush = flush
        self._last = last or flush
        self._period_s = period_s
        self._name = name
        self._log = log
        self._aligned = aligned
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _wait_s(self) -> float:
        if not self._aligned:
            return self._period_s
        # 20 ms past the boundary: what ended just before it is in.
        return self._period_s - (time.time() % self._period_s) + 0.02

    def _loop(self) -> None:
        while not self._stop.wait(self._wait_s()):
            start = time.monotonic()
            self._flush()
            self._log.debug("%s: written in %.1f ms", self._name, (time.monotonic() - start) * 1e3)

    def stop(self) -> None:
        """Stop the thread and flush what is left (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._last()


__all__ = ["RecordWriter", "owner_id"]
