"""The open registry of executor kinds: declared once, checked at decoration, built by
dispatchers, routed by ``dedicated``; per-app registrations; the built-in kinds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from broker_adapter import MessageState
from broker_adapter.results import ReceivedMessage
from scheduler import Scheduler
from scheduler.errors import InvalidJobSpec
from scheduler.executor import Executor
from scheduler.executor_kinds import (
    EXECUTOR_KINDS,
    DuplicateExecutor,
    ExecutorKind,
    ExecutorRegistry,
    UnknownExecutor,
    register_kind,
)
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec


class InlineExecutor:
    """Runs a job in ``submit`` itself, passing its tag first (a kind with ``passes``)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.shut_down = False

    @classmethod
    def for_app(cls, app: Any) -> InlineExecutor:
        return cls(f"tag of {app.settings.group}")

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(spec.func(self.tag, *call.args, **call.kwargs))
        except Exception as e:  # noqa: BLE001 - the future carries it to the dispatcher
            future.set_exception(e)
        return future

    def shutdown(self, wait: bool = True) -> None:
        self.shut_down = True


@pytest.fixture
def kind() -> Iterator[Callable[..., ExecutorKind]]:
    """Registers kinds in the global registry for one test, and removes them after."""
    added: list[str] = []

    def register(name: str, **options: Any) -> ExecutorKind:
        added.append(name)
        return register_kind(ExecutorKind(name, **options))

    yield register
    for name in added:
        EXECUTOR_KINDS.unregister(name)


def test_builtin_kinds_are_known_without_workers() -> None:
    assert EXECUTOR_KINDS.names()[:3] == ("local", "celery", "spark")
    local, celery, spark = (EXECUTOR_KINDS.get(n) for n in ("local", "celery", "spark"))
    assert [k.dedicated for k in (local, celery, spark)] == [False, False, True]
    assert [k.queues for k in (local, celery, spark)] == [False, True, False]
    assert (celery.extra, spark.extra, spark.passes) == ("celery", "spark", ("the SparkSession",))
    assert spark.env_prefix == "CHRONOQ_SPARK_"


def test_unknown_executor_raises_at_decoration_naming_the_known_ones(app: Scheduler) -> None:
    with pytest.raises(InvalidJobSpec, match="'local', 'celery', 'spark'") as info:

        @app.job(executor="gpu")
        def train() -> None: ...

    assert info.value.field == "executor"
    assert "gpu" not in app.registry
    with pytest.raises(UnknownExecutor, match="no executor kind 'gpu'.*'local'") as lookup:
        EXECUTOR_KINDS.get("gpu")
    assert isinstance(lookup.value, LookupError) and lookup.value.known[:1] == ("local",)


def test_one_call_registers_a_kind_a_dispatcher_builds_and_runs(
    app: Scheduler, kind: Callable[..., ExecutorKind]
) -> None:
    from workers import Dispatcher

    # Given a kind registered in one call, with its factory
    kind("inline", passes=("the executor's tag",), factory=InlineExecutor.for_app)
    seen: list[tuple[str, int]] = []

    @app.job(executor="inline")
    def add(tag: str, n: int) -> int:
        seen.append((tag, n))
        return n

    # When a default dispatcher runs a scheduled call
    handle = add.schedule(5)
    with Dispatcher(app) as dispatcher:
        inline = dispatcher.executors["inline"]
        assert isinstance(inline, InlineExecutor) and isinstance(inline, Executor)
        assert set(dispatcher.executors) == {"local", "async", "inline"}
        assert dispatcher.run_until_idle() == 1
    # Then the executor built from the kind ran it, and the dispatcher shut it down
    assert seen == [("tag of chronoq.workers", 5)]
    view = app.broker.query(handle.msg_id)
    assert view is not None and view.state is MessageState.DONE
    assert inline.shut_down


