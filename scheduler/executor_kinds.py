"""The open registry of executor kinds: the names ``@app.job(executor=...)`` takes.

Each kind is declared once, as an :class:`ExecutorKind`: its name, whether it
runs only in a dispatcher of its own (``dedicated``, today ``spark``), whether
its jobs may name a queue, what it passes to a job before the call's arguments,
whether it runs coroutine functions (``async def``; a kind that does not refuses
them at decoration), an optional check of the job function at decoration time,
the chronoq extra it needs, and the factory that builds its :class:`~scheduler.executor.Executor` for
an app (APScheduler 4's open ``job_executors`` mapping is the model).

:data:`EXECUTOR_KINDS` is the registry everything reads: :class:`~scheduler.spec.JobSpec`
checks names in it at decoration, the workers' routing asks it which kinds are
dedicated, and a dispatcher builds its default executors from it. The built-in
kinds (:data:`BUILTIN_KINDS`) are declared here, so their names are valid before
``workers`` is imported; the ``workers`` module that implements each one provides
its factory when imported (:meth:`ExecutorRegistry.provide`). Anything else is
one call, from the module that implements it::

    register_kind(ExecutorKind("gpu", factory=GpuExecutor.for_app))

A factory can also be registered for one app only
(:meth:`ExecutorRegistry.register_for_app`, e.g. the Celery executor bound to
the app's Celery app).

Environment variables ``CHRONOQ_<KIND>_*`` belong to the kind's own settings
(e.g. ``CHRONOQ_SPARK_MASTER``, read by :mod:`spark_tasks.settings`), not to
:class:`~scheduler.settings.Settings`.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from broker_adapter.extras import EXTRAS
from scheduler.errors import InvalidJobSpec, SchedulerError
from scheduler.executor import Executor

#: Builds a kind's executor for an app (a :class:`~scheduler.scheduler.Scheduler`).
ExecutorFactory = Callable[[Any], Executor]
#: Builds an executor registered for one app (the app is already bound in).
AppExecutorFactory = Callable[[], Executor]
#: Why a function cannot be a job of this kind, or ``None`` when it can.
FunctionCheck = Callable[[Callable[..., Any]], str | None]

#: A kind's name: lower-case letters, digits and ``_`` (it also names ``CHRONOQ_<NAME>_*``).
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}").fullmatch


def is_coroutine_function(func: object) -> bool:
    """Whether calling ``func`` gives a coroutine to await: an ``async def`` function,
    a :func:`functools.partial` of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - the method itself, not callable()
    )


def default_kind_for(func: object) -> str:
    """The executor kind of a job whose ``executor=`` is not given: :data:`ASYNC_KIND`
    for a coroutine function, else :data:`LOCAL_KIND`."""
    return ASYNC_KIND if is_coroutine_function(func) else LOCAL_KIND


def _needs_coroutine(func: Callable[..., Any]) -> str | None:
    if is_coroutine_function(func):
        return None
    return (
        "the async executor runs async def functions; leave executor= out for a plain "
        "function (it runs on the thread pool)"
    )


class UnknownExecutor(SchedulerError, LookupError):
    """No executor kind has this name.

    :param name: the name asked for.
    :param known: the registered names.
    """

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(
            f"no executor kind {name!r}; use one of {', '.join(map(repr, self.known))}, "
            "or register it with scheduler.executor_kinds.register_kind(ExecutorKind(...))"
        )


