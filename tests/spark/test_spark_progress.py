"""Progress of Spark work on a terminal (``chronoq report``, bulk scheduling): a bar
of the tasks of the Spark jobs started inside ``SparkProgress``, read from the
real session's status tracker; nothing with ``--quiet``, and the session's job
group is left as it was."""

from __future__ import annotations

import os
import pty
import re
import select
from typing import Any

import pytest

from spark_tasks.progress import SparkProgress


def _work(spark: Any, bar: SparkProgress) -> int:
    bar.phase("counting")
    return int(spark.range(0, 10_000, numPartitions=6).selectExpr("id % 7 AS k").count())


def test_a_terminal_shows_every_task_of_the_work(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given: stderr on a pseudo-terminal
    master, slave = pty.openpty()
    with open(slave, "w", buffering=1, closefd=False) as tty:
        monkeypatch.setattr("sys.stderr", tty)
        # When: Spark work runs inside a SparkProgress
        with SparkProgress(spark, "report") as bar:
            assert bar.shown
            assert _work(spark, bar) == 10_000
    shown = b""
    while select.select([master], [], [], 0.2)[0]:
        chunk = os.read(master, 65536)
        if not chunk:
            break
        shown += chunk
    os.close(master)
    os.close(slave)
    text = shown.decode(errors="replace")
    # Then: the bar ends with every task done: at least the 6 of the 6 partitions
    last = text.strip().split("\r")[-1]
    assert last.startswith("counting: 100%"), text
    done, total = map(int, re.findall(r"(\d+)/(\d+)", last)[-1])
    assert done == total >= 6, text
    # And: the session's job group is as before (the Spark executor sets its own per run)
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


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
