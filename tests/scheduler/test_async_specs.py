"""Async job functions at decoration: the default kind, and each refusal with what to do.

``async def`` jobs run on the ``async`` executor kind; a kind without
``coroutines=True`` (local, Celery, Spark, or one registered without it) refuses
them at decoration, and a coroutine *object* is never taken for a function or an
argument. Every refusal is a typed :class:`~broker_adapter.errors.ChronoqError`
and sends nothing.
"""

from __future__ import annotations

import pytest

from broker_adapter.errors import ChronoqError
from scheduler import Scheduler
from scheduler.errors import InvalidJobSpec, UnserializableArgument
from scheduler.executor_kinds import (
    EXECUTOR_KINDS,
    ExecutorKind,
    default_kind_for,
    is_coroutine_function,
)
from scheduler.spec import JobSpec


async def ping(n: int) -> int:
    return n


def plain(n: int) -> int:
    return n


class AsyncCallable:
    async def __call__(self) -> None: ...


def test_a_coroutine_function_defaults_to_the_async_kind(app: Scheduler) -> None:
    assert app.job(ping).spec.executor == "async"
    assert app.job(plain).spec.executor == "local"
    assert app.cron("@daily", name="nightly")(AsyncCallable()).spec.executor == "async"
    assert JobSpec("x", ping).executor == "async"
    assert (default_kind_for(ping), default_kind_for(plain)) == ("async", "local")
    assert is_coroutine_function(AsyncCallable()) and not is_coroutine_function(plain)
    assert EXECUTOR_KINDS.get("async").coroutines


@pytest.mark.parametrize("executor", ["local", "celery", "spark"])
def test_async_def_on_a_kind_of_plain_functions_is_refused(app: Scheduler, executor: str) -> None:
    with pytest.raises(InvalidJobSpec) as info:
        app.job(executor=executor)(ping)
    assert isinstance(info.value, ChronoqError)
    text = str(info.value)
    assert f"{executor!r} executors run only plain functions" in text
    assert "leave executor= out" in text and "make it a plain def" in text
    assert len(app.registry) == 0


def test_a_registered_kind_refuses_async_def_unless_it_declares_coroutines(
    app: Scheduler,
) -> None:
    EXECUTOR_KINDS.register(ExecutorKind("gpu"))
    EXECUTOR_KINDS.register(ExecutorKind("aio", coroutines=True))
    try:
        with pytest.raises(InvalidJobSpec, match="'gpu' executors run only plain functions"):
            app.job(executor="gpu")(ping)
        assert app.job(executor="aio")(ping).spec.executor == "aio"
    finally:
        EXECUTOR_KINDS.unregister("gpu")
        EXECUTOR_KINDS.unregister("aio")


def test_a_plain_function_on_the_async_kind_is_refused(app: Scheduler) -> None:
    with pytest.raises(InvalidJobSpec, match="runs async def functions; leave executor= out"):
        app.job(executor="async")(plain)


def test_a_coroutine_object_is_not_a_job_function(app: Scheduler) -> None:
    coro = ping(1)
    try:
        with pytest.raises(InvalidJobSpec, match="coroutine object, not a function") as info:
            app.job(coro)  # type: ignore[call-overload]
        assert "decorate the async def function itself" in str(info.value)
        with pytest.raises(InvalidJobSpec, match="coroutine object"):
            app.cron("@daily")(coro)  # type: ignore[arg-type]
    finally:
        coro.close()
    assert len(app.registry) == 0


def test_a_coroutine_object_is_not_a_job_argument(app: Scheduler) -> None:
    job = app.job(plain)
    coro = ping(1)
    try:
        with pytest.raises(UnserializableArgument, match="called without await"):
            job.schedule(coro)  # type: ignore[arg-type]
    finally:
        coro.close()
    assert app.pending() == []