class DuplicateExecutor(SchedulerError, ValueError):
    """Another executor kind already has this name.

    :param name: the name registered twice.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"an executor kind {name!r} is already registered; give yours another name, "
            "or pass replace=True to replace it"
        )


@dataclass(frozen=True, slots=True)
class ExecutorKind:
    """One kind of executor, declared once.

    :param name: the ``executor=`` name (lower-case letters, digits, ``_``).
    :param dedicated: its jobs run only in a dispatcher of their own
        (``chronoq worker --executor NAME``, consumer group ``<group>.<name>``);
        see :mod:`workers.routing`.
    :param queues: its jobs may name a queue (``@app.job(queue=...)``).
    :param passes: what the executor passes to the job function before the call's
        own arguments, in words (``("the SparkSession",)``); a cron job's function
        must be callable with exactly these.
    :param coroutines: its executor runs coroutine functions (``async def``) to
        completion; a kind without it refuses them at decoration (the ``async``
        kind has it, and is the default for a coroutine function; see
        :func:`default_kind_for`).
    :param check: returns why a function cannot be a job of this kind, or ``None``;
        called at decoration time.
    :param extra: the chronoq extra it needs (``pip install chronoq[EXTRA]``), if any.
    :param factory: builds its executor for an app; ``None`` until the module that
        implements it provides one. A kind without a factory runs only where an
        app registered one (:meth:`ExecutorRegistry.register_for_app`).
    :raises InvalidJobSpec: for a bad name, ``passes`` entry or extra.
    """

    name: str
    dedicated: bool = False
    queues: bool = False
    passes: tuple[str, ...] = ()
    coroutines: bool = False
    check: FunctionCheck | None = None
    extra: str | None = None
    factory: ExecutorFactory | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME(self.name):
            raise InvalidJobSpec(
                "executor",
                self.name,
                "an executor name is 1-32 lower-case letters, digits or _, starting with a letter",
            )
        passes = tuple(self.passes)
        if not all(isinstance(p, str) and p for p in passes):
            raise InvalidJobSpec("passes", self.passes, "describe each passed argument in words")
        object.__setattr__(self, "passes", passes)
        if self.extra is not None and self.extra not in EXTRAS:
            raise InvalidJobSpec("extra", self.extra, f"use one of {', '.join(EXTRAS)}")

    @property
    def env_prefix(self) -> str:
        """``CHRONOQ_<NAME>_``: the environment variables of this kind's own settings."""
        return f"CHRONOQ_{self.name.upper()}_"

    def check_function(self, func: Callable[..., Any]) -> None:
        """Refuse a coroutine function unless the kind runs :attr:`coroutines`, then
        run the kind's :attr:`check` on a job function.

        :raises InvalidJobSpec: for an ``async def`` function on a kind without
            :attr:`coroutines`, or when the check gives a reason.
        """
        if not self.coroutines and is_coroutine_function(func):
            raise InvalidJobSpec(
                "func",
                func,
                f"it is an async def function, and {self.name!r} executors run only plain "
                f"functions: leave executor= out (or use executor={ASYNC_KIND!r}) to run it on "
                "the dispatcher's event loop, or make it a plain def",
            )
        if self.check is not None:
            reason = self.check(func)
            if reason:
                raise InvalidJobSpec("func", func, reason)

    def check_cron_function(self, func: Callable[..., Any]) -> None:
        """Fail unless ``func`` can be called with what this kind :attr:`passes` only
        (a cron job gets no arguments of its own).

        :raises InvalidJobSpec: naming what the call gets and why it fails.
        """
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):  # builtins without a signature: trust them
            return
        try:
            sig.bind(*(None for _ in self.passes))
        except TypeError as e:
            needs = f"{' and '.join(self.passes)} only" if self.passes else "no arguments"
            raise InvalidJobSpec(
                "func",
                func,
                f"a cron job is called with {needs}, but {e}; give the other parameters defaults",
            ) from None


