"""The delivery report over a large trace (default 10,000,000 lines): pipeline time.

Run from the project root::

    .venv/bin/python bench/spark_report.py                 # 10M lines, 2 topics, 60 s buckets
    .venv/bin/python bench/spark_report.py -n 1000000 --no-chart

The trace is generated with Spark itself (``spark.range`` -> the trace columns
-> JSON lines, renamed ``trace-*.jsonl``): 2 topics, due times spread over one
hour, lateness from a long-tailed distribution, 5 % retries and 0.5 % dead
letters. Figures: generation time, then the report (read + aggregate + Parquet
+ table, and the PNG chart's histogram) in seconds and lines/s.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from spark_tasks.pipelines.delivery_report import run_report
from spark_tasks.session import get_spark, stop_spark


def generate(spark: object, n: int, out: Path, partitions: int) -> None:
    """Write ``n`` trace lines under ``out`` as ``trace-*.jsonl``."""
    df = (
        spark.range(0, n, numPartitions=partitions)
        .selectExpr(
            "id",
            "1 AS v",
            "IF(id % 3 = 0, 'orders', 'reports') AS topic",
            "'bench.job' AS job",
            "'chronoq.workers' AS `group`",
            "lpad(hex(id), 32, '0') AS msg_id",
            "CAST(NULL AS STRING) AS key",
            "CAST(1 + IF(id % 20 = 0, 1, 0) AS INT) AS attempt",
            f"1700000000000 + CAST(id * 3600000 / {n} AS BIGINT) AS deliver_at_ms",
            "CAST(floor(pow(rand(7), -0.7) * 2) AS BIGINT) AS late",
        )
        .selectExpr(
            "v",
            "topic",
            "job",
            "`group`",
            "msg_id",
            "key",
            "attempt",
            "deliver_at_ms - 20 AS sent_ms",
            "deliver_at_ms",
            "deliver_at_ms + 1 AS fired_ms",
            "deliver_at_ms + 1 AS dispatched_ms",
            "deliver_at_ms + late AS started_ms",
            "deliver_at_ms + late + 2 AS finished_ms",
            "CASE WHEN id % 200 = 0 THEN 'dead' WHEN id % 20 = 0 THEN 'retry' ELSE 'ok' END "
            "AS outcome",
            "CAST(NULL AS STRING) AS error",
        )
    )
    tmp = out.with_name(out.name + ".spark")
    df.write.json(str(tmp))
    out.mkdir(parents=True)
    for i, part in enumerate(sorted(tmp.glob("part-*.json"))):
        part.rename(out / f"trace-1700000000000-{i + 1:05d}.jsonl")
    shutil.rmtree(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000_000, help="trace lines")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--bucket", type=int, default=60, help="bucket seconds")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-chart", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chronoq-report-bench-"))
    spark = get_spark(master=args.master, conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        t = time.perf_counter()
        generate(spark, args.n, root / "trace", args.partitions)
        size = sum(p.stat().st_size for p in (root / "trace").iterdir())
        print(
            f"generated {args.n:,} trace lines ({size / 2**20:,.0f} MiB) in "
            f"{time.perf_counter() - t:.1f} s"
        )
        t = time.perf_counter()
        result = run_report(
            spark, root / "trace", root / "out", bucket_s=args.bucket, chart=not args.no_chart
        )
        took = time.perf_counter() - t
        print("\n".join(result.table.splitlines()[:4]) + "\n...")
        print(
            f"report: {len(result.rows)} rows over {args.n:,} lines in {took:.1f} s = "
            f"{args.n / took:,.0f} lines/s (chart: {result.chart is not None})"
        )
    finally:
        stop_spark()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
