"""chronoq's workers: the :class:`Dispatcher` that runs due jobs, its executors, and
:func:`run_app` behind ``chronoq run module:app``.

A running job sees itself through :func:`current_job` (its message id, attempt,
and the cancel event set on timeout or shutdown; see :mod:`workers.context`).
"""

import logging

from workers.context import (
    JobCancelled,
    JobContext,
    JobTimeout,
    current_job,
    find_current_job,
)
from workers.dispatcher import Dispatcher
from workers.executors import Executor, LocalExecutor
from workers.hooks import DispatchHook
from workers.runner import on_start, run_app, stop_app
from workers.settlement import Decision, Settlement

logging.getLogger("chronoq.workers").addHandler(logging.NullHandler())

__all__ = [
    "Decision",
    "DispatchHook",
    "Dispatcher",
    "Executor",
    "JobCancelled",
    "JobContext",
    "JobTimeout",
    "LocalExecutor",
    "Settlement",
    "current_job",
    "find_current_job",
    "on_start",
    "run_app",
    "stop_app",
]
