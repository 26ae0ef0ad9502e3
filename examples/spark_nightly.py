"""A cron-triggered Spark job: daily revenue and unpaid orders over a generated dataset.

The shop's order history (5,000 orders over the last 7 days, generated at start
into ``<data dir>-orders/orders.csv``) is summarised by a Spark job that cron
fires every 2 seconds (a nightly ``0 2 * * *`` in real life). Its first run
prints the table, writes it as Parquet and stops the worker, so the example
ends by itself (~10 s, most of it the JVM starting)::

    python examples/spark_nightly.py
    chronoq worker --executor local --executor spark examples.spark_nightly:app

Both run the embedded broker and a dispatcher with the local and the Spark
executors in one process. With a shared broker (``chronoq broker serve``), run
the Spark jobs in their own process instead: ``chronoq worker --executor spark
examples.spark_nightly:app`` next to ``chronoq run`` for the local jobs (the
nightly job has its own topic, ``shop.spark``, so ``chronoq run`` never sees it).
"""

from __future__ import annotations

import csv
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler.scheduler import Scheduler
from workers import current_job, on_start, stop_app

URL = os.environ.get("CHRONOQ_BROKER_URL") or "rocksdb://./chronoq-data"
app = Scheduler(URL)
DATA = Path(URL.partition("://")[2].partition("?")[0] + "-orders")
ORDERS = 5_000
DAYS = 7


def generate_orders(path: Path, n: int = ORDERS, seed: int = 7) -> dict[str, tuple[int, int]]:
    """Write ``n`` orders (id, created_at, amount_cents, status) to ``path``.

    :returns: the expected ``{day: (revenue_cents of paid orders, unpaid count)}``.
    """
    rnd = random.Random(seed)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    expected: dict[str, list[int]] = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["order_id", "created_at", "amount_cents", "status"])
        for order_id in range(1, n + 1):
            created = today - timedelta(days=rnd.randrange(DAYS), seconds=rnd.randrange(86_400))
            amount = rnd.randrange(500, 50_000)
            status = rnd.choices(["paid", "unpaid", "closed"], [70, 20, 10])[0]
            out.writerow([order_id, created.isoformat(), amount, status])
            day = expected.setdefault(created.date().isoformat(), [0, 0])
            day[0] += amount if status == "paid" else 0
            day[1] += status == "unpaid"
    return {d: (r, u) for d, (r, u) in expected.items()}


EXPECTED: dict[str, tuple[int, int]] = {}


def daily_summary(orders: Any) -> Any:
    """Per day: revenue of paid orders and the count of unpaid ones (DataFrame -> DataFrame)."""
    from pyspark.sql import functions as F

    day = F.to_date(F.to_timestamp("created_at"))
    return (
        orders.groupBy(day.alias("day"))
        .agg(
            F.sum(
                F.when(F.col("status") == "paid", F.col("amount_cents").cast("long")).otherwise(0)
            ).alias("revenue_cents"),
            F.sum((F.col("status") == "unpaid").cast("long")).alias("unpaid_orders"),
        )
        .orderBy("day")
    )


@app.cron("*/2 * * * * *", executor="spark", name="shop.nightly", topic="shop.spark")
def nightly(spark: Any) -> None:
    """Summarise the orders, write the summary, print it, stop the worker."""
    job = current_job()
    orders = spark.read.option("header", True).csv(str(DATA / "orders.csv"))
    summary = daily_summary(orders)
    summary.write.mode("overwrite").parquet(str(DATA / "daily_summary.parquet"))
    rows = summary.collect()
    print(f"nightly run msg={job.msg_id} (Spark job group {job.msg_id})")
    print(f"{'day':<12}{'revenue':>14}{'unpaid':>8}")
    for r in rows:
        print(
            f"{r['day'].isoformat():<12}{r['revenue_cents'] / 100:>14,.2f}{r['unpaid_orders']:>8}"
        )
    got = {r["day"].isoformat(): (r["revenue_cents"], r["unpaid_orders"]) for r in rows}
    unpaid = sum(u for _, u in got.values())
    ok = got == EXPECTED
    print(f"summary: {len(rows)} days, {unpaid} unpaid orders{'' if ok else ' (UNEXPECTED)'}")
    stop_app(app)


@on_start(app)
def make_dataset() -> None:
    """Generate the order history the nightly job reads."""
    EXPECTED.clear()
    EXPECTED.update(generate_orders(DATA / "orders.csv"))
    print(f"generated {ORDERS} orders over {DAYS} days in {DATA / 'orders.csv'}")


def main() -> int:
    """Run the embedded broker, a dispatcher with local + Spark executors and cron."""
    import logging

    from workers.dispatcher import Dispatcher
    from workers.executors.factory import build_executors
    from workers.runner import run_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s")
    executors = build_executors(app, ["local", "spark"])
    start = time.monotonic()
    try:
        run_app(app, dispatcher=Dispatcher(app, executors=executors))
    finally:
        for executor in executors.values():
            executor.shutdown(wait=False)
        app.close()
    print(f"done in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
