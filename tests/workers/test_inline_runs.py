"""Inline runs (workers.inline_runs): the pulling thread runs the local jobs of a
pull itself; a watch pulls for it while a job runs long; the pool's bounds hold.

Real embedded brokers with the system clock, a real dispatcher thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from broker_adapter import MessageState
from scheduler.scheduler import Scheduler
from scheduler.settings import Settings
from tests.helpers import eventually
from workers import Dispatcher
from workers.executors.local import QueuedCall


@pytest.fixture
def live_app(tmp_path: Path) -> Iterator[Scheduler]:
    """A Scheduler on the system clock with one pool thread."""
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=1, prefetch=4)
    yield app
    app.close()


def processed_is(dispatcher: Dispatcher, count: int) -> bool:
    return dispatcher.processed == count


@contextmanager
def running(dispatcher: Dispatcher) -> Iterator[threading.Thread]:
    """``dispatcher.run_forever`` on a thread named ``pulling`` for the block."""
    thread = threading.Thread(target=dispatcher.run_forever, name="pulling")
    thread.start()
    try:
        yield thread
    finally:
        dispatcher.stop()
        thread.join(20)
        assert not thread.is_alive()


def test_a_lone_job_runs_in_the_pulling_thread_and_is_acked(live_app: Scheduler) -> None:
    threads: list[str] = []

    @live_app.job
    def note(n: int) -> None:
        threads.append(threading.current_thread().name)

    with running(Dispatcher(live_app)):
        handles = []
        for n in range(5):  # one at a time: each is a pull's last (and only) message
            handles.append(note.schedule(n))
            eventually(lambda: len(threads) == len(handles), what=f"job {n} ran")
    assert threads == ["pulling"] * 5
    for h in handles:
        view = live_app.broker.query(h.msg_id)
        assert view is not None and view.state is MessageState.DONE


@pytest.mark.parametrize("switch", ["argument", "setting"])
def test_inline_jobs_off_runs_every_job_on_the_pool(tmp_path: Path, switch: str) -> None:
    threads: list[str] = []
    url = f"rocksdb://{tmp_path / 'data'}"
    if switch == "setting":  # CHRONOQ_INLINE_JOBS=0 reaches the dispatcher of chronoq run
        app = Scheduler(settings=Settings.from_env({"CHRONOQ_INLINE_JOBS": "0"}, broker_url=url))
        dispatcher = Dispatcher(app)
    else:
        app = Scheduler(url)
        dispatcher = Dispatcher(app, inline_jobs=False)

    @app.job
    def note() -> None:
        threads.append(threading.current_thread().name)

    try:
        with running(dispatcher):
            note.schedule()
            eventually(lambda: threads, what="the job ran")
    finally:
        app.close()
    assert threads[0].startswith("chronoq-job")


def test_a_long_inline_job_holds_a_pool_thread_while_the_watch_pulls(
    live_app: Scheduler,
) -> None:
    # Given one pool thread and a job that runs inline until released
    release = threading.Event()
    ran: list[tuple[str, str]] = []

    @live_app.job
    def slow() -> None:
        ran.append(("slow", threading.current_thread().name))
        release.wait(20)

    @live_app.job
    def quick() -> None:
        ran.append(("quick", threading.current_thread().name))

    dispatcher = Dispatcher(live_app)
    with running(dispatcher):
        slow.schedule()
        eventually(lambda: ran, what="the slow job started")
        # When another job comes while it runs
        quick.schedule()
        # Then the watch pulls it (it holds a slot) but it does not start: the one
        # pool thread waits for the inline job, so no more than max_workers run
        eventually(lambda: dispatcher.slots_taken == 2, what="the watch pulled the second job")
        assert not release.wait(0.2)
        assert ran == [("slow", "pulling")]
        # And once the inline job ends, it runs on the pool
        release.set()
        eventually(lambda: len(ran) == 2, what="the second job ran")
        eventually(lambda: dispatcher.processed == 2, what="both settled")
    assert ran[1][0] == "quick" and ran[1][1].startswith("chronoq-job")


def test_a_job_that_ran_long_twice_runs_on_the_pool_from_then_on(live_app: Scheduler) -> None:
    threads: list[str] = []
    hold = threading.Event()

    @live_app.job
    def sleepy() -> None:
        threads.append(threading.current_thread().name)
        hold.wait(0.03)  # longer than an inline run should take (5 ms)

    dispatcher = Dispatcher(live_app)
    with running(dispatcher):
        for n in range(3):
            sleepy.schedule()
            eventually(partial(processed_is, dispatcher, n + 1), what=f"run {n} settled")
        assert dispatcher.open().long_jobs == {sleepy.spec.name}
    assert threads[:2] == ["pulling", "pulling"]
    assert threads[2].startswith("chronoq-job")


def test_run_here_reports_a_keyboard_interrupt_then_raises_it() -> None:
    ended: list[tuple[bool, BaseException | None]] = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    call = QueuedCall(interrupted, (), lambda started, _r, error: ended.append((started, error)))
    with pytest.raises(KeyboardInterrupt):
        call.run(here=True)
    assert len(ended) == 1 and ended[0][0] and isinstance(ended[0][1], KeyboardInterrupt)
    assert not call.cancel()  # taken once: no second report


def test_run_here_reports_an_exception_without_raising() -> None:
    ended: list[BaseException | None] = []
    call = QueuedCall(int, ("x",), lambda _s, _r, error: ended.append(error))
    call.run(here=True)
    assert len(ended) == 1 and isinstance(ended[0], ValueError)


def test_a_cancelled_call_does_not_run_here() -> None:
    ran: list[int] = []
    ended: list[bool] = []
    call = QueuedCall(ran.append, (1,), lambda started, _r, _e: ended.append(started))
    assert call.cancel()
    call.run(here=True)
    assert ran == [] and ended == [False]


def test_jobs_kept_behind_a_stuck_inline_job_go_to_the_pool(tmp_path: Path) -> None:
    # Given two pool threads and two jobs ready at once (one pull keeps both)
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=2, prefetch=4)
    release = threading.Event()
    ran: list[tuple[str, str]] = []

    @app.job
    def slow() -> None:
        ran.append(("slow", threading.current_thread().name))
        release.wait(20)

    @app.job
    def quick() -> None:
        ran.append(("quick", threading.current_thread().name))

    try:
        slow.schedule()
        quick.schedule()
        dispatcher = Dispatcher(app)
        with running(dispatcher):
            # When the first runs inline and does not return
            eventually(lambda: ran, what="the slow job started")
            # Then the watch queues the second on the pool, which runs it meanwhile
            eventually(lambda: len(ran) == 2, what="the kept job ran")
            assert not release.is_set()
            assert ran[0] == ("slow", "pulling")
            assert ran[1][0] == "quick" and ran[1][1].startswith("chronoq-job")
            release.set()
            eventually(partial(processed_is, dispatcher, 2), what="both settled")
    finally:
        release.set()
        app.close()
