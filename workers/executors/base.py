"""The executor seam, as the workers see it: :class:`Executor`, :class:`Handoff`,
:class:`JobNotStarted` (defined in :mod:`scheduler.executor`) and per-app executors.

The seam and the registry of executor kinds (:mod:`scheduler.executor_kinds`)
live in the scheduler layer, so that ``@app.job(executor=...)`` is checked at
decoration without importing ``workers``; the names stay importable from here.
"""

from __future__ import annotations

from typing import Any

from scheduler.executor import Executor, Handoff, JobNotStarted
from scheduler.executor_kinds import EXECUTOR_KINDS, AppExecutorFactory


def register_executor(app: Any, name: str, factory: AppExecutorFactory) -> None:
    """Give every dispatcher built for ``app`` with default executors an executor
    ``name`` made by ``factory`` (e.g. the Celery integration's ``install(app)``
    registers ``"celery"``), so ``chronoq run module:app`` needs no extra option.

    :raises UnknownExecutor: for a name no executor kind declares.
    """
    EXECUTOR_KINDS.register_for_app(app, name, factory)


def registered_executors(app: Any) -> dict[str, Executor]:
    """New executors from the factories registered for ``app`` (none: ``{}``)."""
    return {name: make() for name, make in EXECUTOR_KINDS.app_factories(app).items()}


__all__ = ["Executor", "Handoff", "JobNotStarted", "register_executor", "registered_executors"]
