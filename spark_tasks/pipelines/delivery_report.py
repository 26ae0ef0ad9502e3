"""Delivery report over the delivery trace (:mod:`scheduler.trace_format`): per topic and
time bucket.

Columns of the report (one row per ``topic`` and ``bucket_start``; ``skipped``
lines, i.e. jobs another group ran, are left out):

=================  ==========================================================
``topic``          the topic
``bucket_start``   start of the bucket (UTC timestamp) by ``fired_ms``
                   (``deliver_at_ms`` when the fire time is unknown)
``deliveries``     settled deliveries (each attempt counts)
``messages``       first deliveries (``attempt == 1``)
``ok``             deliveries whose job succeeded
``retries``        deliveries nacked for a retry
``dead``           deliveries dead-lettered
``released``       deliveries released on shutdown
``throughput``     deliveries per second of the bucket
``late_p50`` ...   lateness percentiles in ms: ``late_p50``, ``late_p90``,
                   ``late_p99``, ``late_p999`` (99.9th), and ``late_max``
=================  ==========================================================

Lateness is ``started_ms - deliver_at_ms`` (``dispatched_ms`` when the body never
started; rows with neither are not in the percentiles).

Percentiles are exact, by the **nearest-rank** method: the P-th percentile of
``n`` sorted values ``x[1] <= ... <= x[n]`` is ``x[ceil(P / 100 * n)]`` (the
smallest value with at least P % of the values at or below it). Spark computes
it with ``percentile_disc(P / 100) WITHIN GROUP (ORDER BY lateness)``, whose
definition is the same (the first value whose cumulative distribution reaches
P / 100); :func:`nearest_rank` is the plain-Python reference.

Run it from the command line (``chronoq report --help``), or as a scheduled
Spark job (:func:`spark_tasks.jobs.register_report_job`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_adapter.errors import InvalidArgument, MissingExtra
from broker_adapter.extras import require
from scheduler.trace_format import FILE_GLOB, default_trace_dir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_log = logging.getLogger("chronoq.spark_tasks.delivery_report")

#: The percentiles of the report: (column suffix, fraction).
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 0.5),
    ("p90", 0.9),
    ("p99", 0.99),
    ("p999", 0.999),
)
#: The trace schema as Spark DDL (:data:`scheduler.trace_format.FIELDS`, with types).
TRACE_DDL = (
    "v INT, msg_id STRING, topic STRING, job STRING, key STRING, `group` STRING, "
    "attempt INT, sent_ms BIGINT, deliver_at_ms BIGINT, fired_ms BIGINT, "
    "dispatched_ms BIGINT, started_ms BIGINT, finished_ms BIGINT, outcome STRING, "
    "error STRING"
)


def nearest_rank(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (see the module docstring).

    :param fraction: the percentile as a fraction, ``0 < fraction <= 1``.
    :raises InvalidArgument: for no values or a fraction out of range.
    """
    if not values or not 0 < fraction <= 1:
        raise InvalidArgument("nearest_rank needs values and 0 < fraction <= 1")
    ordered = sorted(values)
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[max(rank, 1) - 1]


def read_trace(spark: SparkSession, path: str | Path) -> DataFrame:
    """The trace lines under ``path`` (a directory of ``trace-*.jsonl``, or one file)."""
    p = Path(path)
    reader = spark.read.schema(TRACE_DDL)
    if p.is_dir():
        reader = reader.option("pathGlobFilter", FILE_GLOB)
    return reader.json(str(p))


def with_lateness(trace: DataFrame) -> DataFrame:
    """``trace`` plus ``lateness_ms`` and ``bucket_time_ms`` (pure)."""
    from pyspark.sql import functions as F

    started = F.coalesce(F.col("started_ms"), F.col("dispatched_ms"))
    return trace.withColumn("lateness_ms", started - F.col("deliver_at_ms")).withColumn(
        "bucket_time_ms", F.coalesce(F.col("fired_ms"), F.col("deliver_at_ms"))
    )


def delivery_report(trace: DataFrame, bucket_s: int = 60) -> DataFrame:
    """The report rows of ``trace`` (pure: DataFrame -> DataFrame); see the module docstring.

    :param bucket_s: the bucket length in seconds (>= 1).
    :raises InvalidArgument: for ``bucket_s`` < 1.
    """
    from pyspark.sql import functions as F

    if bucket_s < 1:
        raise InvalidArgument(f"bucket_s must be >= 1 (seconds), got {bucket_s!r}")
    bucket_ms = bucket_s * 1000
    rows = with_lateness(trace.filter(F.col("outcome") != "skipped"))
    rows = rows.withColumn(
        "bucket_ms", F.floor(F.col("bucket_time_ms") / bucket_ms).cast("long") * bucket_ms
    )
    aggs: list[Any] = [
        F.count(F.lit(1)).alias("deliveries"),
        F.sum((F.col("attempt") == 1).cast("long")).alias("messages"),
        F.sum((F.col("outcome") == "ok").cast("long")).alias("ok"),
        F.sum((F.col("outcome") == "retry").cast("long")).alias("retries"),
        F.sum((F.col("outcome") == "dead").cast("long")).alias("dead"),
        F.sum((F.col("outcome") == "released").cast("long")).alias("released"),
    ]
    aggs += [
        F.expr(f"percentile_disc({frac}) WITHIN GROUP (ORDER BY lateness_ms)").alias(f"late_{n}")
        for n, frac in PERCENTILES
    ]
    aggs.append(F.max("lateness_ms").alias("late_max"))
    out = rows.groupBy("topic", "bucket_ms").agg(*aggs)
    return out.select(
        "topic",
        F.timestamp_millis(F.col("bucket_ms")).alias("bucket_start"),
        "deliveries",
        "messages",
        "ok",
        "retries",
        "dead",
        "released",
        (F.col("deliveries") / F.lit(float(bucket_s))).alias("throughput"),
        *[F.col(f"late_{n}").cast("long").alias(f"late_{n}") for n, _ in PERCENTILES],
        F.col("late_max").cast("long").alias("late_max"),
    ).orderBy("topic", "bucket_start")


