"""Executors by name, built from the registry of executor kinds
(:data:`scheduler.executor_kinds.EXECUTOR_KINDS`): a dispatcher's defaults, the
``--executor NAME`` of ``chronoq worker``, and the ``--trace`` option.

Importing this module imports its package :mod:`workers.executors` first, and with
it the modules of the built-in executors, which provide their kinds' factories; each executor imports its third-party
library only when built, so a Spark worker never imports Celery and a local one
never imports pyspark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler.executor_kinds import EXECUTOR_KINDS
from scheduler.trace_format import default_trace_dir
from workers.executors.base import Executor
from workers.runs import App

if TYPE_CHECKING:
    from workers.trace import DeliveryTrace


def default_executors(app: App) -> dict[str, Executor]:
    """The executors of a dispatcher built without ``executors=``: one of each kind
    that is not dedicated and has a factory (``local``), then those registered for
    ``app`` (:func:`~workers.executors.base.register_executor`, e.g. ``celery``)."""
    return {name: make() for name, make in EXECUTOR_KINDS.default_factories(app).items()}


def build_executors(app: App, names: Sequence[str]) -> dict[str, Executor]:
    """One executor per name (duplicates ignored): the app's own registration of the
    name, else its kind's factory.

    :raises SystemExit: (status 2) for a name without a factory here.
    """
    out: dict[str, Executor] = {}
    for name in names:
        if name in out:
            continue
        make = EXECUTOR_KINDS.factory_for(app, name)
        if make is None:
            known = [n for n in EXECUTOR_KINDS.names() if EXECUTOR_KINDS.factory_for(app, n)]
            raise SystemExit(f"chronoq worker: no executor {name!r}; use one of {', '.join(known)}")
        out[name] = make()
    return out


def open_trace(app: App, directory: str | None) -> DeliveryTrace | None:
    """The delivery trace for ``--trace`` (``directory=""``: ``<data dir>/trace`` of the
    app's ``rocksdb://`` broker) or ``--trace-dir DIR``; ``None`` when not asked for.

    :raises SystemExit: (status 2) for ``--trace`` on a broker without a data dir here.
    """
    if directory is None:
        return None
    from workers.trace import DeliveryTrace

    path = directory or default_trace_dir(app.settings.broker_url)
    if path is None:
        raise SystemExit("--trace: this broker has no data dir here; give one: --trace-dir DIR")
    return DeliveryTrace(path)


__all__ = ["build_executors", "default_executors", "open_trace"]
