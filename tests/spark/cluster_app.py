"""The app the standalone-cluster tests run with ``chronoq worker --executor spark``.

Every Spark job here records its run as ``<runs dir>/<job>-<msg id>.json``
(:data:`RUNS_ENV`): the master and application id of the driver's context, and
where its tasks ran (an executor's working directory, ``work/<app id>/<n>`` on a
standalone worker), so the test can match the run to the master's application
list and the worker's executor directories.

Functions shipped to executors are defined inside the jobs: cloudpickle sends
them by value, so executors need not import this module (``tests`` is not
installed, and an executor's Python worker starts in the worker's directory).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scheduler.handles import JobHandle
from scheduler.scheduler import Scheduler
from workers import current_job

#: Where runs are recorded (a directory the test gives the worker's environment).
RUNS_ENV = "SPARK_CLUSTER_RUNS"
TOPIC = "cluster.spark"
TICK = "cluster.tick"
TOTALS = "cluster.totals"
STUCK = "cluster.stuck"
#: The bulk scheduling test's job and topic (a plain job: the rows only schedule it).
CLOSE_ORDER = "cluster.close_order"
ORDERS_TOPIC = "cluster.orders"
#: Cron expression of the tick (seconds field first): every 3 s.
TICK_EXPR = "*/3 * * * * *"
#: The stuck job's timeout, in seconds; its one task sleeps far longer.
STUCK_TIMEOUT_S = 4
STUCK_SLEEP_S = 900


def _record(spark: Any, job: str, **fields: Any) -> None:
    sc = spark.sparkContext
    run = current_job()
    msg_id = run.msg_id
    record = {
        "job": job,
        "msg_id": msg_id,
        "fire_ms": run.fire_ms,
        "master": sc.master,
        "app_id": sc.applicationId,
        "app_name": sc.appName,
        **fields,
    }
    runs = Path(os.environ[RUNS_ENV])
    tmp = runs / f".{job}-{msg_id}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(runs / f"{job}-{msg_id}.json")  # readers never see half a record


def _executor_dirs(spark: Any, partitions: int) -> list[str]:
    """Where the tasks of a small Spark job ran (their Python workers' cwd)."""

    def where(rows: Iterator[int]) -> Iterator[str]:
        import os

        yield os.getcwd()

    cwds: list[str] = (
        spark.sparkContext.parallelize(range(partitions), partitions).mapPartitions(where).collect()
    )
    return sorted(set(cwds))


def tick(spark: Any) -> None:
    """The cron job: a small Spark job, recorded with where it ran."""
    _record(spark, TICK, executor_dirs=_executor_dirs(spark, 2), n=spark.range(1000).count())


def totals(spark: Any, n: int, out: str) -> None:
    """The one-off job: sums by ``id % 3`` over ``range(n)``, written as Parquet to ``out``."""
    df = spark.range(n).selectExpr("id % 3 AS k", "id AS v").groupBy("k").sum("v")
    df.write.mode("overwrite").parquet(out)
    sums = {str(r["k"]): r["sum(v)"] for r in spark.read.parquet(out).collect()}
    _record(spark, TOTALS, executor_dirs=_executor_dirs(spark, 2), sums=sums)


def stuck(spark: Any) -> None:
    """The long job: one task sleeping :data:`STUCK_SLEEP_S`; its timeout cancels it
    (the Spark job group), so the action raises and the outcome is recorded."""
    sleep_s = STUCK_SLEEP_S

    def nap(x: int) -> int:
        import time

        time.sleep(sleep_s)
        return x

    started = time.time()
    try:
        spark.sparkContext.parallelize([0], 1).map(nap).collect()
        outcome = "completed"
    except Exception as e:  # noqa: BLE001 - the cancelled Spark job surfaces here
        outcome = "cancelled" if "cancel" in str(e).lower() else f"failed: {e}"
    _record(spark, STUCK, outcome=outcome, ran_s=time.time() - started)


def close_order(order_id: int) -> None:
    """The job the bulk scheduling test's rows name (never run by the test)."""


def register(app: Scheduler) -> dict[str, JobHandle[Any, Any]]:
    """Register the three Spark jobs and the bulk test's plain job on ``app`` (the worker's, or a client's with the
    same names, to schedule them); their handles by name."""
    return {
        TICK: app.cron(TICK_EXPR, executor="spark", topic=TOPIC, name=TICK, timeout=120)(tick),
        TOTALS: app.job(executor="spark", topic=TOPIC, name=TOTALS, timeout=120)(totals),
        STUCK: app.job(
            executor="spark", topic=TOPIC, name=STUCK, timeout=STUCK_TIMEOUT_S, max_attempts=1
        )(stuck),
        CLOSE_ORDER: app.job(name=CLOSE_ORDER, topic=ORDERS_TOPIC)(close_order),
    }


def client_app(url: str) -> tuple[Scheduler, dict[str, JobHandle[Any, Any]]]:
    """A Scheduler on ``url`` with the jobs registered, for the test to schedule
    them (it runs nothing itself)."""
    app = Scheduler(url)
    return app, register(app)


#: The worker's app: its broker from ``CHRONOQ_BROKER_URL`` (opened on first use).
app = Scheduler()
register(app)
