"""The pytest plugin and ChronoqKit, through real pytest sessions (``pytester``).

Each test writes a small test module that uses the fixtures the installed
entry point provides, runs it in a subprocess, and asserts its outcomes.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_app=source)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "-q")


SYNC_JOBS = """
from datetime import timedelta

from broker_adapter import MessageState


def test_a_job_runs_when_its_time_comes(chronoq, chronoq_app):
    @chronoq_app.job()
    def greet(name: str) -> None: ...

    greet.schedule("ada", delay=timedelta(seconds=90))
    chronoq.advance(seconds=89)
    assert chronoq.ran == [] and len(chronoq.pending(greet)) == 1
    chronoq.advance(1)
    assert [(r.job, r.args, r.attempt) for r in chronoq.ran] == [(greet.name, ("ada",), 1)]
    assert chronoq.pending() == []


def test_retries_within_the_span_run_and_the_last_failure_is_dead(chronoq, chronoq_app):
    @chronoq_app.job(max_attempts=3)
    def flaky(n: int) -> None:
        raise ValueError(f"boom {n}")

    @chronoq_app.job()
    def other() -> None: ...

    job = flaky.schedule(7)
    other.schedule(delay=3600)
    chronoq.advance(minutes=2)  # backoff 10 s, then 30 s: all three attempts
    assert [r.attempt for r in chronoq.failed] == [1, 2, 3]
    assert isinstance(chronoq.failed[0].error, ValueError)
    dead = chronoq.dead_letters(flaky)
    assert [v.msg_id for v in dead] == [job.msg_id]
    assert dead[0].state is MessageState.DEAD and "boom 7" in (dead[0].error or "")
    assert chronoq.dead_letters(other) == []
    assert [v.deliver_at_ms for v in chronoq.pending(other)] == [
        chronoq.clock.now_ms() - 120_000 + 3_600_000
    ]


def test_cron_jobs_fire_at_each_occurrence(chronoq, chronoq_app):
    @chronoq_app.cron("*/10 * * * *")
    def tick() -> None: ...

    chronoq.advance(minutes=30)
    assert [r.job for r in chronoq.ran] == [tick.name] * 3


def test_a_wrong_expectation_fails(chronoq, chronoq_app):
    @chronoq_app.job()
    def greet() -> None: ...

    greet.schedule(delay=60)
    chronoq.advance(minutes=1)
    assert chronoq.ran == []
"""


def test_sync_jobs_run_as_time_advances(pytester: pytest.Pytester) -> None:
    result = run(pytester, SYNC_JOBS)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*test_a_wrong_expectation_fails*"])


ASYNC = """
import asyncio
from datetime import timedelta

seen = []


def test_an_async_job_runs_from_a_sync_test(chronoq, chronoq_app):
    @chronoq_app.job()
    async def notify(order_id: int) -> None:
        await asyncio.sleep(0)
        seen.append(order_id)

    notify.schedule(1, delay=timedelta(minutes=5))
    chronoq.advance(minutes=5)
    assert [r.args for r in chronoq.ran] == [(1,)] and seen == [1]


async def test_an_async_test_awaits_the_kit(chronoq, chronoq_app):
    @chronoq_app.job(name="notify2")
    async def notify(order_id: int) -> None:
        seen.append(order_id)

    await notify.schedule_async(2, delay=timedelta(minutes=5))
    assert await chronoq.advance_async(minutes=4) == 0
    await chronoq.advance_async(minutes=1)
    assert [r.args for r in chronoq.ran] == [(2,)] and seen[-1] == 2


async def test_an_async_test_can_fail(chronoq):
    await chronoq.advance_async(1)
    assert chronoq.ran != []
"""


def test_async_jobs_and_async_tests(pytester: pytest.Pytester) -> None:
    result = run(pytester, ASYNC)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_an_async_test_can_fail*"])


OWN_APP = """
import pytest

from broker_adapter.memory import MemoryBroker
from scheduler import Scheduler

app = Scheduler("memory://shop")  # built at import, as an app module does


@app.job()
def close_order(order_id: int) -> None: ...


@pytest.fixture
def chronoq_app():
    return app


def test_the_kit_drives_the_app_built_at_import(chronoq, chronoq_broker, chronoq_clock):
    assert app.broker is chronoq_broker and app.clock is chronoq_clock
    close_order.schedule(42, delay=60)
    chronoq.advance(60)
    assert [r.args for r in chronoq.ran] == [(42,)]


def test_afterwards_the_app_has_its_own_broker_back():
    assert isinstance(app.broker, MemoryBroker) and app.broker.name == "shop"
    assert app.pending() == []  # nothing the kit sent leaked into it
"""


def test_a_users_app_is_bound_by_overriding_chronoq_app(pytester: pytest.Pytester) -> None:
    run(pytester, OWN_APP).assert_outcomes(passed=2)


def test_the_plugin_is_installed_by_entry_point(pytester: pytest.Pytester) -> None:
    """No conftest, no pytest_plugins line: the fixtures come with the installed package."""
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    result.stdout.fnmatch_lines(
        [
            "*fixtures defined from workers.pytest_plugin*",
            "chronoq_clock -- *",
            "chronoq_broker -- *",
            "chronoq_app -- *",
            "chronoq -- *",
        ]
    )
