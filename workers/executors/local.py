"""LocalExecutor: jobs on a bounded thread pool in this process."""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from broker_adapter.errors import InvalidArgument
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.context import run_job

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
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidArgument(f"max_workers must be an int >= 1, got {max_workers!r}")
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix)

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`."""
        ctx = contextvars.copy_context()
        return self._pool.submit(ctx.run, run_job, spec.func, call.args, call.kwargs)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool; jobs not yet started are cancelled, running ones finish."""
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def __repr__(self) -> str:
        return f"<LocalExecutor max_workers={self.max_workers}>"


__all__ = ["LocalExecutor"]
