"""Async jobs (``async def``) on a real embedded broker and a real Dispatcher.

They run on the one event loop of the dispatcher's ``async`` executor
(:mod:`workers.executors.event_loop`), and settle exactly as sync jobs do:
retries, dead letters, timeouts (the task is cancelled), the job context, the
in-flight bound, the drain. Time is a ManualClock; real waits are events.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from pathlib import Path

import pytest

from broker_adapter import MessageState
from broker_adapter.clock import ManualClock
from scheduler.scheduler import Scheduler
from scheduler.spec import RetryPolicy
from tests.helpers import eventually
from workers import Dispatcher, DispatchHook, current_job
from workers.executors import EventLoopExecutor, LocalExecutor

_LOG = "chronoq.workers.EventLoopExecutor"


class Flaky(Exception):
    """A failure worth a retry."""


def _state(app: Scheduler, msg_id: str) -> MessageState:
    view = app.broker.query(msg_id)
    assert view is not None
    return view.state


def test_an_async_job_runs_and_is_acked(app: Scheduler) -> None:
    # The defect of issue 14: this job was acked as a success without running.
    seen: list[int] = []

    @app.job()
    async def hello(x: int) -> None:
        await asyncio.sleep(0)
        seen.append(x)

    assert hello.spec.executor == "async"  # a coroutine function's default kind
    handle = hello.schedule(1)
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert seen == [1]
    assert _state(app, handle.msg_id) is MessageState.DONE


def test_an_async_job_is_settled_off_the_loop(app: Scheduler) -> None:
    # Settling is a broker round trip on a network broker: it must not stall the loop.
    loop_threads: list[str] = []
    settled_in: list[str] = []

    class WhereSettled(DispatchHook):
        def before_settle(self, message, job, run, settlement, reason):  # type: ignore[no-untyped-def]
            settled_in.append(threading.current_thread().name)

    @app.job()
    async def where() -> None:
        loop_threads.append(threading.current_thread().name)

    where.schedule()
    with Dispatcher(app, hooks=[WhereSettled()]) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert len(loop_threads) == 1 and len(settled_in) == 1
    assert settled_in[0] != loop_threads[0]
    # The loop hands the job's end to its settle thread; a job that ended before the
    # dispatcher attached its callback to the future is settled by the dispatcher's
    # thread as it attaches it (a busy machine delays that thread): off the loop too.
    assert settled_in[0].startswith(loop_threads[0] + "-settle") or (
        settled_in[0] == threading.current_thread().name
    )


def test_the_job_context_and_copied_contextvars(app: Scheduler) -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen: list[tuple[str, int, str]] = []

    @app.job(executor="async")
    async def who() -> None:
        job = current_job()
        seen.append((job.msg_id, job.attempt, request_id.get()))
        request_id.set("changed inside the job")

    handle = who.schedule()
    token = request_id.set("set by the caller")  # the dispatcher runs in this thread
    try:
        with Dispatcher(app) as dispatcher:
            assert dispatcher.run_until_idle() == 1
        assert request_id.get() == "set by the caller"  # a copy: nothing leaks back
    finally:
        request_id.reset(token)
    assert seen == [(handle.msg_id, 1, "set by the caller")]


def test_a_failure_retries_with_backoff_then_succeeds(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    attempts: list[int] = []

    @app.job(retry=RetryPolicy(delays_ms=(5_000,)))
    async def charge() -> None:
        attempts.append(current_job().attempt)
        if len(attempts) == 1:
            raise Flaky("card declined")

    handle = charge.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.PENDING
        assert view.error == "Flaky: card declined"
        manual_clock.advance(5_000)
        assert dispatcher.run_until_idle() == 1
    assert attempts == [1, 2]
    assert _state(app, handle.msg_id) is MessageState.DONE


def test_max_attempts_dead_letters_with_the_error(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    @app.job(max_attempts=2, retry=RetryPolicy.fixed(1))
    async def broken(order_id: int) -> None:
        raise ValueError(f"order {order_id} is corrupt")

    handle = broken.schedule(7)
    with Dispatcher(app) as dispatcher:
        for _ in range(2):
            assert dispatcher.run_until_idle() == 1
            manual_clock.advance(1_000)
    view = app.broker.query(handle.msg_id)
    assert view is not None and (view.state, view.attempts) == (MessageState.DEAD, 2)
    assert view.error is not None and "ValueError: order 7 is corrupt" in view.error


def test_a_timeout_cancels_the_task_and_counts_as_a_timeout(app: Scheduler) -> None:
    seen: list[str | None] = []

    @app.job(timeout=0.05, max_attempts=1)
    async def stuck() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(current_job().cancel_reason)
            raise

    handle = stuck.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
        eventually(lambda: seen, what="the task saw its cancellation")
    assert seen == ["timeout"]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD
    assert view.error is not None and view.error.startswith("JobTimeout:")


def test_a_timeout_retries_per_policy(app: Scheduler, manual_clock: ManualClock) -> None:
    @app.job(timeout=0.05, max_attempts=2, retry=RetryPolicy.fixed(2))
    async def slow() -> None:
        if current_job().attempt == 1:
            await asyncio.sleep(30)

    handle = slow.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.PENDING
        assert view.error is not None and view.error.startswith("JobTimeout:")
        manual_clock.advance(2_000)
        assert dispatcher.run_until_idle() == 1
    assert _state(app, handle.msg_id) is MessageState.DONE


def test_the_in_flight_bound_holds_async_jobs_on_one_loop_thread(app: Scheduler) -> None:
    # The app fixture: max_workers=4, prefetch=8, so at most 12 jobs are held at once.
    lock = threading.Lock()
    running: list[int] = [0, 0]  # now, most at once
    threads: set[int] = set()
    loops: list[asyncio.AbstractEventLoop] = []
    gate: list[asyncio.Event] = []

    @app.job
    async def wait_for_gate(n: int) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
            threads.add(threading.get_ident())
            loops.append(asyncio.get_running_loop())
            if not gate:
                gate.append(asyncio.Event())
        await gate[0].wait()
        with lock:
            running[0] -= 1

    wait_for_gate.schedule_many([((n,), {}) for n in range(20)])
    dispatcher = Dispatcher(app)
    thread = threading.Thread(target=dispatcher.run_forever)
    thread.start()
    try:
        eventually(lambda: running[0] == dispatcher.capacity == 12, what="12 jobs waiting")
        assert dispatcher.slots_taken == 12  # the other 8 wait in the broker
        loops[0].call_soon_threadsafe(gate[0].set)
        eventually(lambda: dispatcher.processed == 20, what="every job ran")
    finally:
        dispatcher.stop()
        thread.join(10)
    assert running == [0, 12]
    assert len(threads) == 1 and len(set(loops)) == 1  # one loop, in one thread


def test_a_thousand_waiting_async_jobs_cost_no_threads(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=4, prefetch=1000)
    waiting = threading.Semaphore(0)
    loops: list[asyncio.AbstractEventLoop] = []
    gate: list[asyncio.Event] = []

    @app.job
    async def nap(n: int) -> None:
        if not gate:
            loops.append(asyncio.get_running_loop())
            gate.append(asyncio.Event())
        waiting.release()
        await gate[0].wait()

    try:
        nap.schedule_many([((n,), {}) for n in range(1000)])
        threads_before = threading.active_count()
        dispatcher = Dispatcher(app)
        thread = threading.Thread(target=dispatcher.run_forever)
        thread.start()
        try:
            for _ in range(1000):
                assert waiting.acquire(timeout=30)
            # the dispatcher, its loop and watchdog, the broker's helpers: not 1000
            assert threading.active_count() - threads_before < 10
            loops[0].call_soon_threadsafe(gate[0].set)
            eventually(lambda: dispatcher.processed == 1000, timeout=30, what="all ran")
        finally:
            dispatcher.stop()
            thread.join(10)
    finally:
        app.close()


def test_a_sync_and_an_async_job_in_one_app_and_one_dispatcher(app: Scheduler) -> None:
    ran: dict[str, str] = {}

    @app.job
    def plain(n: int) -> None:
        ran["plain"] = threading.current_thread().name

    @app.job
    async def coro(n: int) -> None:
        await asyncio.sleep(0)
        ran["coro"] = threading.current_thread().name

    assert (plain.spec.executor, coro.spec.executor) == ("local", "async")
    handles = [plain.schedule(1), coro.schedule(2)]
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 2
    assert ran["plain"].startswith("chronoq-job")
    assert ran["coro"] == "chronoq-event-loop"
    assert [_state(app, h.msg_id) for h in handles] == [MessageState.DONE] * 2


def test_an_async_cron_job_runs_its_occurrence(app: Scheduler, manual_clock: ManualClock) -> None:
    fired: list[int | None] = []

    @app.cron("* * * * * *")
    async def tick() -> None:
        fired.append(current_job().fire_ms)

    assert tick.spec.executor == "async"
    app.planner.arm_all()
    first = app.pending()[0]
    manual_clock.set(first.deliver_at_ms)
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert fired == [first.deliver_at_ms]
    assert _state(app, first.msg_id) is MessageState.DONE


def test_a_blocked_loop_logs_one_warning_naming_the_job(
    app: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    # The threshold is an input; the job blocks ten times longer than it.
    unblock = threading.Event()

    @app.job
    async def blocker() -> None:
        unblock.wait(10)  # the user's bug: a blocking call on the loop

    handle = blocker.schedule()
    executors = {"async": EventLoopExecutor(blocked_warn_s=0.05), "local": LocalExecutor(1)}
    caplog.set_level(logging.WARNING, logger=_LOG)
    with Dispatcher(app, executors=executors) as dispatcher:
        dispatcher.run_until_idle(timeout_s=0.2)
        watchdog = executors["async"].watchdog
        assert watchdog is not None
        eventually(lambda: watchdog.warnings >= 1, what="the watchdog warned")
        unblock.set()
        dispatcher.run_until_idle()
    for executor in executors.values():
        executor.shutdown()
    warnings = [r for r in caplog.records if r.name == _LOG and r.levelno == logging.WARNING]
    naming = [r for r in warnings if f"job {blocker.name} msg={handle.msg_id}" in r.getMessage()]
    assert len(naming) == 1, [r.getMessage() for r in warnings]
    assert "asyncio.to_thread" in naming[0].getMessage()
    assert _state(app, handle.msg_id) is MessageState.DONE


def test_a_drain_cancels_a_running_async_job_and_releases_its_message(app: Scheduler) -> None:
    started = threading.Event()
    reasons: list[str | None] = []

    @app.job
    async def forever() -> None:
        job = current_job()
        if job.attempt > 1:
            return
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            reasons.append(job.cancel_reason)
            raise

    handle = forever.schedule()
    first = Dispatcher(app, drain_timeout_s=0.05)
    thread = threading.Thread(target=first.run_forever)
    thread.start()
    assert started.wait(10)
    first.stop()
    thread.join(10)
    eventually(lambda: reasons, what="the task was cancelled")
    assert reasons == ["the dispatcher is shutting down"]
    assert _state(app, handle.msg_id) in (MessageState.PENDING, MessageState.READY)
    with Dispatcher(app) as second:
        assert second.run_until_idle() == 1
    assert _state(app, handle.msg_id) is MessageState.DONE


def test_a_sync_function_returning_a_coroutine_fails_instead_of_passing(app: Scheduler) -> None:
    async def body() -> None: ...

    @app.job(max_attempts=1)
    def wrapped():  # type: ignore[no-untyped-def]  # a sync wrapper that forgot to await
        return body()

    handle = wrapped.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD
    assert view.error is not None and view.error.startswith("CoroutineNotAwaited:")
