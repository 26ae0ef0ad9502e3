"""Executors by name, for ``chronoq worker --executor NAME`` (and the trace option).

Executors are imported only when named, so a Spark worker never imports Celery
and a local one never imports pyspark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from workers.executors.base import Executor
from workers.runs import App

if TYPE_CHECKING:
    from workers.trace import DeliveryTrace


def _local(app: App) -> Executor:
    from workers.executors.local import LocalExecutor

    return LocalExecutor(app.settings.max_workers)


def _spark(app: App) -> Executor:
    from workers.executors.spark import SparkExecutor

    executor = SparkExecutor(app)
    executor.warm_up()
    return executor


#: Executor name -> factory taking the app.
FACTORIES: dict[str, Callable[[App], Executor]] = {"local": _local, "spark": _spark}


def build_executors(app: App, names: Sequence[str]) -> dict[str, Executor]:
    """One executor per name (duplicates ignored): ``local``, ``spark``, or one the app
    registered (:func:`workers.executors.base.register_executor`).

    :raises SystemExit: (status 2) for a name without a factory here.
    """
    out: dict[str, Executor] = {}
    for name in names:
        if name in out:
            continue
        factory = FACTORIES.get(name)
        if factory is not None:
            out[name] = factory(app)
            continue
        from workers.executors.base import registered_executors

        registered = registered_executors(app)  # e.g. "celery", registered by the app
        if name not in registered:
            known = sorted(set(FACTORIES) | set(registered))
            raise SystemExit(f"chronoq worker: no executor {name!r}; use one of {', '.join(known)}")
        out[name] = registered[name]
    return out


def open_trace(app: App, directory: str | None) -> DeliveryTrace | None:
    """The delivery trace for ``--trace`` (``directory=""``: ``<data dir>/trace`` of the
    app's ``rocksdb://`` broker) or ``--trace-dir DIR``; ``None`` when not asked for.

    :raises SystemExit: (status 2) for ``--trace`` on a broker without a data dir here.
    """
    if directory is None:
        return None
    from workers.trace import DeliveryTrace, default_trace_dir

    path = directory or default_trace_dir(app.settings.broker_url)
    if path is None:
        raise SystemExit("--trace: this broker has no data dir here; give one: --trace-dir DIR")
    return DeliveryTrace(path)


__all__ = ["FACTORIES", "build_executors", "open_trace"]
