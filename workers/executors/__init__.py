"""Executors: where a job's body runs (``executor="local"`` is a thread pool here,
``executor="async"`` an event loop).

Importing this package imports the built-in executors' modules, each of which
provides its kind's factory to :data:`scheduler.executor_kinds.EXECUTOR_KINDS`
(none of them imports its third-party library before it is built).
"""

from workers.executors import spark as _spark  # noqa: F401 - provides the "spark" factory
from workers.executors.base import Executor
from workers.executors.event_loop import EventLoopExecutor
from workers.executors.local import LocalExecutor

__all__ = ["EventLoopExecutor", "Executor", "LocalExecutor"]
