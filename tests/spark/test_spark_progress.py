"""Progress of Spark work on a terminal (``chronoq report``, bulk scheduling): a bar
of the tasks of the Spark jobs started inside ``SparkProgress``, read from the
real session's status tracker; nothing with ``--quiet``, and the session's job
group is left as it was."""

from __future__ import annotations

import os
import pty
import re
import select
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spark_tasks.progress import SparkProgress
from tests.workers.test_progress import on_a_terminal


def _work(spark: Any, bar: SparkProgress) -> int:
    bar.phase("counting")
    return int(spark.range(0, 10_000, numPartitions=6).selectExpr("id % 7 AS k").count())


def _last_line_on_a_terminal(
    spark: Any, monkeypatch: pytest.MonkeyPatch, after_work: Callable[[], None] = lambda: None
) -> tuple[str, str]:
    """Run ``_work`` inside a SparkProgress with stderr on a pseudo-terminal (then
    ``after_work``, still inside); returns what the terminal showed and its last line."""
    master, slave = pty.openpty()
    with open(slave, "w", buffering=1, closefd=False) as tty:
        monkeypatch.setattr("sys.stderr", tty)
        with SparkProgress(spark, "report") as bar:
            assert bar.shown
            assert _work(spark, bar) == 10_000
            after_work()
    shown = b""
    while select.select([master], [], [], 0.2)[0]:
        chunk = os.read(master, 65536)
        if not chunk:
            break
        shown += chunk
    os.close(master)
    os.close(slave)
    text = shown.decode(errors="replace")
    return text, text.strip().split("\r")[-1]


def test_a_terminal_shows_every_task_of_the_work(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given: stderr on a pseudo-terminal
    # When: Spark work runs inside a SparkProgress
    text, last = _last_line_on_a_terminal(spark, monkeypatch)
    # Then: the bar ends with every task done: at least the 6 of the 6 partitions
    assert last.startswith("counting: 100%"), text
    done, total = map(int, re.findall(r"(\d+)/(\d+)", last)[-1])
    assert done == total >= 6, text
    # And: the session's job group is as before (the Spark executor sets its own per run)
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


class _LaggingTracker:
    """The real status tracker, in addition seen through a lag: while ``lag`` > 0 each
    job looks still running with no task done (Spark's listener bus had not told the
    tracker yet), one lagging answer per ``getJobInfo``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.lag = 0

    def getJobIdsForGroup(self, group: str) -> Any:  # Spark's names
        return self.real.getJobIdsForGroup(group)

    def getJobInfo(self, job_id: int) -> Any:
        job = self.real.getJobInfo(job_id)
        if self.lag > 0 and job is not None:
            self.lag -= 1
            return SimpleNamespace(status="RUNNING", stageIds=job.stageIds, lagging=True)
        return job

    def getStageInfo(self, stage_id: int) -> Any:
        stage = self.real.getStageInfo(stage_id)
        if self.lag > 0 and stage is not None:
            return SimpleNamespace(numCompletedTasks=0, numTasks=stage.numTasks)
        return stage


def test_the_final_count_waits_until_the_tracker_knows_the_jobs_ended(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given: a status tracker that learns of the work's end a few looks late
    tracker = _LaggingTracker(spark.sparkContext.statusTracker())
    monkeypatch.setattr(spark.sparkContext, "statusTracker", lambda: tracker)

    def lag() -> None:
        tracker.lag = 3

    # When: the work ends while the tracker lags
    text, last = _last_line_on_a_terminal(spark, monkeypatch, after_work=lag)
    # Then: the bar still ends with every task done
    assert tracker.lag == 0
    assert last.startswith("counting: 100%"), text


def test_quiet_shows_nothing_and_leaves_the_job_group_alone(spark: Any) -> None:
    sc = spark.sparkContext
    sc.setLocalProperty("spark.jobGroup.id", "msg-1")
    try:
        with SparkProgress(spark, "report", quiet=True) as bar:
            assert not bar.shown
            assert sc.getLocalProperty("spark.jobGroup.id") == "msg-1"
            assert _work(spark, bar) == 10_000
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


APP = """
from scheduler.scheduler import Scheduler

app = Scheduler()


@app.job(name="close", topic="orders")
def close(n: int) -> None: ...
"""


@pytest.mark.slow
def test_the_bulk_scheduling_command_on_a_terminal_and_quiet(tmp_path: Path) -> None:
    # Given: 200 rows to schedule, the app, and a broker directory per run
    (tmp_path / "bulk_app.py").write_text(APP)
    rows = tmp_path / "rows.csv"
    rows.write_text(
        "key,job,delay_s,args\n" + "".join(f"o:{i},close,60,[{i}]\n" for i in range(200))
    )
    root = Path(__file__).resolve().parents[2]
    shown: dict[str, str] = {}
    for run, extra in (("bar", []), ("quiet", ["--quiet"])):
        env = dict(
            os.environ,
            CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / run}",
            CHRONOQ_SPARK_MASTER="local[2]",
            SPARK_CONF="spark.ui.enabled=false",
            PYTHONPATH=os.pathsep.join(
                [str(tmp_path), str(root), os.environ.get("PYTHONPATH", "")]
            ),
            TERM="xterm",
        )
        argv = [
            sys.executable,
            "-m",
            "spark_tasks.pipelines.bulk_schedule",
            "bulk_app:app",
            str(rows),
            "--rejects",
            str(tmp_path / f"rejects-{run}"),
            *extra,
        ]
        # When: run with stderr on a terminal
        status, shown[run], out = on_a_terminal(argv, env, timeout_s=240)
        # Then: the same result either way
        assert status == 0, shown[run][-3000:]
        assert out.startswith("accepted 200, duplicate 0 (already scheduled), rejected 0"), out
    # And: a bar of the Spark tasks by part with the terminal, none with --quiet
    assert "bulk schedule: sending" in shown["bar"] and " tasks" in shown["bar"], shown["bar"]
    assert "100%" in shown["bar"]
    assert "bulk schedule" not in shown["quiet"] and " tasks" not in shown["quiet"]
