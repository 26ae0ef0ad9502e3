"""The :class:`Executor` seam: one method that starts a job somewhere.

An executor takes a job's spec, its decoded call and the broker message, starts
the job (on a thread pool, a Celery worker, a Spark session...) and returns a
:class:`~concurrent.futures.Future` that completes with the job's result or
exception. The dispatcher does everything else (ack, retry, dead letters,
timeouts), so an executor stays a few lines long.

Executors that run the body in this process should run it in a copy of the
submitting :mod:`contextvars` context through :func:`workers.context.run_job`,
so the job sees :func:`workers.current_job` and its start time is recorded.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec


@runtime_checkable
class Executor(Protocol):
    """Runs jobs; the dispatcher calls :meth:`submit` once per job run."""

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """Start ``spec.func`` with ``call``'s arguments; return its future.

        Must not block for the job's duration. The future completes with the
        job's return value, or with the exception it raised; a future cancelled
        before the job started means the job never ran.

        :raises RuntimeError: when the executor is shut down.
        """
        ...

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting jobs; with ``wait``, wait for those running."""
        ...


__all__ = ["Executor"]
