"""workers.thread_slice: a thread asks Linux for a short slice and gives it back; the
dispatcher's pull thread holds one while it runs and only then."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from scheduler.scheduler import Scheduler
from workers import Dispatcher
from workers.thread_slice import DEFAULT_SLICE_US, current_slice_us, shorten

T = TypeVar("T")
needs_slices = pytest.mark.skipif(
    current_slice_us() is None, reason="no sched_getattr here (not Linux x86_64/aarch64)"
)


def in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a fresh thread (slices are per thread); its result."""
    out: list[T] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


@needs_slices
def test_shorten_sets_the_slice_of_this_thread_only_and_undo_restores_it() -> None:
    def body() -> tuple[int | None, int | None, int | None]:
        before = current_slice_us()
        undo = shorten(250)
        during = current_slice_us()
        undo()
        return before, during, current_slice_us()

    before, during, after = in_thread(body)
    assert during == 250
    assert after == before != 250
    assert current_slice_us() == before  # this thread was never touched


@needs_slices
def test_asking_for_the_slice_it_has_changes_nothing() -> None:
    def body() -> tuple[int | None, int | None]:
        undo = shorten(300)
        again = shorten(300)  # already so: a no-op undo
        again()
        mid = current_slice_us()
        undo()
        return mid, current_slice_us()

    mid, after = in_thread(body)
    assert mid == 300 and after != 300


@needs_slices
def test_run_forever_holds_a_short_slice_while_it_runs(app: Scheduler) -> None:
    seen: list[int | None] = []

    @app.job()
    def probe() -> None: ...

    dispatcher = Dispatcher(app, wake_slice_us=DEFAULT_SLICE_US)
    stop = threading.Event()

    def tick() -> int | None:  # called in the pull thread before each pull
        seen.append(current_slice_us())
        stop.set()
        return None

    dispatcher.open().calls.tick = (tick,)
    before: list[int | None] = []

    def run() -> None:
        before.append(current_slice_us())
        dispatcher.run_forever(stop_event=stop, poll_ms=20)
        seen.append(current_slice_us())

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert seen[0] == DEFAULT_SLICE_US
    assert seen[-1] == before[0] != DEFAULT_SLICE_US  # given back on return


def test_by_default_a_dispatcher_leaves_the_thread_alone(app: Scheduler) -> None:
    dispatcher = Dispatcher(app)
    stop = threading.Event()
    seen: list[int | None] = []

    def tick() -> int | None:
        seen.append(current_slice_us())
        stop.set()
        return None

    dispatcher.open().calls.tick = (tick,)
    out = in_thread(lambda: (current_slice_us(), dispatcher.run_forever(stop_event=stop)))
    assert seen == [out[0]]
