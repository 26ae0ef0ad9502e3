"""Finding an app by name: :func:`load_app` (``module:attr``), for every command that takes one.

``chronoq run module:app`` (``workers``) and the Spark pipelines' commands
(``spark_tasks``) both load apps this way; it lives here, below both.
"""

from __future__ import annotations

import importlib
import os
import sys

from scheduler.errors import SchedulerError
from scheduler.scheduler import Scheduler


class AppNotFound(SchedulerError, LookupError):
    """The ``module:attr`` target names no app.

    :param target: what was asked for.
    :param why: what went wrong, and what to give instead.
    """

    def __init__(self, target: str, why: str) -> None:
        self.target = target
        self.why = why
        super().__init__(why)


def load_app(target: str) -> Scheduler:
    """The app that ``module:attr`` names (``module`` alone: its only :class:`Scheduler`).

    The current directory is put on ``sys.path`` first (as ``python -m`` would), so
    ``chronoq run shop.jobs:app`` finds ``./shop/jobs.py``.

    :raises AppNotFound: when the module does not import, has no such attribute,
        or (without ``:attr``) does not have exactly one Scheduler.
    """
    module_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise AppNotFound(target, f"cannot import {module_name!r}: {e}") from e
    if attr:
        app: Scheduler | None = getattr(module, attr, None)  # as the command line says
        if app is None:
            raise AppNotFound(target, f"module {module_name!r} has no {attr!r}")
        return app
    found = [v for v in vars(module).values() if isinstance(v, Scheduler)]
    if len(found) != 1:
        raise AppNotFound(
            target,
            f"{module_name!r} has {len(found)} Scheduler objects; name one, e.g. {module_name}:app",
        )
    return found[0]


__all__ = ["AppNotFound", "load_app"]