def lateness_histogram(trace: DataFrame) -> DataFrame:
    """``(topic, lateness_ms, n)``: how many deliveries had each lateness (pure)."""
    from pyspark.sql import functions as F

    rows = with_lateness(trace.filter(F.col("outcome") != "skipped"))
    return (
        rows.filter(F.col("lateness_ms").isNotNull())
        .groupBy("topic", "lateness_ms")
        .agg(F.count(F.lit(1)).alias("n"))
        .orderBy("topic", "lateness_ms")
    )


# -- the thin runner ----------------------------------------------------------------------


@dataclass(frozen=True)
class ReportResult:
    """What :func:`run_report` produced.

    :param rows: the report rows, as dicts (small: one per topic and bucket).
    :param parquet: where the report was written.
    :param chart: the PNG lateness chart, or ``None`` without matplotlib.
    :param table: the printed table.
    """

    rows: list[dict[str, Any]]
    parquet: Path
    chart: Path | None
    table: str


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The report rows as a fixed-width text table."""
    cols = (
        ["topic", "bucket_start", "deliveries", "messages", "ok", "retries", "dead", "throughput"]
        + [f"late_{n}" for n, _ in PERCENTILES]
        + ["late_max"]
    )
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


def render_chart(hist: Sequence[tuple[str, int, int]], path: Path) -> Path | None:
    """Draw the lateness CDF of each topic from ``(topic, lateness_ms, n)`` rows
    (sorted by topic, lateness) into ``path``; ``None`` without the ``report`` extra
    (matplotlib), which is logged with its ``pip install`` line."""
    try:
        matplotlib = require("matplotlib", "report", "the delivery report's lateness chart")
    except MissingExtra as e:
        _log.warning("no lateness chart: %s", e)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_topic: dict[str, tuple[list[float], list[int]]] = {}
    for topic, late, n in hist:
        xs, ns = by_topic.setdefault(topic, ([], []))
        xs.append(float(late))
        ns.append(int(n))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for topic, (xs, ns) in sorted(by_topic.items()):
        total, run = sum(ns), 0
        ys = []
        for n in ns:
            run += n
            ys.append(run / total)
        ax.step(xs, ys, where="post", label=topic)
    ax.set_xlabel("lateness (ms): job start minus due time")
    ax.set_ylabel("fraction of deliveries")
    ax.set_title("chronoq delivery lateness (CDF per topic)")
    if by_topic and min(min(xs) for xs, _ in by_topic.values()) > 0:
        ax.set_xscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_report(
    spark: SparkSession,
    trace_path: str | Path,
    out_dir: str | Path,
    *,
    bucket_s: int = 60,
    chart: bool = True,
    phase: Callable[[str], None] | None = None,
) -> ReportResult:
    """Read the trace, write ``<out_dir>/report.parquet`` (replaced), draw
    ``<out_dir>/lateness.png`` and return the rows and the table.

    :param phase: told the name of each part as it starts (a progress bar's).
    """
    say = phase or (lambda text: None)
    out = Path(out_dir)
    say("report: reading the trace")
    trace = read_trace(spark, trace_path)
    report = delivery_report(trace, bucket_s)
    parquet = out / "report.parquet"
    say("report: per topic and bucket")
    report.write.mode("overwrite").parquet(str(parquet))
    rows = [
        r.asDict()
        for r in spark.read.parquet(str(parquet)).orderBy("topic", "bucket_start").collect()
    ]
    png = None
    if chart:
        say("report: lateness chart")
        hist = lateness_histogram(trace).collect()
        png = render_chart(
            [(h["topic"], h["lateness_ms"], h["n"]) for h in hist], out / "lateness.png"
        )
    return ReportResult(rows, parquet, png, format_table(rows))


def main(args: Any) -> int:
    """``chronoq report``: the runner behind the command (``args`` from its parser)."""
    import sys

    from spark_tasks.progress import SparkProgress
    from spark_tasks.session import get_spark, stop_spark

    trace = args.trace or default_trace_dir(args.url)
    if trace is None or not Path(trace).exists():
        print(f"chronoq report: no trace at {trace!r}; give --trace DIR", file=sys.stderr)  # noqa: T201
        return 1
    spark = get_spark(master=args.master) if args.master else get_spark()
    try:  # a bar of the Spark tasks on a terminal, unless --quiet
        with SparkProgress(spark, "report", quiet=getattr(args, "quiet", False)) as bar:
            result = run_report(spark, trace, args.out, bucket_s=args.bucket, phase=bar.phase)
    finally:
        stop_spark()
    print(result.table)  # noqa: T201 - the command's output
    print(f"\nreport: {result.parquet}")  # noqa: T201
    if result.chart is not None:
        print(f"chart: {result.chart}")  # noqa: T201
    return 0


__all__ = [
    "PERCENTILES",
    "TRACE_DDL",
    "ReportResult",
    "delivery_report",
    "format_table",
    "lateness_histogram",
    "main",
    "nearest_rank",
    "read_trace",
    "render_chart",
    "run_report",
    "with_lateness",
]
