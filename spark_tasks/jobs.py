"""Ready-made Spark jobs for an app: the scheduled delivery report.

::

    from spark_tasks.jobs import register_report_job
    register_report_job(app, "0 * * * *", trace_dir="./chronoq-data/trace",
                        out_dir="./reports")

then ``chronoq worker --executor spark module:app`` runs it every hour.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from scheduler.handles import JobHandle
    from scheduler.scheduler import Scheduler

#: The report job's name.
REPORT_JOB = "chronoq.delivery_report"


def register_report_job(
    app: Scheduler,
    expr: str,
    *,
    trace_dir: str | Path,
    out_dir: str | Path,
    bucket_s: int = 60,
    tz: str = "UTC",
    topic: str | None = None,
    timeout: float | None = 3600.0,
) -> JobHandle[Any, Any]:
    """Register the delivery report as a Spark cron job of ``app`` (runs at ``expr``).

    :param trace_dir: the delivery trace directory it reads.
    :param out_dir: where ``report.parquet`` and ``lateness.png`` go.
    :param topic: the job's topic; by default ``<settings.topic>.spark``, so the
        main dispatchers never pull it.
    :returns: the job's handle.
    """
    from spark_tasks.pipelines.delivery_report import run_report

    def delivery_report_job(spark: SparkSession) -> None:
        result = run_report(spark, trace_dir, out_dir, bucket_s=bucket_s)
        import logging

        logging.getLogger("chronoq.spark_tasks.jobs").info(
            "delivery report: %d rows -> %s\n%s", len(result.rows), result.parquet, result.table
        )

    handle: JobHandle[Any, Any] = app.cron(
        expr,
        tz=tz,
        executor="spark",
        name=REPORT_JOB,
        topic=topic or f"{app.settings.topic}.spark",
        timeout=timeout,
    )(delivery_report_job)
    return handle


__all__ = ["REPORT_JOB", "register_report_job"]
