"""Executors: where a job's body runs (``executor="local"`` is a thread pool here)."""

from workers.executors.base import Executor
from workers.executors.local import LocalExecutor

__all__ = ["Executor", "LocalExecutor"]
