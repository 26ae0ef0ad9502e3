"""Bulk scheduling: a CSV/Parquet dataset of rows becomes timed job messages.

Input columns (CSV with a header, or Parquet):

============  ==============================================================
``key``       business key, required (1 to 512 characters, not ``cron:...``)
``job``       a job name registered in the app
``deliver_at`` when it is due: ISO-8601 with a UTC offset
              (``2024-05-01T10:00:00+02:00``, ``...Z``) or epoch milliseconds
``delay_s``   or: seconds from the run of this pipeline (exactly one of the two)
``args``      a JSON array of positional arguments (optional, ``[]``)
``kwargs``    a JSON object of keyword arguments (optional, ``{}``)
============  ==============================================================

:func:`validate` (pure) gives each row a ``reason`` (``null`` when valid), its
``topic``, ``deliver_at_ms`` and the message ``body``. Rejected rows are written
with their reason to the rejects path, never silently dropped.

Valid rows are sent in partition-wise batches with ``send_batch``:

* **driver mode** (the default, and the only way with an embedded ``rocksdb://``
  broker, whose directory one process owns): partitions come to the driver one
  at a time (``toLocalIterator``) and are sent there, ``batch_size`` rows per batch;
* **executor mode** (``broker_url=`` a ``chronoq://`` or ``redis://`` URL that
  executors can reach): each partition opens the broker in its Python worker and
  sends its rows itself.

Idempotent by key: a row whose key already names a pending message of its topic
is a ``DUPLICATE`` (counted, not sent again); so is one whose message already
fired, when it gives the same ``deliver_at`` (a ``delay_s`` row is relative, so
re-running it after its message fired schedules it again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_adapter.base import DEFAULT_MAX_DELAY_MS
from broker_adapter.errors import InvalidArgument
from broker_adapter.message import MAX_KEY_CHARS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from broker_adapter.base import BrokerAdapter

DEFAULT_BATCH_SIZE = 2000
COLUMNS = ("key", "job", "deliver_at", "delay_s", "args", "kwargs")


def _col_or_null(df: DataFrame, name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(name) if name in df.columns else F.lit(None).cast("string")


def _deliver_at_ms(df: DataFrame) -> tuple[Column, Column]:
    """``(epoch ms or null, has no UTC offset)`` of the ``deliver_at`` column."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType, StringType, TimestampType

    if "deliver_at" not in df.columns:
        return F.lit(None).cast("long"), F.lit(False)
    dtype = df.schema["deliver_at"].dataType
    col = F.col("deliver_at")
    if isinstance(dtype, TimestampType):
        return F.unix_millis(col), F.lit(False)
    if isinstance(dtype, NumericType):
        return col.cast("long"), F.lit(False)
    text = F.trim(col.cast(StringType()))
    digits = text.rlike(r"^[0-9]{1,15}$")
    offset = text.rlike(r"(Z|z|[+-][0-9]{2}:?[0-9]{2})$")
    parsed = F.unix_millis(F.expr("try_to_timestamp(trim(cast(deliver_at as string)))"))
    ms = F.when(digits, F.expr("try_cast(trim(cast(deliver_at as string)) as bigint)")).otherwise(
        F.when(offset, parsed)
    )
    return ms, ~digits & ~offset & parsed.isNotNull()


