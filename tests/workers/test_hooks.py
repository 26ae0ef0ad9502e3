"""Dispatch hooks: which methods are called, in which order, with what; a caller's
hook on a real Dispatcher sees every step of a message's life."""

from __future__ import annotations

import threading
from typing import Any

from broker_adapter import Message, MessageState
from broker_adapter.clock import ManualClock
from broker_adapter.results import ReceivedMessage
from scheduler.scheduler import Scheduler
from scheduler.spec import RetryPolicy
from workers import Dispatcher, current_job
from workers.context import JobContext
from workers.hooks import DispatchHook, HookCalls, Session
from workers.runs import Run
from workers.settlement import Settlement


class Recorder(DispatchHook):
    """Records every call it gets, as plain tuples (the calls may come from any thread)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.session: Session | None = None
        self._lock = threading.Lock()

    def _add(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def events(self) -> list[str]:
        return [c[0] for c in self.calls if c[0] != "tick"]

    def on_open(self, session: Session) -> None:
        self.session = session
        self._add("on_open", session.group)

    def on_pulled(self, messages: list[ReceivedMessage]) -> None:
        self._add("on_pulled", [m.msg_id for m in messages])

    def admit(self, run: Run) -> str:
        self._add("admit", run.message.msg_id)
        return ""

    def before_start(self, run: Run, job: JobContext) -> None:
        self._add("before_start", run.message.msg_id, job.fire_ms)

    def after_handoff(self, run: Run) -> None:
        self._add("after_handoff", run.message.msg_id)

    def after_job(self, run: Run, job: JobContext, error: BaseException | None) -> None:
        self._add("after_job", run.message.msg_id, job.fire_ms, type(error).__name__)

    def after_run(self, run: Run) -> None:
        self._add("after_run", run.message.msg_id)

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        self._add("before_settle", message.msg_id, job, run is not None, settlement, reason)

    def tick(self) -> int | None:
        self._add("tick")
        return None

    def on_close(self) -> None:
        self._add("on_close")


class Refuser(DispatchHook):
    """Lets no job of ``name`` start."""

    def __init__(self, name: str) -> None:
        self.name = name

    def admit(self, run: Run) -> str:
        return "paused by the operator" if run.spec.name == self.name else ""


def test_hook_calls_hold_only_the_overriding_methods_in_hook_order() -> None:
    recorder, refuser = Recorder(), Refuser("x")
    calls = HookCalls([refuser, DispatchHook(), recorder])
    assert calls.hooks[0] is refuser and len(calls.hooks) == 3
    assert calls.admit == (refuser.admit, recorder.admit)
    assert calls.before_start == (recorder.before_start,)
    assert calls.tick == (recorder.tick,)
    assert HookCalls([DispatchHook()]).before_settle == ()


def test_a_callers_hook_sees_a_successful_job_in_order(app: Scheduler) -> None:
    @app.job
    def add(a: int, b: int) -> int:
        return a + b

    handle = add.schedule(1, 2)
    recorder = Recorder()
    with Dispatcher(app, hooks=[recorder]) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    msg = handle.msg_id
    assert recorder.session is not None and recorder.session.topics == [app.settings.topic]
    assert [c for c in recorder.calls if c[0] != "tick"] == [
        ("on_open", app.settings.group),
        ("on_pulled", [msg]),
        ("admit", msg),
        ("before_start", msg, None),
        ("after_job", msg, None, "NoneType"),
        ("after_run", msg),
        ("before_settle", msg, add.name, True, Settlement.ACK, ""),
        ("on_close",),
    ]
    assert ("tick",) in recorder.calls


def test_a_failed_job_is_settled_as_decided_and_the_hook_hears_why(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    @app.job(max_attempts=2, retry=RetryPolicy.fixed(1))
    def broken() -> None:
        raise ValueError("boom")

    handle = broken.schedule()
    recorder = Recorder()
    with Dispatcher(app, hooks=[recorder]) as dispatcher:
        assert dispatcher.run_until_idle() == 1
        manual_clock.advance(1_000)
        assert dispatcher.run_until_idle() == 1
    settles = [c[3:] for c in recorder.calls if c[0] == "before_settle"]
    assert settles == [
        (True, Settlement.RETRY, "ValueError: boom"),
        (True, Settlement.DEAD, "ValueError: boom (attempt 2 of 2)"),
    ]
    errors = [c[3] for c in recorder.calls if c[0] == "after_job"]
    assert errors == ["ValueError", "ValueError"]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DEAD


def test_a_refused_run_is_skipped_not_run_and_still_ends(app: Scheduler) -> None:
    ran: list[str] = []

    @app.job
    def paused() -> None:
        ran.append("paused")

    @app.job
    def other() -> None:
        ran.append("other")

    refused, allowed = paused.schedule(), other.schedule()
    recorder = Recorder()
    with Dispatcher(app, hooks=[Refuser(paused.name), recorder]) as dispatcher:
        assert dispatcher.run_until_idle() == 2
    assert ran == ["other"]
    mine = [c for c in recorder.calls if c[0] != "tick" and refused.msg_id in c[1:2]]
    assert [c[0] for c in mine] == ["after_run", "before_settle"]  # never admitted by it
    assert mine[1][2:] == (paused.name, False, Settlement.SKIP, "paused by the operator")
    for handle in (refused, allowed):
        view = app.broker.query(handle.msg_id)
        assert view is not None and view.state is MessageState.DONE


def test_a_message_without_a_run_gets_only_before_settle(app: Scheduler) -> None:
    garbage = app.broker.send(Message(app.settings.topic, b"\xff not json"))
    recorder = Recorder()
    with Dispatcher(app, hooks=[recorder]) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert recorder.events() == ["on_open", "on_pulled", "before_settle", "on_close"]
    (settle,) = [c for c in recorder.calls if c[0] == "before_settle"]
    assert settle[1:5] == (garbage.msg_id, None, False, Settlement.DEAD)
    assert settle[5].startswith("undecodable job call")


def test_cron_occurrences_each_start_and_end_and_the_run_ends_once(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    fired: list[int | None] = []

    @app.cron("* * * * * *", coalesce="all")
    def tick() -> None:
        fired.append(current_job().fire_ms)

    app.planner.arm_all()
    first = app.pending()[0]
    t = first.deliver_at_ms
    manual_clock.set(t + 2_500)  # three occurrences due: t, t+1 s, t+2 s
    recorder = Recorder()
    with Dispatcher(app, hooks=[recorder]) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert fired == [t, t + 1_000, t + 2_000]
    mine = [c for c in recorder.calls if c[0] != "tick" and first.msg_id in c[1:2]]
    assert [c[0] for c in mine] == [
        "admit",
        "before_start",
        "after_job",
        "before_start",
        "after_job",
        "before_start",
        "after_job",
        "after_run",
        "before_settle",
    ]
    assert [c[2] for c in mine if c[0] == "before_start"] == [t, t + 1_000, t + 2_000]
    assert mine[-1][4] is Settlement.ACK
