"""LocalExecutor: jobs on a bounded thread pool in this process (``executor="local"``).

Importing this module provides the ``local`` kind's factory
(:data:`scheduler.executor_kinds.EXECUTOR_KINDS`): every default dispatcher has one.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from broker_adapter.checks import check_int
from broker_adapter.results import ReceivedMessage
from scheduler.executor_kinds import EXECUTOR_KINDS
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.context import run_job

if TYPE_CHECKING:
    from workers.runs import App

_log = logging.getLogger("chronoq.workers.LocalExecutor")


class LocalExecutor:
    """Runs each job on one of ``max_workers`` threads (``executor="local"``).

    The pool's queue is bounded by the dispatcher, which never holds more than
    ``prefetch + max_workers`` jobs. Each job runs in a copy of the submitting
    context, so :func:`workers.current_job` works inside it.

    :param max_workers: threads in the pool (``Settings.max_workers``).
    :param thread_name_prefix: names of the pool's threads.
    :raises InvalidArgument: for ``max_workers`` < 1.
    """

    def __init__(self, max_workers: int = 8, *, thread_name_prefix: str = "chronoq-job") -> None:
        self.max_workers = check_int("max_workers", max_workers)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix)

    @classmethod
    def for_app(cls, app: App) -> LocalExecutor:
        """The ``local`` kind's factory: ``Settings.max_workers`` threads."""
        return cls(app.settings.max_workers)

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`."""
        ctx = contextvars.copy_context()
        return self._pool.submit(ctx.run, run_job, spec.func, call.args, call.kwargs)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool; jobs not yet started are cancelled, running ones finish."""
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def __repr__(self) -> str:
        return f"<LocalExecutor max_workers={self.max_workers}>"


EXECUTOR_KINDS.provide("local", LocalExecutor.for_app)

__all__ = ["LocalExecutor"]
