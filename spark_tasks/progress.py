"""Progress of a Spark command on a terminal: the tasks of its Spark jobs, done of
total, from Spark's status tracker (``chronoq report``, the bulk scheduling
pipeline).

Only when :func:`scheduler.progress.show_progress` says so (stderr a terminal,
no ``--quiet``): the work's jobs are then tagged with a job group of their own,
and a thread polls ``statusTracker()`` every :data:`POLL_S` for that group's
stages (a few JVM calls; nothing per row). The total grows as new jobs start,
so the bar tells how far the work that Spark knows of has gone; the phase name
says which part runs. Spark's own console bar stays off (``spark.ui.showConsoleProgress``).
"""

from __future__ import annotations

import threading
import time
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from scheduler.progress import Progress, progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Seconds between two polls of the status tracker.
POLL_S = 0.25
#: Longest wait at the end for the status tracker to see the work's jobs end: it
#: hears of them from Spark's listener bus, after the action has returned.
SETTLE_S = 2.0
_GROUP = "spark.jobGroup.id"


class SparkProgress:
    """Counts the tasks of the Spark jobs started in this thread while it is open.

    :param spark: the session.
    :param desc: what runs (the bar's first phase name).
    :param quiet: the command's ``--quiet``.
    """

    def __init__(self, spark: SparkSession, desc: str, *, quiet: bool = False) -> None:
        self._sc = spark.sparkContext
        self._bar: Progress = progress(desc, unit=" tasks", quiet=quiet, scale=False)
        self._group = f"chronoq-progress-{uuid.uuid4().hex[:8]}"
        self._saved: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def shown(self) -> bool:
        """Whether a bar is shown."""
        return self._bar.shown

    def phase(self, text: str) -> None:
        """Name the part of the work that runs now."""
        self._bar.describe(text)

    def __enter__(self) -> Self:
        if self._bar.shown:
            self._saved = self._sc.getLocalProperty(_GROUP)
            self._sc.setLocalProperty(_GROUP, self._group)
            self._thread = threading.Thread(
                target=self._poll, name="chronoq-spark-progress", daemon=True
            )
            self._thread.start()
        return self

    def _counts(self) -> tuple[int, int]:
        """Tasks done and known of this group's jobs. A finished job counts the tasks
        that ran: a stage it skipped (its shuffle output was there) never completes."""
        tracker = self._sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self._group):
            job: Any = tracker.getJobInfo(job_id)
            if job is None:
                continue
            finished = str(job.status) == "SUCCEEDED"
            for stage_id in job.stageIds:
                stage: Any = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numCompletedTasks if finished else stage.numTasks
        return done, total

    def _ended(self) -> bool:
        """Whether the status tracker has every job of this group ended."""
        tracker = self._sc.statusTracker()
        for job_id in tracker.getJobIdsForGroup(self._group):
            job: Any = tracker.getJobInfo(job_id)
            if job is not None and str(job.status) not in ("SUCCEEDED", "FAILED"):
                return False
        return True

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            self._show()

    def _show(self) -> None:
        done, total = self._counts()
        self._bar.set_count(done, total)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            # the final count, once the tracker knows the jobs ended (a loaded
            # machine showed a finished count() as 7 of 13 tasks without the wait)
            deadline = time.monotonic() + SETTLE_S
            while not self._ended() and time.monotonic() < deadline:
                time.sleep(0.02)
            self._show()
            self._sc.setLocalProperty(_GROUP, self._saved)  # type: ignore[arg-type]
        self._bar.close()


__all__ = ["POLL_S", "SETTLE_S", "SparkProgress"]
