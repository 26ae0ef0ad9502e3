"""The seam behind :meth:`Scheduler.run() <scheduler.scheduler.Scheduler.run>`: who runs an app.

Running an app (a dispatcher, the cron planner, signal handling) is the
``workers`` layer's job, and ``workers`` builds on ``scheduler``, so the scheduler
never imports it. Instead a runner registers here: ``workers`` does so when it is
imported (:func:`workers.runner.run_app`), and an installed distribution declares
its runner as a plugin, the way APScheduler 3 finds its executors: an entry point
of the group :data:`ENTRY_POINT_GROUP` (chronoq's ``pyproject.toml`` names
``workers.runner:run_app``). ``app.run()`` calls what is registered, else the
declared plugin, and says what to do when there is neither.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from scheduler.errors import SchedulerError

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler


class AppRunner(Protocol):
    """Runs an app until it is stopped (what ``app.run()`` calls)."""

    def __call__(self, app: Scheduler, /, *, stop_event: threading.Event | None = None) -> object:
        """Run ``app`` until SIGINT/SIGTERM, or until ``stop_event`` is set."""
        ...


class NoAppRunner(SchedulerError, RuntimeError):
    """``app.run()`` was called, but no runner is registered (``workers`` not imported)."""

    def __init__(self) -> None:
        super().__init__(
            "app.run() needs chronoq's workers: add `import workers` to the app "
            "(it registers the runner), or run it with `chronoq run module:app`"
        )


def entry_points(group: str) -> Any:
    """The installed entry points of ``group`` (imported only when asked: ``import
    scheduler`` stays ~20 ms lighter)."""
    from importlib import metadata

    return metadata.entry_points(group=group)


#: The entry-point group in which a distribution declares the runner of ``app.run()``.
ENTRY_POINT_GROUP = "chronoq.app_runner"

_runner: AppRunner | None = None


def set_app_runner(runner: AppRunner | None) -> AppRunner | None:
    """Make ``runner`` what ``app.run()`` calls (``None``: nothing).

    :returns: the runner it replaces, so a test can put it back.
    """
    global _runner
    previous, _runner = _runner, runner
    return previous


def app_runner() -> AppRunner:
    """The registered runner, else the one an installed plugin declares.

    :raises NoAppRunner: when there is neither.
    """
    runner = _runner
    if runner is None:
        for point in entry_points(group=ENTRY_POINT_GROUP):
            runner = point.load()  # loading it registers it, as importing it would
            break
    if runner is None:
        raise NoAppRunner()
    return runner


__all__ = ["ENTRY_POINT_GROUP", "AppRunner", "NoAppRunner", "app_runner", "set_app_runner"]
