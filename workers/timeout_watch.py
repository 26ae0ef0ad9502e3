"""TimeoutWatch: a dispatch hook that fails the jobs that run over ``spec.timeout``.

A job's time counts from its body's start (a job still queued for a worker is
not timed yet; the look comes again within its timeout). Threads cannot be
killed: the watch hands the expired job to the dispatcher, which claims the
run, sets the job's cancel event (:mod:`workers.context`) and fails it per its
retry policy with a :class:`~workers.context.JobTimeout`; a stuck body keeps its
thread until it returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from workers.context import JobContext
from workers.hooks import DispatchHook
from workers.runs import Run

#: The longest the watch lets the pull loop wait between two looks, s.
MAX_LOOK_S = 1.0


class TimeoutWatch(DispatchHook):
    """Watches the running jobs that have a timeout; thread-safe.

    :param expire: called in the pull thread with each job over its timeout (and
        its run); the watch forgets the job first.
    """

    def __init__(self, expire: Callable[[Run, JobContext], None]) -> None:
        self._expire = expire
        self._lock = threading.Lock()
        self._timed: dict[Run, JobContext] = {}  # run -> its job being watched

    def __len__(self) -> int:
        return len(self._timed)

    def before_start(self, run: Run, job: JobContext) -> None:
        """Watch ``job`` if its spec has a timeout."""
        if run.spec.timeout is not None:
            with self._lock:
                self._timed[run] = job

    def after_job(self, run: Run, job: JobContext, error: BaseException | None) -> None:
        """``job`` ended: stop watching it."""
        if run.spec.timeout is not None:
            with self._lock:
                if self._timed.get(run) is job:
                    del self._timed[run]

    def tick(self) -> int | None:
        """Expire the jobs over their timeout; ms until the next may (at most 1 s)."""
        if not self._timed:
            return None
        now = time.monotonic()
        expired: list[tuple[Run, JobContext]] = []
        wait = MAX_LOOK_S
        with self._lock:
            for run, job in self._timed.items():
                timeout, started = run.spec.timeout or 0.0, job.started_mono
                left = timeout if started is None else started + timeout - now
                if left <= 0:
                    expired.append((run, job))
                else:
                    wait = min(wait, left)
            for run, _ in expired:
                del self._timed[run]
        for run, job in expired:
            self._expire(run, job)
        return max(1, int(wait * 1000))


__all__ = ["MAX_LOOK_S", "TimeoutWatch"]