def validate(
    df: DataFrame,
    jobs: Mapping[str, str],
    now_ms: int,
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
) -> DataFrame:
    """``df`` plus ``reason``, ``topic``, ``deliver_at_ms`` and ``body`` (pure).

    :param jobs: job name -> its topic (the jobs rows may name).
    :param now_ms: the time ``delay_s`` counts from.
    :param max_delay_ms: rows due later than ``now_ms`` plus this are rejected.
    """
    import json

    from pyspark.sql import functions as F

    from scheduler.jobcall import WIRE_VERSION

    key = F.col("key").cast("string")
    job = F.col("job").cast("string")
    delay_raw = _col_or_null(df, "delay_s")
    delay = F.expr("try_cast(delay_s as double)") if "delay_s" in df.columns else F.lit(None)
    args = F.coalesce(F.trim(_col_or_null(df, "args").cast("string")), F.lit("[]"))
    kwargs = F.coalesce(F.trim(_col_or_null(df, "kwargs").cast("string")), F.lit("{}"))
    at_ms, naive = _deliver_at_ms(df)
    at_given = _col_or_null(df, "deliver_at").isNotNull() & (
        F.trim(_col_or_null(df, "deliver_at").cast("string")) != ""
    )
    delay_given = delay_raw.isNotNull() & (F.trim(delay_raw.cast("string")) != "")
    due = F.when(at_given, at_ms).otherwise(F.lit(now_ms) + F.round(delay * 1000).cast("long"))
    names = list(jobs)
    topic_map = F.create_map(*[F.lit(x) for n in names for x in (n, jobs[n])]) if names else None
    prefix_map = (
        F.create_map(
            *[
                F.lit(x)
                for n in names
                for x in (n, f'{{"v":{WIRE_VERSION},"job":{json.dumps(n)},"args":')
            ]
        )
        if names
        else None
    )
    known = job.isin(names) if names else F.lit(False)
    reason = (
        F.when(key.isNull() | (F.trim(key) == ""), F.lit("missing key"))
        .when(F.length(key) > MAX_KEY_CHARS, F.lit(f"key longer than {MAX_KEY_CHARS} characters"))
        .when(key.startswith("cron:"), F.lit("keys starting with 'cron:' are reserved"))
        .when(job.isNull(), F.lit("missing job"))
        .when(~known, F.concat(F.lit("unknown job "), job))
        .when(at_given == delay_given, F.lit("give exactly one of deliver_at and delay_s"))
        .when(at_given & naive, F.lit("deliver_at has no UTC offset (add Z or +hh:mm)"))
        .when(
            at_given & at_ms.isNull(),
            F.lit("deliver_at is not a time (ISO-8601 with offset, or epoch ms)"),
        )
        .when(at_given & (at_ms < 0), F.lit("deliver_at is before 1970"))
        .when(
            delay_given & (delay.isNull() | F.isnan(delay) | (delay < 0)),
            F.lit("delay_s is not a number >= 0"),
        )
        .when(due > F.lit(now_ms + max_delay_ms), F.lit("due after the broker's max delay"))
        .when(
            F.expr("json_array_length(coalesce(trim(cast(args as string)), '[]'))").isNull()
            if "args" in df.columns
            else F.lit(False),
            F.lit("args is not a JSON array"),
        )
        .when(
            F.expr("json_object_keys(coalesce(trim(cast(kwargs as string)), '{}'))").isNull()
            if "kwargs" in df.columns
            else F.lit(False),
            F.lit("kwargs is not a JSON object"),
        )
    )
    out = df.withColumn("reason", reason)
    valid = F.col("reason").isNull()
    body = (
        F.concat(F.element_at(prefix_map, job), args, F.lit(',"kwargs":'), kwargs, F.lit("}"))
        if prefix_map is not None
        else F.lit(None)
    )
    return (
        out.withColumn(
            "topic",
            F.when(valid, F.element_at(topic_map, job))
            if topic_map is not None
            else F.lit(None).cast("string"),
        )
        .withColumn("deliver_at_ms", F.when(valid, due))
        .withColumn("body", F.when(valid, body))
    )


# -- sending --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BulkResult:
    """Counts of one :func:`bulk_schedule` run.

    :param accepted: rows stored as new messages.
    :param duplicate: valid rows whose key was already scheduled (nothing stored).
    :param rejected: invalid rows (written with their reason to ``rejects``).
    :param rejects: where the rejected rows were written, or ``None`` if none.
    :param seconds: wall time of the run.
    """

    accepted: int
    duplicate: int
    rejected: int
    rejects: Path | None
    seconds: float

    @property
    def rows(self) -> int:
        """All input rows."""
        return self.accepted + self.duplicate + self.rejected


def send_rows(broker: BrokerAdapter, rows: Iterable[Any], batch_size: int) -> tuple[int, int]:
    """Send ``(key, topic, deliver_at_ms, body)`` rows in batches; ``(ok, duplicate)``."""
    from broker_adapter.message import Message
    from broker_adapter.results import SendStatus

    ok = dup = 0
    batch: list[Message] = []
    for key, topic, due, body in rows:
        batch.append(Message(topic, body.encode(), key, deliver_at_ms=due))
        if len(batch) >= batch_size:
            n = sum(r.status is SendStatus.OK for r in broker.send_batch(batch))
            ok, dup, batch = ok + n, dup + len(batch) - n, []
    if batch:
        n = sum(r.status is SendStatus.OK for r in broker.send_batch(batch))
        ok, dup = ok + n, dup + len(batch) - n
    return ok, dup


def _as_tuples(rows: Iterable[Any]) -> Iterator[list[tuple[Any, ...]]]:
    yield [tuple(r) for r in rows]


def _send_partition(url: str, batch_size: int) -> Any:
    def send(rows: Iterator[Any]) -> Iterator[tuple[int, int]]:
        from broker_adapter.urls import open_broker

        with open_broker(url) as broker:
            yield send_rows(broker, (tuple(r) for r in rows), batch_size)

    return send


def read_rows(spark: SparkSession, path: str | Path) -> DataFrame:
    """The input rows: Parquet for ``*.parquet`` (file or directory), else CSV (RFC 4180,
    with a header; every column read as text)."""
    p = str(path)
    if p.rstrip("/").endswith(".parquet"):
        return spark.read.parquet(p)
    reader = spark.read.option("header", True).option("inferSchema", False)
    return reader.option("escape", '"').csv(p)  # RFC 4180: a quote in a field is doubled


