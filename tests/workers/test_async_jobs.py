"""Async jobs (``async def``) on a real embedded broker and a real Dispatcher.

They run on the one event loop of the dispatcher's ``async`` executor
(:mod:`workers.executors.event_loop`), and settle exactly as sync jobs do.
"""

from __future__ import annotations

from broker_adapter import MessageState
from scheduler.scheduler import Scheduler
from workers import Dispatcher


def test_an_async_job_runs_and_is_acked(app: Scheduler) -> None:
    seen: list[int] = []

    @app.job()
    async def hello(x: int) -> None:
        seen.append(x)

    handle = hello.schedule(1)
    with Dispatcher(app) as dispatcher:
        assert dispatcher.run_until_idle() == 1
    assert seen == [1]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE
