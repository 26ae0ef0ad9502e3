"""The Dispatcher on a real embedded broker: ack, retry, dead letters, timeouts, cron.

Time is a ManualClock: retries wait for ``advance``, never for a real sleep.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from broker_adapter import Message, MessageState
from broker_adapter.clock import ManualClock
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from scheduler.spec import JobSpec, RetryPolicy
from tests.helpers import eventually
from workers import Dispatcher, JobCancelled, current_job, find_current_job
from workers.executors.base import Handoff


class Flaky(Exception):
    """A failure worth a retry."""


def test_success_is_acked(app: Scheduler) -> None:
    seen: list[tuple[int, str]] = []

    @app.job
    def add(a: int, b: int) -> None:
        seen.append((a + b, current_job().msg_id))

    handle = add.schedule(2, 3)
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert seen == [(5, handle.msg_id)]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_exception_retries_with_backoff_then_succeeds(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    attempts: list[int] = []

    @app.job(retry=RetryPolicy(delays_ms=(5_000,)))
    def charge() -> None:
        attempts.append(current_job().attempt)
        if len(attempts) == 1:
            raise Flaky("card declined")

    handle = charge.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.PENDING
        assert view.deliver_at_ms == manual_clock.now_ms() + 5_000
        assert view.error == "Flaky: card declined"
        manual_clock.advance(4_999)
        assert dispatcher.run_until_idle() == 0  # not due yet
        manual_clock.advance(1)
        assert dispatcher.run_until_idle() == 1
    assert attempts == [1, 2]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_max_attempts_dead_letters_with_the_error(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    @app.job(max_attempts=3, retry=RetryPolicy.fixed(1))
    def broken(order_id: int) -> None:
        raise ValueError(f"order {order_id} is corrupt")

    handle = broken.schedule(7)
    with Dispatcher(app) as dispatcher:
        for _ in range(3):
            assert dispatcher.run_until_idle() == 1
            manual_clock.advance(1_000)
        assert dispatcher.run_until_idle() == 0
    view = app.broker.query(handle.msg_id)
    assert view is not None
    assert view.state is MessageState.DEAD
    assert view.attempts == 3
    assert view.error is not None and "ValueError: order 7 is corrupt" in view.error
    assert "attempt 3 of 3" in view.error
    assert app.broker.stats().dead == 1


def test_exception_outside_retry_on_dead_letters_at_once(app: Scheduler) -> None:
    @app.job(retry=RetryPolicy(retry_on=(Flaky,)))
    def strict() -> None:
        raise KeyError("missing")

    handle = strict.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD
    assert view.error is not None and view.error.startswith("KeyError: 'missing'")
    assert "not in retry_on" in view.error


def test_unknown_job_and_garbage_go_to_dlq_and_dispatching_goes_on(app: Scheduler) -> None:
    ran: list[int] = []

    @app.job
    def known(n: int) -> None:
        ran.append(n)

    topic = app.settings.topic
    unknown = app.broker.send(Message(topic, JobCall("no.such.job", (1,)).encode()))
    garbage = app.broker.send(Message(topic, b"\xff not json"))
    good = known.schedule(42)
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 3
    assert ran == [42]
    for res, words in ((unknown, "unknown job"), (garbage, "undecodable job call")):
        view = app.broker.query(res.msg_id)
        assert view is not None and view.state is MessageState.DEAD
        assert view.error is not None and words in view.error
    view = app.broker.query(good.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_timeout_fails_the_attempt_and_signals_cancellation(app: Scheduler) -> None:
    observed: list[bool] = []
    raised: list[str] = []

    @app.job(timeout=0.05, max_attempts=1)
    def stuck() -> None:
        job = current_job()
        observed.append(job.cancelled.wait(10))  # returns True once cancelled
        try:
            job.raise_if_cancelled()
        except JobCancelled as e:
            raised.append(str(e))

    handle = stuck.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert observed == [True]
    assert raised and "timeout" in raised[0]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD
    assert view.error is not None and view.error.startswith("JobTimeout:")


def test_timeout_retries_per_policy(app: Scheduler, manual_clock: ManualClock) -> None:
    @app.job(timeout=0.05, max_attempts=2, retry=RetryPolicy.fixed(2))
    def slow() -> None:
        if current_job().attempt == 1:
            current_job().cancelled.wait(10)

    handle = slow.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.PENDING
        manual_clock.advance(2_000)
        assert dispatcher.run_until_idle() == 1
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_current_job_outside_a_job() -> None:
    assert find_current_job() is None
    with pytest.raises(RuntimeError, match="only available inside a job"):
        current_job()


def test_job_on_a_missing_executor_fails_per_retry_policy(app: Scheduler) -> None:
    # (Spark jobs are left to their dedicated worker instead: tests/spark/test_routing.py)
    @app.job(executor="celery", max_attempts=1)
    def report() -> None:
        raise AssertionError("never runs here")

    handle = report.schedule()
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD
    assert view.error is not None and "no 'celery' executor" in view.error


def test_two_dispatchers_on_one_broker_run_each_message_once(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    other = Scheduler(app.broker, clock=manual_clock, max_workers=4, prefetch=8)
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    def work(n: int) -> None:
        with lock:
            runs[n] += 1

    first = app.job(name="shared.work")(work)
    other.job(name="shared.work")(work)
    first.schedule_many([((n,), {}) for n in range(200)])
    d1, d2 = Dispatcher(app), Dispatcher(other)
    counts: list[int] = []
    threads = [
        threading.Thread(target=lambda d=d: counts.append(d.run_until_idle(20))) for d in (d1, d2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d1.close()
    d2.close()
    assert sum(counts) == 200
    assert runs == Counter(range(200))


def test_cron_message_runs_once_and_arms_the_next(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    fired: list[int | None] = []

    @app.cron("* * * * * *")  # every second
    def tick() -> None:
        fired.append(current_job().fire_ms)

    assert app.planner.arm_all() == 1
    first = app.pending()[0]
    manual_clock.set(first.deliver_at_ms)
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert fired == [first.deliver_at_ms]
    view = app.broker.query(first.msg_id)
    assert view is not None and view.state is MessageState.DONE
    nxt = app.pending()
    assert [v.key for v in nxt] == [f"cron:{tick.name}:{first.deliver_at_ms + 1000}"]


def test_cron_skips_a_fire_while_max_running_runs_go_on(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    release = threading.Event()
    fired: list[int | None] = []

    @app.cron("* * * * * *", max_running=1)
    def long_tick() -> None:
        fired.append(current_job().fire_ms)
        release.wait(10)

    app.planner.arm_all()
    first = app.pending()[0]
    manual_clock.set(first.deliver_at_ms)
    with Dispatcher(app) as dispatcher:
        dispatcher.run_until_idle(timeout_s=0.3)  # the first run blocks
        second = app.pending()[0]
        manual_clock.set(second.deliver_at_ms)
        dispatcher.run_until_idle(timeout_s=0.3)  # the second fire is skipped
        view = app.broker.query(second.msg_id)
        assert view is not None and view.state is MessageState.DONE
        release.set()
        dispatcher.run_until_idle()
    assert fired == [first.deliver_at_ms]
    view = app.broker.query(first.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_drain_releases_a_job_that_does_not_finish(app: Scheduler) -> None:
    started = threading.Event()
    gate = threading.Event()
    runs: list[int] = []

    @app.job
    def blocking() -> None:
        runs.append(current_job().attempt)
        started.set()
        if len(runs) == 1:
            current_job().cancelled.wait(10)  # stops once released
            gate.set()

    handle = blocking.schedule()
    first = Dispatcher(app, drain_timeout_s=0.05)
    thread = threading.Thread(target=first.run_forever)
    thread.start()
    assert started.wait(10)
    first.stop()
    thread.join(10)
    assert gate.wait(10)  # the job saw its cancellation
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state in (MessageState.PENDING, MessageState.READY)
    with Dispatcher(app) as second:
        assert second.run_until_idle() == 1
    assert runs == [1, 2]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_a_job_longer_than_the_invisible_time_runs_once(tmp_path: Path) -> None:
    # Real time: the dispatcher extends the message's invisible time (1 s here) every
    # half of it while the job runs, so no second delivery starts it again.
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=2, prefetch=2)
    runs: list[tuple[str, int]] = []

    @app.job
    def slow() -> None:
        runs.append((current_job().msg_id, current_job().attempt))
        time.sleep(2.5)

    try:
        handle = slow.schedule()
        with Dispatcher(app, invisible_ms=1_000) as dispatcher:
            assert dispatcher.run_until_idle(timeout_s=20) == 1
        assert runs == [(handle.msg_id, 1)]
        view = app.broker.query(handle.msg_id)
        assert view is not None and (view.state, view.attempts) == (MessageState.DONE, 1)
    finally:
        app.close()


def test_drain_gives_back_a_job_that_never_started_without_an_attempt(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=1, prefetch=4)
    started = threading.Event()
    attempts: dict[str, list[int]] = {"blocker": [], "queued": []}

    @app.job
    def blocker() -> None:
        attempts["blocker"].append(current_job().attempt)
        started.set()
        if len(attempts["blocker"]) == 1:
            current_job().cancelled.wait(10)

    @app.job
    def queued() -> None:
        attempts["queued"].append(current_job().attempt)

    try:
        blocker.schedule()
        first = Dispatcher(app, drain_timeout_s=0.05)
        thread = threading.Thread(target=first.run_forever)
        thread.start()
        assert started.wait(10)
        queued_handle = queued.schedule()  # pulled while the one worker is busy: queued
        eventually(lambda: first.slots_taken == 2, what="the second job queued behind the first")
        first.stop()
        thread.join(10)
        with Dispatcher(app) as second:
            assert second.run_until_idle(timeout_s=20) == 2
        assert attempts == {"blocker": [1, 2], "queued": [1]}  # only the started one counts
        view = app.broker.query(queued_handle.msg_id)
        assert view is not None and (view.state, view.attempts) == (MessageState.DONE, 1)
    finally:
        app.close()


class _HandingOff:
    """An executor that hands each job to "another system": the test completes its outcome."""

    def __init__(self) -> None:
        self.outcomes: list[Future[Any]] = []

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        outcome: Future[Any] = Future()
        self.outcomes.append(outcome)
        fut: Future[Any] = Future()
        fut.set_result(Handoff(outcome))
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


def test_a_handoff_frees_its_slot_and_its_outcome_settles_it(app: Scheduler) -> None:
    @app.job(executor="celery")
    def remote() -> None: ...

    handle = remote.schedule()
    executor = _HandingOff()
    with Dispatcher(app, executors={"celery": executor}) as dispatcher:
        dispatcher.run_until_idle(timeout_s=0.3)  # handed off; the outcome is awaited
        assert (dispatcher.slots_taken, dispatcher.awaiting, dispatcher.processed) == (0, 1, 0)
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.INFLIGHT
        executor.outcomes[0].set_result(None)
        eventually(lambda: dispatcher.processed == 1, what="the outcome settled")
        assert dispatcher.awaiting == 0
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE


def test_max_awaiting_holds_pulls_until_an_outcome_comes(app: Scheduler) -> None:
    @app.job(executor="celery")
    def remote(n: int) -> None: ...

    executor = _HandingOff()
    with Dispatcher(app, executors={"celery": executor}, max_awaiting=1) as dispatcher:
        remote.schedule(1)
        dispatcher.run_until_idle(timeout_s=0.3)
        assert dispatcher.awaiting == 1
        second = remote.schedule(2)
        dispatcher.run_until_idle(timeout_s=0.3)  # the bound is reached: no pull
        assert len(executor.outcomes) == 1
        view = app.broker.query(second.msg_id)
        assert view is not None and view.state is MessageState.READY
        executor.outcomes[0].set_result(None)
        eventually(lambda: dispatcher.processed == 1, what="the first outcome settled")
        dispatcher.run_until_idle(timeout_s=0.3)
        assert len(executor.outcomes) == 2  # pulled once there was room
        executor.outcomes[1].set_exception(ValueError("remote failure"))
        eventually(lambda: dispatcher.processed == 2, what="the second outcome settled")
    view = app.broker.query(second.msg_id)
    assert view is not None and view.error is not None and "remote failure" in view.error


def test_drain_releases_an_awaited_handoff_without_an_attempt(app: Scheduler) -> None:
    @app.job(executor="celery")
    def remote() -> None: ...

    handle = remote.schedule()
    executor = _HandingOff()
    with Dispatcher(app, executors={"celery": executor}, drain_timeout_s=0.05) as dispatcher:
        dispatcher.run_until_idle(timeout_s=0.3)
        assert dispatcher.awaiting == 1
    assert dispatcher.processed == 1
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state in (MessageState.PENDING, MessageState.READY)
    assert view.attempts == 0  # the next dispatcher looks the outcome up; no attempt lost


def test_hurry_cuts_a_drain_short_and_stops_the_job(app: Scheduler) -> None:
    started = threading.Event()
    reasons: list[str | None] = []

    @app.job
    def blocking() -> None:
        started.set()
        job = current_job()
        job.cancelled.wait(30)
        reasons.append(job.cancel_reason)

    blocking.schedule()
    dispatcher = Dispatcher(app, drain_timeout_s=60)
    thread = threading.Thread(target=dispatcher.run_forever)
    thread.start()
    assert started.wait(10)
    dispatcher.stop()
    dispatcher.hurry()  # a second Ctrl-C: no 60 s wait
    thread.join(10)
    assert not thread.is_alive()
    eventually(lambda: reasons == ["the dispatcher is shutting down"], what="the job stopped")
