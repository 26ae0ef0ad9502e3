"""RunLog: a dispatch hook that records each schedule's last run for
``app.schedules.list()`` (see :mod:`scheduler.schedule_runs` for the records).

Per run of a schedule (a cron/interval job's or a stored schedule's occurrence)
it only updates a dict; a thread of its own writes the dict every
:data:`FLUSH_S` seconds when it changed, and once more when the dispatcher
leaves its group. Plain job runs are not recorded.
"""

from __future__ import annotations

import logging
import threading

from broker_adapter.errors import ChronoqError
from scheduler.schedule_runs import LastRun, RunBook
from workers.context import JobContext
from workers.hooks import DispatchHook, Session
from workers.record_writer import RecordWriter, owner_id
from workers.runs import App, Run

_log = logging.getLogger("chronoq.workers.RunLog")

#: Seconds between writes of the last runs (only when something ran).
FLUSH_S = 5.0


class RunLog(DispatchHook):
    """Records the last run of each schedule this dispatcher runs; thread-safe.

    :param app: the app (its broker and clock).
    :param flush_s: seconds between writes.
    """

    def __init__(self, app: App, flush_s: float = FLUSH_S) -> None:
        self._book = RunBook(lambda: app.broker, lambda: app.clock.now_ms())
        self._clock = app.clock
        self._runs: dict[str, LastRun] = {}
        self._dirty = False
        self._lock = threading.Lock()
        self._owner = owner_id()
        self._writer = RecordWriter(self.flush, flush_s, name="chronoq-run-log", log=_log)

    def on_open(self, session: Session) -> None:
        """Start the writer thread."""
        self._writer.start()

    def after_job(self, run: Run, job: JobContext, error: BaseException | None) -> None:
        """Remember a schedule's run (any thread)."""
        cron = run.cron
        if cron is None:
            return
        now = self._clock.now_ms()
        started = job.started_ms if job.started_ms is not None else now
        outcome = "ok" if error is None else f"failed: {type(error).__name__}"
        last = LastRun(job.due_ms, int(started), now, outcome)
        with self._lock:
            self._runs[cron.name] = last
            self._dirty = True

    def flush(self) -> None:
        """Write the last runs now if something ran since the last write."""
        with self._lock:
            if not self._dirty:
                return
            runs, self._dirty = dict(self._runs), False
        try:
            self._book.write(self._owner, runs)
        except ChronoqError as e:  # the broker is closing or gone: the next write may do
            with self._lock:
                self._dirty = True
            _log.warning("recording the last runs of %d schedule(s) failed: %s", len(runs), e)

    def on_close(self) -> None:
        """Stop the writer thread and write what is left."""
        self._writer.stop()


__all__ = ["FLUSH_S", "RunLog"]
