"""The :class:`Executor` seam: one method that starts a job somewhere.

An executor takes a job's spec, its decoded call and the broker message, starts
the job (on a thread pool, a Celery worker, a Spark session...) and returns a
:class:`~concurrent.futures.Future` that completes with the job's result or
exception. The dispatcher does everything else (ack, retry, dead letters,
timeouts), so an executor stays a few lines long.

An executor that hands the job to another system which runs it on its own
(Celery) completes the future with a :class:`Handoff` as soon as the handoff is
accepted: the dispatcher then frees the job's slot at once and settles the
message when ``Handoff.outcome`` completes, as it would for the job's own future.

Executors that run the body in this process should run it in a copy of the
submitting :mod:`contextvars` context through :func:`workers.context.run_job`,
so the job sees :func:`workers.current_job` and its start time is recorded.

The seam lives in the scheduler layer, next to the registry of executor kinds
(:mod:`scheduler.executor_kinds`), so that the scheduler checks executor names at
decoration time without importing ``workers``; :mod:`workers.executors.base`
re-exports these names.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from broker_adapter.errors import ChronoqError

if TYPE_CHECKING:
    from broker_adapter.results import ReceivedMessage
    from scheduler.jobcall import JobCall
    from scheduler.spec import JobSpec


@runtime_checkable
class Executor(Protocol):
    """Runs jobs; the dispatcher calls :meth:`submit` once per job run.

    An executor may also have a ``warm_up()`` method (not part of this protocol,
    so it stays optional): the dispatcher calls it when it opens, so that
    connections and threads are ready before the first due job. It must not block.
    """

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


class JobNotStarted(ChronoqError):
    """An executor could not start the job at all (e.g. its Celery broker is down).

    The dispatcher releases the message (``Consumer.release``: back after the
    job's backoff, not counted as an attempt) whatever ``retry_on`` says: the
    job never ran, so nothing is lost, nothing ran twice, and an outage never
    dead-letters it.

    :param msg_id: the message whose job did not start.
    :param why: what went wrong.
    """

    def __init__(self, msg_id: str, why: str) -> None:
        self.msg_id = msg_id
        self.why = why
        super().__init__(f"job of msg {msg_id} not started: {why}")


class Handoff:
    """The result of an executor future whose job now runs elsewhere (e.g. published
    to Celery): the dispatcher's slot is free, the message stays in flight.

    :param outcome: completes with the job's return value or exception, as the
        executor future would have; cancelled: the job never ran.
    """

    __slots__ = ("outcome",)

    def __init__(self, outcome: Future[Any]) -> None:
        self.outcome = outcome

    def __repr__(self) -> str:
        return f"<Handoff outcome={self.outcome!r}>"


__all__ = ["Executor", "Handoff", "JobNotStarted"]
