"""Spark jobs through the Dispatcher and the SparkExecutor on the real local session:
a job (and a cron job) fires and writes its output; a timeout cancels its Spark job
group; an abort that arrives while it runs is reported."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from broker_adapter import AbortStatus, MessageState
from broker_adapter.clock import ManualClock
from scheduler.scheduler import Scheduler
from scheduler.spec import RetryPolicy
from workers import Dispatcher, current_job
from workers.executors.spark import SparkExecutor, abort_run
from workers.routing import dedicated_group

from .conftest import wait_fired

pytestmark = pytest.mark.external_service

SPARK_TOPIC = "chronoq.spark"


def _spark_dispatcher(app: Scheduler, spark: Any) -> tuple[Dispatcher, SparkExecutor]:
    executor = SparkExecutor(app, session=lambda: spark, stop_session=False, watch_interval_s=0.05)
    dispatcher = Dispatcher(
        app,
        group=dedicated_group(app.settings.group, ["spark"]),
        executors={"spark": executor},
    )
    return dispatcher, executor


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(90), f"gave up waiting for {what}"


def test_spark_job_fires_gets_the_session_and_writes_its_output(
    app: Scheduler, spark: Any, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    @app.job(executor="spark", topic=SPARK_TOPIC)
    def daily_totals(session: Any, out: str, n: int) -> None:
        sc = session.sparkContext
        seen["group"] = sc.getLocalProperty("spark.jobGroup.id")
        seen["description"] = sc.getLocalProperty("spark.job.description")
        seen["msg_id"] = current_job().msg_id
        df = session.range(n).selectExpr("id % 3 AS k", "id AS v").groupBy("k").sum("v")
        df.write.mode("overwrite").parquet(out)

    out = tmp_path / "totals.parquet"
    handle = daily_totals.schedule(str(out), 10)
    wait_fired(app, handle.msg_id)
    dispatcher, executor = _spark_dispatcher(app, spark)
    with dispatcher:
        assert dispatcher.run_until_idle(60) == 1
    executor.shutdown()
    rows = {r["k"]: r["sum(v)"] for r in spark.read.parquet(str(out)).collect()}
    assert rows == {0: 0 + 3 + 6 + 9, 1: 1 + 4 + 7, 2: 2 + 5 + 8}
    assert seen["group"] == seen["msg_id"] == handle.msg_id
    assert seen["description"] == f"chronoq {daily_totals.name} msg={handle.msg_id} attempt=1"
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_cron_spark_job_gets_the_session(
    app: Scheduler, spark: Any, manual_clock: ManualClock
) -> None:
    counts: list[int] = []

    @app.cron("* * * * * *", executor="spark", topic=SPARK_TOPIC)
    def nightly(session: Any) -> None:
        counts.append(session.range(4).count())

    assert app.planner.arm_all() == 1
    first = app.pending()[0]
    manual_clock.set(first.deliver_at_ms)
    wait_fired(app, first.msg_id)
    dispatcher, executor = _spark_dispatcher(app, spark)
    with dispatcher:
        assert dispatcher.run_until_idle(60) == 1
    executor.shutdown()
    assert counts == [4]


def test_failure_is_retried_per_policy(app: Scheduler, spark: Any) -> None:
    @app.job(executor="spark", topic=SPARK_TOPIC, retry=RetryPolicy.fixed(30))
    def broken(session: Any) -> None:
        session.sql("SELECT no_such_column FROM range(1)").collect()

    handle = broken.schedule()
    wait_fired(app, handle.msg_id)
    dispatcher, executor = _spark_dispatcher(app, spark)
    with dispatcher:
        assert dispatcher.run_until_idle(60) == 1
    executor.shutdown()
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.PENDING  # waiting for its retry
    assert view.error is not None and "no_such_column" in view.error


def test_timeout_cancels_the_spark_job_group(app: Scheduler, spark: Any) -> None:
    ended = threading.Event()
    outcome: list[str] = []

    @app.job(executor="spark", topic=SPARK_TOPIC, timeout=1, max_attempts=1)
    def slow(session: Any) -> None:
        try:
            session.sparkContext.parallelize(range(2), 2).map(
                lambda x: time.sleep(120) or x
            ).collect()
            outcome.append("completed")
        except Exception as e:  # noqa: BLE001 - the cancelled Spark job surfaces here
            outcome.append("cancelled" if "cancel" in str(e).lower() else f"other: {e}")
        finally:
            ended.set()

    handle = slow.schedule()
    wait_fired(app, handle.msg_id)
    dispatcher, executor = _spark_dispatcher(app, spark)
    with dispatcher:
        assert dispatcher.run_until_idle(60) == 1  # the timeout settled it
        _wait(ended, "the cancelled Spark job to return")
    executor.shutdown()
    assert executor.cancelled_groups == [handle.msg_id]
    assert outcome == ["cancelled"]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD
    assert view.error is not None and "timeout" in view.error


def test_abort_while_running_is_reported(
    app: Scheduler, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started, release = threading.Event(), threading.Event()

    @app.job(executor="spark", topic=SPARK_TOPIC)
    def export(session: Any, order_id: int) -> None:
        started.set()
        _wait(release, "the test to release the job")

    handle = export.schedule(7, key="export:7")
    wait_fired(app, handle.msg_id)
    dispatcher, executor = _spark_dispatcher(app, spark)
    caplog.set_level(logging.WARNING, logger="chronoq.workers.SparkExecutor")
    runner = threading.Thread(target=dispatcher.run_until_idle, args=(60,))
    runner.start()
    try:
        _wait(started, "the job to start")
        result = abort_run(export, key="export:7")
        assert result.status is AbortStatus.ALREADY_DELIVERED
        deadline = time.monotonic() + 30
        while not executor.late_aborts and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        release.set()
        runner.join(60)
        dispatcher.close()
        executor.shutdown()
    assert executor.late_aborts == [(handle.msg_id, export.name)]
    assert any(
        "abort arrived while it runs" in r.getMessage() and handle.msg_id in r.getMessage()
        for r in caplog.records
    )
