"""CeleryExecutor: due jobs run on real Celery workers (``@app.job(executor="celery")``).

chronoq holds the timer; Celery sees a task only when it is due. At fire time the
dispatcher hands the job here and the executor publishes it with a plain
``send_task`` (no ``eta``/``countdown``), so no Celery worker holds pending
tasks in RAM and no ETA task outlives the Redis transport's ``visibility_timeout``
to run twice. What is published is exactly what this ``send_task`` call would
publish (see :func:`~workers.celery.publish.publish` for why it does not call it)::

    celery_app.send_task("chronoq.run", [job_name, args, kwargs], {"due_ms": ..., ...},
                         task_id=msg_id, queue=spec.queue)

Jobs scheduled with :func:`workers.celery.app.schedule_task` publish the user's
own task instead: ``send_task(task.name, args, kwargs, task_id=msg_id)``.

**Idempotency.** The Celery task id *is* the chronoq message id. Before each
publish the executor looks the id up in the result backend (with
``track_results``), so a redelivered message (invisible time passed, dispatcher
or broker crash: a message re-read after a crash comes with ``attempts`` 1
again) never starts a second run: a task already ``SUCCESS`` is not published
again (the message is just acked); one ``SENT`` (queued in Celery: chronoq
stores that state as Celery's broker accepts the publish, see
:mod:`workers.celery.results`), ``STARTED`` or ``RETRY`` is waited
for, not published; one that ``FAILURE``-d is published again over it (that is
chronoq's retry). ``SENT`` makes this hold without ``task_track_started``
(which costs the worker two result-backend round trips per task).

**Two publish paths.** When Celery's broker and result backend are one Redis
database (what :func:`~workers.celery.app.celery_app_for` sets up), a batch is
looked up, pushed and marked ``SENT`` by one atomic Lua script, in one round
trip (:mod:`workers.celery.atomic`). Otherwise (another backend or
broker, a route through a named exchange, or ``publish_script=False``) the
general path takes three steps: one ``MGET`` per batch, kombu's publish batch,
then the ``SENT`` writes.

**Outcome path: the slot is freed at publish, the message waits for the outcome.**
The future :meth:`CeleryExecutor.submit` returns completes as soon as the Celery
broker accepted the publish. With ``track_results=True`` (the default) its result
is a :class:`~workers.executors.base.Handoff`: the dispatcher frees the job's slot
at once (so Celery throughput is not capped by ``prefetch + max_workers``) and
keeps the chronoq message ``INFLIGHT`` until ``Handoff.outcome`` completes from
the Celery result backend (see :mod:`workers.celery.results`); then it
settles the message as it does a local job's: ``query(msg_id)`` /
``JobHandle.get`` shows ``DONE`` after success, ``PENDING`` with the error while
a retry waits, ``DEAD`` with the error after the last attempt. At most
``Dispatcher(max_awaiting=...)`` outcomes (default 10,000) are awaited at once.

While it waits, the dispatcher extends the message's invisible time
(``Consumer.extend``), so a slow task never brings its message back. Nothing is
lost if the dispatcher dies meanwhile: the message is still in flight in chronoq
and comes back after its invisible time (60 s unless a job ``timeout`` raises
it), to this dispatcher or another; the redelivery looks the task id up (above)
and acks a ``SUCCESS`` without publishing, waits for a ``SENT`` or ``STARTED``
task, and retries a ``FAILURE``. The gaps, where a redelivery publishes a second
time under the same id, are the general path's: a dispatcher that dies between
Celery's accepting a publish and the ``SENT`` write (which goes with the next
batch's lookup, or alone as soon as the publisher is idle: milliseconds), a
``SENT`` write that failed (logged), and result backends other than Redis (no
``SENT``: only ``task_track_started`` tells a queued task from an unknown one
there). The script path closes them: a message is pushed together with its
``SENT`` in one atomic step (short of Redis failing the script half-way, out
of memory say).

**Who retries: chronoq.** A failed task is retried by the dispatcher's nack with
the job's :class:`~scheduler.spec.RetryPolicy` (``retry_on``, backoff,
``max_attempts``, then the dead-letter topic), exactly as a local job; the
generic task never calls Celery's ``retry``. A user task scheduled with
``schedule_task`` that declares Celery retries (``autoretry_for``) keeps them, and
chronoq then makes one attempt only (``max_attempts=1``): never both. Celery's
own *redelivery* of a task whose worker died (``acks_late``) is not a retry: it
runs under the same id and chronoq just keeps waiting for its outcome.

**Celery broker down.** ``send_task`` raising (connection refused, timeout)
fails the run with :class:`~workers.executors.base.JobNotStarted`: one WARNING
line names the broker and the message ids, and the dispatcher *releases* each
message for the job's backoff whatever ``retry_on`` says (``Consumer.release``:
the job never ran, so the outage counts no attempt and never dead-letters it).
The message is acked only after the Celery broker accepted the publish (and,
with ``track_results``, after the outcome), so nothing is lost.

With ``track_results=False`` the run counts as done once the publish is
accepted: Celery then owns retries and outcomes (use ``autoretry_for``), and
``query`` shows ``DONE`` meaning "handed to Celery". No result backend is
needed then.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.celery.publish import task_id_for, task_message
from workers.celery.publisher import Publisher, PublishRun
from workers.celery.results import ResultWatcher
from workers.context import find_current_job

#: Most publishes sent in one pipeline round trip.
DEFAULT_BATCH = 500
#: How long a publish batch waits for more jobs after its first, ms.
DEFAULT_LINGER_MS = 2.0


class CeleryExecutor:
    """Publishes due jobs to Celery; see the module docstring for the guarantees.

    Publishing happens on one thread of its own (:class:`~workers.celery.publisher.Publisher`),
    in pipelined batches of up to ``batch_size`` (one Redis round trip each), so the
    dispatcher's pull loop never waits for the Celery broker. While jobs come faster
    than one per ``linger_ms`` (a moving average of the time between them), a batch
    waits up to ``linger_ms`` after its first job for more (Kafka's ``linger.ms``): at
    hundreds of fires a second that cuts the publish CPU per job, for at most that
    much added lateness. Slower, each job is published at once.

    :param celery_app: the Celery app to publish with (its broker, routes, result backend).
    :param track_results: keep each chronoq message in flight until the task's
        outcome is in the result backend (chronoq retries); ``False``: done when
        published (Celery retries).
    :param batch_size: most publishes per pipeline round trip.
    :param linger_ms: how long a batch of streaming jobs waits for more after its
        first (0: never).
    :param sweep_s: seconds between result-backend sweeps (see :class:`ResultWatcher`).
    :param publish_script: with ``track_results``, when Celery's broker and result
        backend are one Redis database, publish each batch and store its ``SENT``
        states with one atomic script (see :mod:`workers.celery.atomic`);
        ``False``: always the general path.
    :raises ValueError: with ``track_results`` and a Celery app without a result backend.
    """

    def __init__(
        self,
        celery_app: Any,
        *,
        track_results: bool = True,
        batch_size: int = DEFAULT_BATCH,
        linger_ms: float = DEFAULT_LINGER_MS,
        sweep_s: float = 0.5,
        publish_script: bool = True,
    ) -> None:
        if track_results and not celery_app.conf.result_backend:
            raise ValueError(
                "CeleryExecutor(track_results=True) reads outcomes from the result backend, "
                "but this Celery app has none: set result_backend (e.g. the broker's redis:// "
                "URL) or pass track_results=False"
            )
        self.celery_app = celery_app
        self.track_results = track_results
        self.watcher = ResultWatcher(celery_app, sweep_s=sweep_s)
        self.publisher = Publisher(
            celery_app,
            self.watcher,
            track_results=track_results,
            batch_size=max(1, batch_size),
            linger_s=max(0.0, linger_ms / 1000),
            publish_script=publish_script,
        )

    @property
    def published(self) -> int:
        """Tasks published so far (tests and ``stats``-style logging)."""
        return self.publisher.published

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`: the future completes
        once the Celery broker accepted the publish, with a
        :class:`~workers.executors.base.Handoff` whose outcome is the task's result or
        exception (``None`` without ``track_results``); with
        :class:`~workers.executors.base.JobNotStarted` if the publish failed; with the
        stored result at once when a redelivered task already succeeded.

        :raises RuntimeError: after :meth:`shutdown`.
        """
        job = find_current_job()
        due_ms = job.due_ms if job is not None else message.deliver_at_ms
        name, args, kwargs = task_message(spec, call, message, due_ms)
        options = {"queue": spec.queue} if spec.queue else {}
        fut: Future[Any] = Future()
        task_id = task_id_for(message, job)
        outcome: Future[Any] | None = Future() if self.track_results else None
        self.publisher.put(
            PublishRun(fut, task_id, name, args, kwargs, options, message.attempts, job, outcome)
        )
        return fut

    def warm_up(self) -> None:
        """Start publishing now rather than at the first due job (the dispatcher calls
        this when it opens): the publisher thread imports the transport, opens its
        producer and reaches the result backend, and the result thread subscribes,
        so the first job does not pay that (about 50 ms here). Never blocks; an
        unreachable broker is only found out, and logged, by the first publish."""
        self.publisher.start()
        if self.track_results:
            self.watcher.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop publishing: runs not yet published are cancelled (the dispatcher
        releases them); outcomes still awaited are left to the dispatcher's drain."""
        self.publisher.close(wait)
        self.watcher.close()

    def __repr__(self) -> str:
        return f"<CeleryExecutor {self.celery_app.main!r} track_results={self.track_results}>"


__all__ = ["DEFAULT_BATCH", "DEFAULT_LINGER_MS", "CeleryExecutor"]