def test_a_dedicated_kind_runs_only_in_its_own_group(
    app: Scheduler, kind: Callable[..., ExecutorKind]
) -> None:
    from workers import Dispatcher
    from workers.executors.factory import build_executors
    from workers.routing import dedicated_group, skip_reason, topics_for

    kind("batch", dedicated=True, passes=("the tag",), factory=InlineExecutor.for_app)
    seen: list[str] = []

    @app.job(executor="batch", topic="chronoq.batch")
    def nightly(tag: str) -> None:
        seen.append(tag)

    @app.job
    def hello() -> None: ...

    # Routing asks the registry: the main dispatchers leave batch jobs alone
    assert dedicated_group("chronoq.workers", ["batch"]) == "chronoq.workers.batch"
    assert topics_for(app.registry, "chronoq.jobs", ["local"]) == ["chronoq.jobs"]
    assert topics_for(app.registry, "chronoq.jobs", ["batch"]) == ["chronoq.batch"]
    assert skip_reason("batch", ["local"]) is not None
    nightly.schedule()
    with Dispatcher(app) as main:
        assert "batch" not in main.executors  # dedicated: never a default executor
        assert main.run_until_idle() == 0
    assert seen == []
    # The dedicated dispatcher builds it by name and runs it in its own group
    executors = build_executors(app, ["batch"])
    group = dedicated_group(app.settings.group, ["batch"])
    with Dispatcher(app, group=group, executors=executors) as dedicated:
        assert dedicated.run_until_idle() == 1
    assert seen == ["tag of chronoq.workers"]


def test_a_kind_check_refuses_a_function_at_decoration(
    app: Scheduler, kind: Callable[..., ExecutorKind]
) -> None:
    def no_private(func: Callable[..., Any]) -> str | None:
        return "private functions cannot run here" if func.__name__.startswith("_") else None

    kind("picky", check=no_private)
    with pytest.raises(InvalidJobSpec, match="private functions cannot run here") as info:

        @app.job(executor="picky")
        def _hidden() -> None: ...

    assert info.value.field == "func"

    @app.job(executor="picky")
    def shown() -> None: ...

    assert app.registry.get(shown.name).executor == "picky"


def test_a_cron_function_takes_exactly_what_its_kind_passes(app: Scheduler) -> None:
    with pytest.raises(InvalidJobSpec, match="with the SparkSession only"):

        @app.cron("@daily", executor="spark")
        def no_session() -> None: ...

    with pytest.raises(InvalidJobSpec, match="with no arguments"):

        @app.cron("@daily")
        def needs_day(day: str) -> None: ...

    @app.cron("@daily", executor="spark")
    def report(spark: object, day: str = "today") -> None: ...

    assert [c.name for c in app.registry.crons()] == [report.name]


def test_only_kinds_with_queues_take_a_queue(app: Scheduler) -> None:
    with pytest.raises(InvalidJobSpec, match=r"only celery jobs have a queue \(executor='local'\)"):
        app.job(queue="q1")(lambda: None)

    @app.job(executor="celery", queue="q1")
    def close() -> None: ...

    assert app.registry.get(close.name).queue == "q1"


def test_registering_conflicts_and_bad_kinds() -> None:
    registry = ExecutorRegistry([ExecutorKind("local")])
    with pytest.raises(DuplicateExecutor, match="'local' is already registered"):
        registry.register(ExecutorKind("local", dedicated=True))
    # the same declaration again only adds its factory
    with_factory = registry.register(ExecutorKind("local", factory=InlineExecutor.for_app))
    assert registry.get("local") is with_factory
    assert registry.register(ExecutorKind("local")) is with_factory
    replaced = registry.register(ExecutorKind("local", dedicated=True), replace=True)
    assert registry.is_dedicated("local") and registry.get("local") is replaced
    provided = registry.provide("local", InlineExecutor.for_app)
    assert provided.factory is not None and provided.dedicated
    with pytest.raises(UnknownExecutor):
        registry.provide("gpu", InlineExecutor.for_app)
    for bad in ("", "GPU", "my-executor", "x" * 33, 7):
        with pytest.raises(InvalidJobSpec):
            ExecutorKind(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobSpec, match="extra"):
        ExecutorKind("gpu", extra="cuda")
    with pytest.raises(TypeError):
        registry.register("gpu")  # type: ignore[arg-type]


def test_an_executor_registered_for_one_app_is_a_default_of_that_app_only(
    app: Scheduler, data_dir: Path
) -> None:
    from workers import Dispatcher
    from workers.executors.base import register_executor, registered_executors

    made: list[InlineExecutor] = []

    def make() -> Executor:
        made.append(InlineExecutor("celery-like"))
        return made[-1]

    register_executor(app, "celery", make)
    with pytest.raises(UnknownExecutor):
        register_executor(app, "gpu", make)
    assert set(registered_executors(app)) == {"celery"}
    with Dispatcher(app) as dispatcher:
        assert dispatcher.executors["celery"] is made[-1]
    with Scheduler(f"rocksdb://{data_dir}-other") as other:
        assert registered_executors(other) == {}
        assert EXECUTOR_KINDS.factory_for(other, "celery") is None
