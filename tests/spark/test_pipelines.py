"""The pipelines on the real local session: the delivery report's exact percentiles
against a plain-Python nearest-rank computation, and bulk_schedule's validation,
rejects and idempotence."""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from broker_adapter import open_broker
from spark_tasks.pipelines.bulk_schedule import bulk_schedule, validate
from spark_tasks.pipelines.delivery_report import delivery_report, read_trace, run_report

pytestmark = pytest.mark.external_service

T0 = 1_700_000_000_000  # a bucket boundary for 60 s buckets (divisible by 60,000)
#: Percentiles as exact fractions (numerator, denominator): no float rounding in the reference.
EXACT = {"p50": (50, 100), "p90": (90, 100), "p99": (99, 100), "p999": (999, 1000)}


def nearest_rank_reference(values: list[int], num: int, den: int) -> int:
    """The smallest value with at least num/den of the values at or below it."""
    ordered = sorted(values)
    rank = -(-num * len(ordered) // den)  # ceil(num/den * n) in integers
    return ordered[max(rank, 1) - 1]


def _write_trace(directory: Path) -> list[dict[str, Any]]:
    """A trace over two topics and three 60 s buckets, with retries, dead letters and
    skipped lines (which the report must leave out); sizes hit rank edge cases."""
    rnd = random.Random(5)
    lines: list[dict[str, Any]] = []
    sizes = {("a", 0): 1000, ("a", 1): 1001, ("b", 0): 7, ("b", 2): 1}
    for (topic, bucket), n in sizes.items():
        for i in range(n):
            due = T0 + bucket * 60_000 + rnd.randrange(50_000)
            late = int(rnd.paretovariate(1.5) * 3) - 2  # a long tail, some negatives
            outcome = rnd.choice(["ok"] * 8 + ["retry", "dead"])
            lines.append(
                {
                    "v": 1,
                    "msg_id": f"{topic}{bucket}{i:030d}",
                    "topic": topic,
                    "job": "j",
                    "key": None,
                    "group": "g",
                    "attempt": 1 + (i % 3 == 0),
                    "sent_ms": due - 9,
                    "deliver_at_ms": due,
                    "fired_ms": due + 1,
                    "dispatched_ms": due + 1,
                    "started_ms": due + late,
                    "finished_ms": due + late + 3,
                    "outcome": outcome,
                    "error": None,
                }
            )
    skipped = dict(lines[0], msg_id="s" * 32, outcome="skipped", started_ms=None)
    directory.mkdir(parents=True)
    half = len(lines) // 2
    for name, part in (
        ("trace-1-00001.jsonl", lines[:half] + [skipped]),
        ("trace-1-00002.jsonl", lines[half:]),
    ):
        (directory / name).write_text("".join(json.dumps(x) + "\n" for x in part))
    return lines


def test_report_percentiles_are_exact_nearest_rank(spark: Any, tmp_path: Path) -> None:
    lines = _write_trace(tmp_path / "trace")
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        groups[(x["topic"], (x["fired_ms"] // 60_000) * 60_000)].append(x)
    result = run_report(spark, tmp_path / "trace", tmp_path / "out", bucket_s=60)
    got = {(r["topic"], int(r["bucket_start"].timestamp() * 1000)): r for r in result.rows}
    assert set(got) == set(groups)
    for key, xs in groups.items():
        row = got[key]
        late = [x["started_ms"] - x["deliver_at_ms"] for x in xs]
        for name, (num, den) in EXACT.items():
            assert row[f"late_{name}"] == nearest_rank_reference(late, num, den), (key, name)
        assert row["late_max"] == max(late)
        assert row["deliveries"] == len(xs)
        assert row["messages"] == sum(x["attempt"] == 1 for x in xs)
        assert row["retries"] == sum(x["outcome"] == "retry" for x in xs)
        assert row["dead"] == sum(x["outcome"] == "dead" for x in xs)
        assert row["throughput"] == pytest.approx(len(xs) / 60)
    assert result.chart is not None and result.chart.read_bytes()[:4] == b"\x89PNG"
    assert spark.read.parquet(str(result.parquet)).count() == len(groups)
    assert "late_p999" in result.table.splitlines()[0]


def test_report_is_a_pure_dataframe_function(spark: Any, tmp_path: Path) -> None:
    _write_trace(tmp_path / "trace")
    trace = read_trace(spark, tmp_path / "trace")
    report = delivery_report(trace, bucket_s=3600)
    assert report.count() == 2  # every line falls in one hour: one row per topic
    assert set(report.columns) >= {"topic", "bucket_start", "late_p999", "late_max", "dead"}


ROWS = [
    # key, job, deliver_at, delay_s, args -> expected reason (None: valid)
    ("order:1", "close", "2031-01-01T00:00:00Z", "", "[1]", None),
    ("order:2", "close", "", "30", "[2]", None),
    ("order:3", "close", "1924992000000", "", "[]", None),
    ("order:4", "report", "2031-01-01T08:00:00+08:00", "", '["x", {"a": 1}]', None),
    ("order:1", "close", "2031-01-01T00:00:00Z", "", "[1]", None),  # same key again
    ("", "close", "", "30", "[5]", "missing key"),
    ("order:6", "nope", "", "30", "[6]", "unknown job nope"),
    ("order:7", "close", "2031-01-01T00:00:00", "", "[7]", "deliver_at has no UTC offset"),
    ("order:8", "close", "tomorrow", "", "[8]", "deliver_at is not a time"),
    ("order:9", "close", "2031-01-01T00:00:00Z", "5", "[9]", "give exactly one of"),
    ("order:10", "close", "", "", "[10]", "give exactly one of"),
    ("order:11", "close", "", "-1", "[11]", "delay_s is not a number >= 0"),
    ("order:12", "close", "", "soon", "[12]", "delay_s is not a number >= 0"),
    ("order:13", "close", "", "30", "[13", "args is not a JSON array"),
    ("order:14", "close", "", "30", '{"a": 1}', "args is not a JSON array"),
    ("cron:x:1", "close", "", "30", "[]", "reserved"),
    ("order:16", "close", "2999-01-01T00:00:00Z", "", "[]", "max delay"),
]


def test_bulk_schedule_validates_and_schedules_each_key_once(
    spark: Any, tmp_path: Path, data_dir: Path
) -> None:
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "job", "deliver_at", "delay_s", "args"])
        writer.writerows(r[:5] for r in ROWS)
    jobs = {"close": "orders", "report": "reports"}
    bad = [r for r in ROWS if r[5] is not None]
    with open_broker(f"rocksdb://{data_dir}") as broker:
        first = bulk_schedule(
            spark, path, jobs, broker=broker, rejects_path=tmp_path / "rejects", batch_size=2
        )
        second = bulk_schedule(spark, path, jobs, broker=broker, batch_size=3)
        pending = broker.pending(limit=100)
    assert (first.accepted, first.duplicate, first.rejected) == (4, 1, len(bad))
    assert (second.accepted, second.duplicate, second.rejected) == (0, 5, len(bad))
    assert sorted((v.topic, v.key) for v in pending) == [
        ("orders", "order:1"),
        ("orders", "order:2"),
        ("orders", "order:3"),
        ("reports", "order:4"),
    ]
    rejects = {
        (r["key"] or ""): r["reason"]
        for r in spark.read.parquet(str(tmp_path / "rejects")).collect()
    }
    assert len(rejects) == len(bad)
    for key, *_, reason in bad:
        assert reason in rejects[key], (key, rejects[key])
    by_key = {v.key: v for v in pending}
    assert by_key["order:3"].deliver_at_ms == 1924992000000
    assert by_key["order:4"].deliver_at_ms == 1924992000000


def test_validated_body_is_a_job_call(spark: Any) -> None:
    from scheduler.jobcall import JobCall

    df = spark.createDataFrame(
        [("k", "close", None, "0", '["x", {"a": [1, 2]}]')],
        "key string, job string, deliver_at string, delay_s string, args string",
    )
    row = validate(df, {"close": "orders"}, now_ms=1_000).first()
    assert row["reason"] is None and row["deliver_at_ms"] == 1_000
    call = JobCall.decode(row["body"].encode())
    assert call == JobCall("close", ("x", {"a": [1, 2]}))


def test_bulk_schedule_from_executors_through_the_broker_server(
    spark: Any, tmp_path: Path, data_dir: Path
) -> None:
    server_mod = pytest.importorskip("broker_adapter.server.server")
    rows = spark.createDataFrame(
        [(f"order:{i}", "close", None, str(60 + i), f"[{i}]") for i in range(50)]
        + [("order:bad", "close", None, "-5", "[]")],
        "key string, job string, deliver_at string, delay_s string, args string",
    ).repartition(4)
    server = server_mod.BrokerServer(data_dir, port=0)
    server.start()
    try:
        url = f"chronoq://127.0.0.1:{server.port}"
        runs = [
            bulk_schedule(spark, rows, {"close": "orders"}, broker_url=url, batch_size=7)
            for _ in range(2)
        ]
        with open_broker(url) as broker:
            keys = sorted(v.key or "" for v in broker.pending("orders", limit=1000))
    finally:
        server.shutdown()
    assert [(r.accepted, r.duplicate, r.rejected) for r in runs] == [(50, 0, 1), (0, 50, 1)]
    assert keys == sorted(f"order:{i}" for i in range(50))


def test_report_runs_as_a_scheduled_spark_job(spark: Any, tmp_path: Path, data_dir: Path) -> None:
    from broker_adapter.clock import ManualClock
    from scheduler.scheduler import Scheduler
    from spark_tasks.jobs import REPORT_JOB, register_report_job
    from workers import Dispatcher
    from workers.executors.spark import SparkExecutor
    from workers.routing import dedicated_group

    lines = _write_trace(tmp_path / "trace")
    clock = ManualClock(T0)
    with Scheduler(f"rocksdb://{data_dir}", clock=clock) as app:
        handle = register_report_job(
            app, "* * * * * *", trace_dir=tmp_path / "trace", out_dir=tmp_path / "out"
        )
        assert handle.name == REPORT_JOB and handle.topic == "chronoq.jobs.spark"
        assert app.planner.arm_all() == 1
        first = app.pending()[0]
        clock.set(first.deliver_at_ms)
        from .conftest import wait_fired

        wait_fired(app, first.msg_id)
        executor = SparkExecutor(app, session=lambda: spark, stop_session=False)
        group = dedicated_group(app.settings.group, ["spark"])
        with Dispatcher(app, group=group, executors={"spark": executor}) as dispatcher:
            assert dispatcher.run_until_idle(60) == 1
        executor.shutdown()
    report = spark.read.parquet(str(tmp_path / "out" / "report.parquet"))
    assert report.groupBy().sum("deliveries").first()[0] == len(lines)
    assert (tmp_path / "out" / "lateness.png").exists()
