"""bulk_schedule of N rows (default 1,000,000) into a broker: rows/s and total time.

Run from the project root::

    .venv/bin/python bench/spark_bulk_schedule.py                  # embedded, driver mode
    .venv/bin/python bench/spark_bulk_schedule.py --server         # chronoq:// server, executors send
    .venv/bin/python bench/spark_bulk_schedule.py -n 200000 --partitions 4

Steps, on fresh directories under the temp dir (removed after):

1. generate the rows with Spark (``key=order:<i>``, job ``close_order``,
   ``delay_s`` 1 h to 2 h, so nothing fires during the run, ``args=[i]``) and write them as Parquet (timed apart);
2. **first run**: validate + schedule every row (all accepted);
3. **second run**: the same rows again (all ``DUPLICATE``: idempotent by key).

Figures: rows/s and seconds of each run (Spark session start excluded), and the
broker's pending count afterwards (must equal N).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from broker_adapter import open_broker
from spark_tasks.pipelines.bulk_schedule import bulk_schedule
from spark_tasks.session import get_spark, stop_spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="rows")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--server", action="store_true", help="send from executors through a chronoq:// server"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chronoq-bulk-bench-"))
    spark = get_spark(master=args.master, conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    server = None
    try:
        t = time.perf_counter()
        rows = root / "rows.parquet"
        spark.range(0, args.n, numPartitions=args.partitions).selectExpr(
            "concat('order:', id) AS key",
            "'close_order' AS job",
            "CAST(NULL AS STRING) AS deliver_at",
            "CAST(3600 + id % 3600 AS STRING) AS delay_s",
            "concat('[', id, ']') AS args",
        ).write.parquet(str(rows))
        print(f"generated {args.n:,} rows in {time.perf_counter() - t:.1f} s")
        jobs = {"close_order": "orders"}
        if args.server:
            from broker_adapter.server.server import BrokerServer

            server = BrokerServer(root / "data", port=0)
            server.start()
            url = f"chronoq://127.0.0.1:{server.port}"
            broker = open_broker(url)
            mode = f"executors -> {url}"
        else:
            broker = open_broker(f"rocksdb://{root / 'data'}")
            mode = "driver -> embedded rocksdb"
        with broker:
            for name in ("first run", "second run"):
                res = bulk_schedule(
                    spark,
                    rows,
                    jobs,
                    broker=None if args.server else broker,
                    broker_url=url if args.server else None,
                    batch_size=args.batch_size,
                )
                print(
                    f"{name} ({mode}, {args.partitions} partitions, batches of "
                    f"{args.batch_size}): accepted {res.accepted:,}, duplicate "
                    f"{res.duplicate:,}, rejected {res.rejected:,} in {res.seconds:.1f} s = "
                    f"{res.rows / res.seconds:,.0f} rows/s"
                )
            pending = broker.stats().topics["orders"].pending
        print(f"pending on topic orders: {pending:,} (expected {args.n:,})")
        return 0 if pending == args.n else 1
    finally:
        if server is not None:
            server.shutdown()
        stop_spark()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