class ExecutorRegistry:
    """Executor kinds by name, and the executors registered for single apps; safe
    across threads. Iterating yields the kinds in registration order.

    :param kinds: the kinds it starts with.
    """

    def __init__(self, kinds: Iterable[ExecutorKind] = ()) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[str, ExecutorKind] = {}
        self._apps: weakref.WeakKeyDictionary[Any, dict[str, AppExecutorFactory]] = (
            weakref.WeakKeyDictionary()
        )
        for kind in kinds:
            self.register(kind)

    def register(self, kind: ExecutorKind, *, replace: bool = False) -> ExecutorKind:
        """Add ``kind``; registering an equal kind again only updates its factory.

        :returns: ``kind``.
        :raises DuplicateExecutor: when another kind has the name (unless ``replace``).
        :raises TypeError: when ``kind`` is not an :class:`ExecutorKind`.
        """
        if not isinstance(kind, ExecutorKind):
            raise TypeError(f"register() takes an ExecutorKind, got {type(kind).__name__}")
        with self._lock:
            existing = self._kinds.get(kind.name)
            if existing is not None and existing != kind and not replace:
                raise DuplicateExecutor(kind.name)
            if existing is not None and kind.factory is None and existing == kind:
                return existing
            self._kinds[kind.name] = kind
        return kind

    def provide(self, name: str, factory: ExecutorFactory) -> ExecutorKind:
        """Give the declared kind ``name`` its factory (what a module implementing a
        built-in kind calls when imported).

        :returns: the kind, with the factory.
        :raises UnknownExecutor: for a name not declared.
        """
        with self._lock:
            kind = self._get(name)
            kind = self._kinds[name] = dataclasses.replace(kind, factory=factory)
        return kind

    def unregister(self, name: str) -> None:
        """Remove the kind ``name`` (harmless when absent); for tests and plug-ins."""
        with self._lock:
            self._kinds.pop(name, None)

    def get(self, name: str) -> ExecutorKind:
        """The kind named ``name``.

        :raises UnknownExecutor: for an unknown name, listing the known ones.
        """
        with self._lock:
            return self._get(name)

    def _get(self, name: str) -> ExecutorKind:
        kind = self._kinds.get(name) if isinstance(name, str) else None
        if kind is None:
            raise UnknownExecutor(str(name), self._kinds)
        return kind

    def find(self, name: object) -> ExecutorKind | None:
        """The kind named ``name``, or ``None``."""
        return self._kinds.get(name) if isinstance(name, str) else None

    def names(self) -> tuple[str, ...]:
        """Every kind's name, in registration order."""
        return tuple(self._kinds)

    def is_dedicated(self, name: str) -> bool:
        """Whether jobs of ``name`` run only in their own dispatcher (``False`` for an
        unknown name)."""
        kind = self.find(name)
        return kind is not None and kind.dedicated

    def register_for_app(self, app: Any, name: str, factory: AppExecutorFactory) -> None:
        """Give every dispatcher built for ``app`` with default executors an executor
        ``name`` made by ``factory`` (e.g. Celery's, bound to the app's Celery app).

        :raises UnknownExecutor: for a name no kind declares (no job could use it).
        """
        self.get(name)
        with self._lock:
            self._apps.setdefault(app, {})[name] = factory

    def app_factories(self, app: Any) -> dict[str, AppExecutorFactory]:
        """The factories registered for ``app`` alone, by name (none: ``{}``)."""
        with self._lock:
            return dict(self._apps.get(app, {}))

    def factory_for(self, app: Any, name: str) -> AppExecutorFactory | None:
        """What builds the executor ``name`` for ``app``: the app's own registration,
        else the kind's factory; ``None`` when neither exists."""
        own = self.app_factories(app).get(name)
        if own is not None:
            return own
        kind = self.find(name)
        if kind is None or kind.factory is None:
            return None
        return partial(kind.factory, app)

    def default_factories(self, app: Any) -> dict[str, AppExecutorFactory]:
        """The executors of a dispatcher built for ``app`` without ``executors=``:
        every kind that is not dedicated and has a factory, then the app's own."""
        with self._lock:
            kinds = list(self._kinds.values())
        out: dict[str, AppExecutorFactory] = {
            k.name: partial(k.factory, app)
            for k in kinds
            if not k.dedicated and k.factory is not None
        }
        out.update(self.app_factories(app))
        return out

    def __contains__(self, name: object) -> bool:
        return self.find(name) is not None

    def __iter__(self) -> Iterator[ExecutorKind]:
        with self._lock:
            return iter(list(self._kinds.values()))

    def __len__(self) -> int:
        return len(self._kinds)

    def __repr__(self) -> str:
        return f"<ExecutorRegistry {', '.join(self._kinds)}>"


#: The kind of plain functions when ``executor=`` is not given: a thread pool.
LOCAL_KIND = "local"
#: The kind of coroutine functions when ``executor=`` is not given: the dispatcher's
#: event loop (:mod:`workers.executors.event_loop`).
ASYNC_KIND = "async"

#: The kinds chronoq ships; their factories come from ``workers.executors.*``.
BUILTIN_KINDS: tuple[ExecutorKind, ...] = (
    ExecutorKind(LOCAL_KIND),
    ExecutorKind("celery", queues=True, extra="celery"),
    ExecutorKind("spark", dedicated=True, passes=("the SparkSession",), extra="spark"),
    ExecutorKind(ASYNC_KIND, coroutines=True, check=_needs_coroutine),
)

#: The registry every part of chronoq reads.
EXECUTOR_KINDS = ExecutorRegistry(BUILTIN_KINDS)


def register_kind(kind: ExecutorKind, *, replace: bool = False) -> ExecutorKind:
    """Register ``kind`` in :data:`EXECUTOR_KINDS`; see :meth:`ExecutorRegistry.register`."""
    return EXECUTOR_KINDS.register(kind, replace=replace)


__all__ = [
    "ASYNC_KIND",
    "BUILTIN_KINDS",
    "EXECUTOR_KINDS",
    "LOCAL_KIND",
    "AppExecutorFactory",
    "DuplicateExecutor",
    "ExecutorFactory",
    "ExecutorKind",
    "ExecutorRegistry",
    "FunctionCheck",
    "UnknownExecutor",
    "default_kind_for",
    "is_coroutine_function",
    "register_kind",
]