def bulk_schedule(
    spark: SparkSession,
    rows: DataFrame | str | Path,
    jobs: Mapping[str, str],
    *,
    broker: BrokerAdapter | None = None,
    broker_url: str | None = None,
    rejects_path: str | Path | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now_ms: int | None = None,
    phase: Callable[[str], None] | None = None,
) -> BulkResult:
    """Validate ``rows`` and schedule the valid ones; see the module docstring.

    :param rows: a DataFrame, or the path of a CSV/Parquet dataset.
    :param jobs: job name -> topic (``jobs_of(app)``).
    :param broker: send from the driver through this open broker (driver mode).
    :param broker_url: send from the executors through this URL (executor mode);
        give exactly one of ``broker`` and ``broker_url``.
    :param rejects_path: where rejected rows go (Parquet directory, replaced).
    :param phase: told the name of each part as it starts (a progress bar's).
    :raises InvalidArgument: unless exactly one of ``broker`` and ``broker_url`` is
        given, or for a ``memory://`` ``broker_url`` (a broker of one process).
    """
    if (broker is None) == (broker_url is None):
        raise InvalidArgument(
            "bulk_schedule: give exactly one of broker= (driver mode) or broker_url= (executors)"
        )
    if broker_url is not None and broker_url.partition("://")[0] == "memory":
        # Each executor's Python worker would fill a memory broker of its own, lost
        # when it exits: the rows would be "accepted" and gone.
        raise InvalidArgument(
            f"bulk_schedule: executors cannot send to {broker_url!r}, a broker of one "
            "process; pass the open broker as broker= (driver mode), or a chronoq:// or "
            "redis:// URL the executors reach"
        )
    say = phase or (lambda text: None)
    start = time.perf_counter()
    say("bulk schedule: validating")
    df = read_rows(spark, rows) if isinstance(rows, str | Path) else rows
    now = int(time.time() * 1000) if now_ms is None else now_ms
    checked = validate(df, jobs, now).cache()
    try:
        rejected_df = checked.filter("reason IS NOT NULL").drop("topic", "deliver_at_ms", "body")
        rejected = rejected_df.count()
        if rejected and rejects_path is not None:
            rejected_df.write.mode("overwrite").parquet(str(rejects_path))
        valid = checked.filter("reason IS NULL").select("key", "topic", "deliver_at_ms", "body")
        say("bulk schedule: sending")
        if broker is not None:
            # Python workers turn each partition into one list of plain tuples (Rows are
            # slow to build); the driver gets them a partition at a time and sends.
            parts = valid.rdd.mapPartitions(_as_tuples).toLocalIterator(prefetchPartitions=True)
            ok, dup = send_rows(broker, (row for part in parts for row in part), batch_size)
        else:
            assert broker_url is not None
            counts = valid.rdd.mapPartitions(_send_partition(broker_url, batch_size)).collect()
            ok, dup = sum(c[0] for c in counts), sum(c[1] for c in counts)
    finally:
        checked.unpersist()
    return BulkResult(
        ok,
        dup,
        rejected,
        Path(rejects_path) if rejected and rejects_path else None,
        time.perf_counter() - start,
    )


def jobs_of(app: Any) -> dict[str, str]:
    """Job name -> topic for every job of ``app`` (a :class:`scheduler.Scheduler`)."""
    default = app.settings.topic
    return {spec.name: spec.topic_or(default) for spec in app.registry}


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_tasks.pipelines.bulk_schedule module:app ROWS [--rejects DIR]
    [--broker-url URL] [--master M]``: schedule the rows, print accepted/rejected."""
    import argparse

    from scheduler.apps import AppNotFound, load_app
    from spark_tasks.progress import SparkProgress
    from spark_tasks.session import get_spark, stop_spark

    parser = argparse.ArgumentParser(prog="bulk_schedule", description=main.__doc__)
    parser.add_argument("target", help="module:app whose jobs the rows name")
    parser.add_argument("rows", help="CSV (with header) or *.parquet dataset")
    parser.add_argument("--rejects", default="bulk-rejects.parquet", help="rejected rows go here")
    parser.add_argument("--broker-url", help="send from executors through this URL")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--master", help="Spark master (default: $CHRONOQ_SPARK_MASTER)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    args = parser.parse_args(argv)
    try:
        app = load_app(args.target)
    except AppNotFound as e:
        raise SystemExit(f"bulk_schedule: {e}") from e
    spark = get_spark(master=args.master)
    try:  # a bar of the Spark tasks on a terminal, unless --quiet
        with SparkProgress(spark, "bulk schedule", quiet=args.quiet) as bar:
            res = bulk_schedule(
                spark,
                args.rows,
                jobs_of(app),
                broker=None if args.broker_url else app.broker,
                broker_url=args.broker_url,
                rejects_path=args.rejects,
                batch_size=args.batch_size,
                phase=bar.phase,
            )
    finally:
        stop_spark()
        app.close()
    print(  # noqa: T201 - the command's output
        f"accepted {res.accepted}, duplicate {res.duplicate} (already scheduled), "
        f"rejected {res.rejected}"
        + (f" -> {res.rejects}" if res.rejects else "")
        + f"; {res.rows / max(res.seconds, 1e-9):,.0f} rows/s"
    )
    return 0


__all__ = [
    "COLUMNS",
    "BulkResult",
    "bulk_schedule",
    "jobs_of",
    "main",
    "read_rows",
    "send_rows",
    "validate",
]

if __name__ == "__main__":
    raise SystemExit(main())
