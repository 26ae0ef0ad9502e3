"""Routing of Spark jobs to their dedicated dispatcher, and the delivery trace
(no JVM needed: a stand-in executor plays the Spark one)."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from broker_adapter import MessageState
from broker_adapter.clock import ManualClock
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from scheduler.spec import JobSpec, RetryPolicy
from workers import Dispatcher
from workers.routing import dedicated_group, topics_for
from workers.trace import FIELDS, DeliveryTrace, default_trace_dir

from .conftest import wait_fired


class FakeSpark:
    """An executor named "spark" that runs the body in the calling thread with a fake session."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        fut: Future[Any] = Future()
        self.ran.append(message.msg_id)
        try:
            fut.set_result(spec.func("session", *call.args, **call.kwargs))
        except Exception as e:  # noqa: BLE001
            fut.set_exception(e)
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("trace-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def test_topics_follow_the_executors(app: Scheduler) -> None:
    @app.job
    def local_job() -> None: ...

    @app.job(executor="spark", topic="chronoq.spark")
    def spark_job(spark: Any) -> None: ...

    @app.job(executor="celery", topic="celery.jobs")
    def celery_job() -> None: ...

    registry, default = app.registry, app.settings.topic
    assert topics_for(registry, default, ["local"]) == ["celery.jobs", "chronoq.jobs"]
    assert topics_for(registry, default, ["spark"]) == ["chronoq.spark"]
    assert dedicated_group("g", ["spark"]) == "g.spark"
    assert dedicated_group("g", ["local", "spark"]) == "g"


def test_shared_topic_each_group_runs_only_its_jobs(app: Scheduler) -> None:
    ran: list[str] = []

    @app.job
    def plain(n: int) -> None:
        ran.append(f"local {n}")

    @app.job(executor="spark")  # on the default topic, shared with plain
    def heavy(spark: Any, n: int) -> None:
        ran.append(f"{spark} {n}")

    a, b = plain.schedule(1), heavy.schedule(2)
    wait_fired(app, a.msg_id, b.msg_id)
    with Dispatcher(app) as main:
        assert main.run_until_idle() == 2  # ran one, skipped one
    assert ran == ["local 1"]
    fake = FakeSpark()
    group = dedicated_group(app.settings.group, ["spark"])
    with Dispatcher(app, group=group, executors={"spark": fake}) as spark_worker:
        assert spark_worker.run_until_idle() == 2
    assert ran == ["local 1", "session 2"]
    assert fake.ran == [b.msg_id]
    for handle in (a, b):
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.DONE


def test_trace_records_each_delivery_with_the_schema(
    app: Scheduler, manual_clock: ManualClock, tmp_path: Path
) -> None:
    @app.job(retry=RetryPolicy.fixed(2), max_attempts=2)
    def flaky(n: int) -> None:
        if n == 2:
            raise ValueError("no")

    ok, bad = flaky.schedule(1, key="k1"), flaky.schedule(2)
    wait_fired(app, ok.msg_id, bad.msg_id)
    trace = DeliveryTrace(tmp_path / "trace")
    with Dispatcher(app, trace=trace) as dispatcher:
        assert dispatcher.run_until_idle() == 2
        manual_clock.advance(2_000)
        wait_fired(app, bad.msg_id)
        assert dispatcher.run_until_idle() == 1
    trace.close()
    lines = _lines(tmp_path / "trace")
    assert all(list(line) == list(FIELDS) for line in lines)
    got = sorted((x["msg_id"], x["attempt"], x["outcome"]) for x in lines)
    assert got == sorted([(ok.msg_id, 1, "ok"), (bad.msg_id, 1, "retry"), (bad.msg_id, 2, "dead")])
    first = next(x for x in lines if x["msg_id"] == ok.msg_id)
    assert first["job"] == flaky.name and first["key"] == "k1" and first["topic"] == flaky.topic
    assert first["group"] == app.settings.group and first["error"] is None
    assert first["deliver_at_ms"] == ok.deliver_at_ms
    assert first["sent_ms"] <= first["deliver_at_ms"] <= first["fired_ms"]
    assert first["fired_ms"] <= first["dispatched_ms"] <= first["started_ms"]
    assert first["started_ms"] <= first["finished_ms"]
    dead = next(x for x in lines if x["outcome"] == "dead")
    assert "ValueError: no" in dead["error"]


def test_trace_rotates_and_keeps_the_newest_files(tmp_path: Path) -> None:
    trace = DeliveryTrace(tmp_path, max_bytes=1, max_files=3, flush_interval_s=60)
    msg = ReceivedMessage("ab" * 16, "t", b"", 5, 1, 1, b"r")
    for i in range(5):
        trace.finished(msg, f"job{i}", "g", "ack", None, None, 10)
        assert trace.flush() == 1  # each flush finds the file full and rotates
    trace.close()
    files = sorted(tmp_path.glob("trace-*.jsonl"))
    assert len(files) == 3
    assert [line["job"] for line in _lines(tmp_path)] == ["job2", "job3", "job4"]


def test_default_trace_dir_is_under_the_data_dir() -> None:
    assert default_trace_dir("rocksdb:///var/lib/chronoq") == Path("/var/lib/chronoq/trace")
    assert default_trace_dir("chronoq://127.0.0.1:7420") is None


def test_chronoq_run_with_trace_writes_the_trace(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "data"
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("chronoq")),
            "run",
            "--trace",
            "examples.order_timeout:app",
        ],
        check=False,
        cwd=tmp_path,
        env=dict(os.environ, CHRONOQ_BROKER_URL=f"rocksdb://{data}", PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _lines(data / "trace")
    jobs = [x["job"] for x in lines if x["outcome"] == "ok"]
    assert jobs.count("shop.close_order") == 6  # 4 of the 10 were aborted by payment
    assert jobs.count("shop.report") == 1
