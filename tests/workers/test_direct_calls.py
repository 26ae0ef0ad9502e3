"""Jobs on the local executor without futures (JobThreads.start, LocalExecutor.start_job):
what the callback is told, cancellation, and that a dispatcher's runs are freed by
reference counting (no cycle left to the cyclic GC)."""

from __future__ import annotations

import gc
import threading
from typing import Any

from scheduler.scheduler import Scheduler
from workers import Dispatcher, current_job
from workers.executors.local import JobThreads
from workers.runs import Run


class Told:
    """Collects ``done(started, result, error)`` calls, with the reporting thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[bool, Any, BaseException | None, str]] = []
        self.event = threading.Event()

    def __call__(self, started: bool, result: Any, error: BaseException | None) -> None:
        self.calls.append((started, result, error, threading.current_thread().name))
        self.event.set()


def test_start_reports_the_result_or_the_error_in_the_pool_thread() -> None:
    pool = JobThreads(1, "dc")
    ok, failed = Told(), Told()

    def boom() -> None:
        raise ValueError("boom")

    pool.start(lambda a, b: a + b, (2, 3), ok)
    pool.start(boom, (), failed)
    assert ok.event.wait(5) and failed.event.wait(5)
    assert ok.calls == [(True, 5, None, "dc_0")]
    started, result, error, thread = failed.calls[0]
    assert (started, result, thread) == (True, None, "dc_0")
    assert isinstance(error, ValueError) and str(error) == "boom"
    pool.shutdown()


def test_a_call_is_either_cancelled_before_it_starts_or_runs_never_both() -> None:
    pool = JobThreads(1, "dc")
    gate, running = threading.Event(), threading.Event()
    first, second, third = Told(), Told(), Told()

    def hold() -> str:
        running.set()
        gate.wait(5)
        return "held"

    a = pool.start(hold, (), first)
    assert running.wait(5)
    b = pool.start(lambda: "never", (), second)
    assert not a.cancel()  # running: too late
    assert b.cancel()  # queued: cancelled, told at once in this thread
    assert not b.cancel()
    assert second.calls == [(False, None, None, threading.current_thread().name)]
    c = pool.start(lambda: "queued at shutdown", (), third)
    gate.set()
    pool.shutdown()  # the queued one is cancelled or ran; either way told once
    assert first.calls == [(True, "held", None, "dc_0")]
    assert len(third.calls) == 1 and not c.cancel()
    assert len(second.calls) == 1


def test_a_callback_that_raises_is_logged_and_the_thread_goes_on(caplog: Any) -> None:
    pool = JobThreads(1, "dc")
    told = Told()

    def bad(started: bool, result: Any, error: BaseException | None) -> None:
        raise RuntimeError("callback bug")

    pool.start(lambda: 1, (), bad)
    pool.start(lambda: 2, (), told)
    assert told.event.wait(5) and told.calls[0][:2] == (True, 2)
    assert "callback bug" in caplog.text
    pool.shutdown()


def test_settled_runs_are_freed_without_the_cyclic_gc(app: Scheduler) -> None:
    """A run, its job context and the executor's handle must not form a cycle: at
    thousands of jobs per second each cycle was garbage for the GC to find, ~430
    gen-0 collections per 20,000 jobs (issue 16)."""
    seen: list[str] = []

    @app.job
    def work(i: int) -> None:
        seen.append(current_job().msg_id)

    for i in range(30):
        work.schedule(i)
    gc.collect()
    gc.disable()
    try:
        with Dispatcher(app) as dispatcher:
            assert dispatcher.run_until_idle() == 30
        left = [o for o in gc.get_objects() if isinstance(o, Run)]
    finally:
        gc.enable()
    assert len(seen) == 30
    assert left == []
