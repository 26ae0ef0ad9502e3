"""TraceHook with a real DeliveryTrace: settlements the spark suite's trace test does
not cover (a deferred job, a skipped cron fire, an undecodable body)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from broker_adapter import Message
from broker_adapter.clock import ManualClock
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from scheduler.spec import JobSpec
from workers import Dispatcher, current_job
from workers.executors.base import JobNotStarted
from workers.settlement import Settlement
from workers.trace import DeliveryTrace
from workers.trace_hook import TRACE_VERBS


class _Refusing:
    """An executor whose system is down: it never starts a job."""

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_exception(JobNotStarted(message.msg_id, "broker unreachable"))
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(x) for p in sorted(directory.glob("*.jsonl")) for x in p.read_text().splitlines()
    ]


def test_every_settlement_has_a_trace_word() -> None:
    assert set(TRACE_VERBS) == set(Settlement)


def test_a_deferred_job_is_traced_released_with_its_reason_and_no_start(
    app: Scheduler, tmp_path: Path
) -> None:
    @app.job(executor="celery")
    def close() -> None: ...

    handle = close.schedule()
    trace = DeliveryTrace(tmp_path / "trace")
    with Dispatcher(app, executors={"celery": _Refusing()}, trace=trace) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    trace.close()
    (line,) = _lines(tmp_path / "trace")
    assert (line["msg_id"], line["outcome"], line["started_ms"]) == (
        handle.msg_id,
        "released",
        None,
    )
    assert (
        line["error"]
        == f"JobNotStarted: job of msg {handle.msg_id} not started: broker unreachable"
    )
    assert line["dispatched_ms"] is not None


def test_undecodable_and_skipped_cron_fires_are_traced(
    app: Scheduler, manual_clock: ManualClock, tmp_path: Path
) -> None:
    release = threading.Event()

    @app.cron("* * * * * *", max_running=1)
    def long_tick() -> None:
        current_job()
        release.wait(10)

    app.planner.arm_all()
    first = app.pending()[0]
    garbage = app.broker.send(Message(app.settings.topic, b"\xff"))
    manual_clock.set(first.deliver_at_ms)
    trace = DeliveryTrace(tmp_path / "trace")
    with Dispatcher(app, trace=trace) as dispatcher:
        dispatcher.run_until_idle(timeout_s=0.3)  # the first run blocks
        second = next(v for v in app.pending() if v.msg_id not in (first.msg_id, garbage.msg_id))
        manual_clock.set(second.deliver_at_ms)
        dispatcher.run_until_idle(timeout_s=0.3)  # the second fire is skipped
        release.set()
        dispatcher.run_until_idle()
    trace.close()
    got = {x["msg_id"]: (x["job"], x["outcome"], x["error"]) for x in _lines(tmp_path / "trace")}
    assert got[garbage.msg_id][:2] == (None, "dead")
    assert got[first.msg_id] == (long_tick.name, "ok", None)
    assert got[second.msg_id] == (
        long_tick.name,
        "skipped",
        "1 run(s) still going (max_running=1)",
    )
