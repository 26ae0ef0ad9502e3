"""The seam behind :meth:`Scheduler.run() <scheduler.scheduler.Scheduler.run>`: who runs an app.

Running an app (a dispatcher, the cron planner, signal handling) is the
``workers`` layer's job, and ``workers`` builds on ``scheduler``, so the scheduler
cannot import it. Instead ``workers`` registers its runner here when it is
imported (:func:`workers.runner.run_app`); ``app.run()`` calls whatever is
registered, and says what to do when nothing is.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

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


_runner: AppRunner | None = None


def set_app_runner(runner: AppRunner | None) -> AppRunner | None:
    """Make ``runner`` what ``app.run()`` calls (``None``: nothing).

    :returns: the runner it replaces, so a test can put it back.
    """
    global _runner
    previous, _runner = _runner, runner
    return previous


def app_runner() -> AppRunner:
    """The registered runner.

    :raises NoAppRunner: when none is registered.
    """
    runner = _runner
    if runner is None:
        raise NoAppRunner()
    return runner


__all__ = ["AppRunner", "NoAppRunner", "app_runner", "set_app_runner"]
