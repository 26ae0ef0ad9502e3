"""CeleryExecutor: due jobs run on real Celery workers (``@app.job(executor="celery")``).

chronoq holds the timer; Celery sees a task only when it is due. At fire time the
dispatcher hands the job here and the executor publishes it with a plain
``send_task`` (no ``eta``/``countdown``), so no Celery worker holds pending
tasks in RAM and no ETA task outlives the Redis transport's ``visibility_timeout``
to run twice. What is published is exactly what this ``send_task`` call would
publish (see :func:`publish` for why it does not call it)::

    celery_app.send_task("chronoq.run", [job_name, args, kwargs], {"due_ms": ..., ...},
                         task_id=msg_id, queue=spec.queue)

Jobs scheduled with :func:`workers.celery_app.schedule_task` publish the user's
own task instead: ``send_task(task.name, args, kwargs, task_id=msg_id)``.

**Idempotency.** The Celery task id *is* the chronoq message id. Before each
publish the executor looks the id up in the result backend (with
``track_results``), so a redelivered message (invisible time passed, dispatcher
or broker crash: a message re-read after a crash comes with ``attempts`` 1
again) never starts a second run: a task already ``SUCCESS`` is not published
again (the message is just acked); one ``SENT`` (queued in Celery: chronoq
stores that state as Celery's broker accepts the publish, see
:mod:`workers.executors.celery_results`), ``STARTED`` or ``RETRY`` is waited
for, not published; one that ``FAILURE``-d is published again over it (that is
chronoq's retry). ``SENT`` makes this hold without ``task_track_started``
(which costs the worker two result-backend round trips per task).

**Two publish paths.** When Celery's broker and result backend are one Redis
database (what :func:`~workers.celery_app.celery_app_for` sets up), a batch is
looked up, pushed and marked ``SENT`` by one atomic Lua script, in one round
trip (:mod:`workers.executors.celery_atomic`). Otherwise (another backend or
broker, a route through a named exchange, or ``publish_script=False``) the
general path takes three steps: one ``MGET`` per batch, kombu's publish batch,
then the ``SENT`` writes.

**Outcome path: the slot is freed at publish, the message waits for the outcome.**
The future :meth:`CeleryExecutor.submit` returns completes as soon as the Celery
broker accepted the publish. With ``track_results=True`` (the default) its result
is a :class:`~workers.executors.base.Handoff`: the dispatcher frees the job's slot
at once (so Celery throughput is not capped by ``prefetch + max_workers``) and
keeps the chronoq message ``INFLIGHT`` until ``Handoff.outcome`` completes from
the Celery result backend (see :mod:`workers.executors.celery_results`); then it
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

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.context import JobContext, find_current_job
from workers.executors.base import Handoff, JobNotStarted
from workers.executors.celery_atomic import PUBLISHED, AtomicPublisher, NotScriptable
from workers.executors.celery_publish import (
    RUN_TASK,
    TASK_JOB_PREFIX,
    PublishSession,
    publish,
    task_id_for,
    task_message,
)
from workers.executors.celery_results import (
    READY_STATES,
    CeleryTaskFailed,
    ResultWatcher,
    close_thread_backend,
)

#: Most publishes sent in one pipeline round trip.
DEFAULT_BATCH = 500
#: How long a publish batch waits for more jobs after its first, ms.
DEFAULT_LINGER_MS = 2.0

_log = logging.getLogger("chronoq.workers.CeleryExecutor")


@dataclass(slots=True)
class _Publish:
    """One run waiting for the publisher thread."""

    fut: Future[Any]
    task_id: str
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    attempt: int
    job: JobContext | None
    #: Completed from the result backend (``track_results``), else ``None``.
    outcome: Future[Any] | None


class CeleryExecutor:
    """Publishes due jobs to Celery; see the module docstring for the guarantees.

    Publishing happens on one thread of its own, in pipelined batches of up to
    ``batch_size`` (one Redis round trip each), so the dispatcher's pull loop never
    waits for the Celery broker. While jobs come faster than one per ``linger_ms``
    (a moving average of the time between them), a batch waits up to
    ``linger_ms`` after its first job for more (Kafka's ``linger.ms``): at hundreds
    of fires a second that cuts the publish CPU per job, for at most that much
    added lateness. Slower, each job is published at once.

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
        states with one atomic script (see :mod:`workers.executors.celery_atomic`);
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
        self.batch_size = max(1, batch_size)
        self.linger_s = max(0.0, linger_ms / 1000)
        self.watcher = ResultWatcher(celery_app, sweep_s=sweep_s)
        self._queue: queue.SimpleQueue[_Publish | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Task ids published whose ``SENT`` is not stored yet: it goes with the next
        #: batch's lookup, or alone when the publisher is idle (one round trip less a batch).
        self._unmarked: list[str] = []
        #: The publisher thread's producer and open publish batch.
        self._session: PublishSession | None = None
        #: Queue names declared on the publisher's connection (see :func:`publish`).
        self._declared: set[str] = set()
        #: The one-round-trip path (see :mod:`workers.executors.celery_atomic`), opened
        #: by the publisher thread; ``_atomic_off`` once it does not apply to this app.
        self._atomic: AtomicPublisher | None = None
        self._atomic_off = not (track_results and publish_script)
        #: Tasks published so far (tests and ``stats``-style logging).
        self.published = 0

    def submit(self, spec: JobSpec, call: JobCall, message: ReceivedMessage) -> Future[Any]:
        """See :meth:`workers.executors.base.Executor.submit`: the future completes
        once the Celery broker accepted the publish, with a :class:`Handoff` whose
        outcome is the task's result or exception (``None`` without
        ``track_results``); with :class:`JobNotStarted` if the publish failed; with
        the stored result at once when a redelivered task already succeeded."""
        job = find_current_job()
        due_ms = job.due_ms if job is not None else message.deliver_at_ms
        name, args, kwargs = task_message(spec, call, message, due_ms)
        options = {"queue": spec.queue} if spec.queue else {}
        fut: Future[Any] = Future()
        task_id = task_id_for(message, job)
        outcome: Future[Any] | None = Future() if self.track_results else None
        item = _Publish(fut, task_id, name, args, kwargs, options, message.attempts, job, outcome)
        with self._lock:
            if self._closed:
                raise RuntimeError("this CeleryExecutor is shut down")
            self._start_thread()
            self._queue.put(item)
        return fut

    def warm_up(self) -> None:
        """Start publishing now rather than at the first due job (the dispatcher calls
        this when it opens): the publisher thread imports the transport, opens its
        producer and reaches the result backend, and the result thread subscribes,
        so the first job does not pay that (about 50 ms here). Never blocks; an
        unreachable broker is only found out, and logged, by the first publish."""
        with self._lock:
            if not self._closed:
                self._start_thread()
        if self.track_results:
            self.watcher.start()

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._publisher, name="chronoq-celery-publish", daemon=True
            )
            self._thread.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop publishing: runs not yet published are cancelled (the dispatcher
        releases them); outcomes still awaited are left to the dispatcher's drain."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None and wait:
            thread.join(timeout=10)
        self.watcher.close()

    def __repr__(self) -> str:
        return f"<CeleryExecutor {self.celery_app.main!r} track_results={self.track_results}>"

    # -- the publisher thread -----------------------------------------------------------

    def _publisher(self) -> None:
        try:
            self._warm()
            self._publish_loop()
        finally:
            self._mark_sent()
            if self._session is not None:
                self._session.close()
                self._session = None
            if self._atomic is not None:
                self._atomic.close()
                self._atomic = None
            close_thread_backend(self.celery_app)

    def _warm(self) -> None:
        app = self.celery_app
        try:
            _ = app.tasks  # finalizes the app: imports and binds its tasks once
            queue = app.amqp.default_queue
            atomic = self._open_atomic()
            if atomic is not None:
                atomic.declare(queue)
                return
            self._session = PublishSession(app, 2 * self.batch_size)
            self._session.producer.maybe_declare(queue)
            self._declared.add(queue.name)
            client = getattr(self._session.producer.channel, "client", None)
            if client is not None and hasattr(client, "ping"):
                client.ping()  # a pooled broker connection, ready for the first flush
            if self.track_results:
                self.watcher.lookup(["chronoq-warm-up"])  # the backend client, connected
        except Exception as e:  # noqa: BLE001 - the first publish meets it again and says so
            _log.debug("celery publisher warm-up failed: %s: %s", type(e).__name__, e)

    def _publish_loop(self) -> None:
        q = self._queue
        last_batch_at, last_size, gap_s = time.monotonic(), 1, 1.0
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                self._mark_sent()  # idle: now, rather than with the next batch's lookup
                item = q.get()
            if item is None:
                break
            batch = [item]
            stop = False
            now = time.monotonic()
            # jobs arrive every `gap_s` on average (since the previous batch began)
            gap_s += 0.2 * (min(now - last_batch_at, 1.0) / last_size - gap_s)
            last_batch_at = now
            until = now + (self.linger_s if gap_s < self.linger_s else 0.0)
            while len(batch) < self.batch_size:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    wait_s = until - time.monotonic()
                    if wait_s <= 0:
                        break
                    try:
                        nxt = q.get(timeout=wait_s)
                    except queue.Empty:
                        break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            last_size = len(batch)
            try:
                self._publish(batch)
            except Exception as e:  # noqa: BLE001 - never let the thread die with runs queued
                _log.exception("celery publisher: unexpected error")
                self._failed([p for p in batch if not p.fut.done()], e, what="publisher")
            if stop:
                break
        while True:  # shut down: what is still queued never started
            try:
                left = q.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                left.fut.cancel()

    def _open_atomic(self) -> AtomicPublisher | None:
        """The one-round-trip publisher, opened on first use; ``None`` (for good) when
        it does not apply to this app. Raises when the broker cannot be reached."""
        if self._atomic is None and not self._atomic_off:
            self._atomic = AtomicPublisher.open(self.celery_app)
            self._atomic_off = self._atomic is None
            if self._atomic_off:
                _log.debug("celery publisher: broker and result backend differ; general path")
        return self._atomic

    def _publish(self, batch: list[_Publish]) -> None:
        live = [p for p in batch if p.fut.set_running_or_notify_cancel()]
        if not live:
            return
        if not self._atomic_off and self._publish_atomic(live):
            return
        if self.track_results:
            live = self._skip_known(live)
            for p in live:  # before the publish: a fast outcome must not be missed
                assert p.outcome is not None
                self.watcher.watch(p.task_id, p.outcome)
        if not live:
            return
        for p in live:
            if p.job is not None:
                p.job.mark_started()
        app = self.celery_app
        try:
            if self._session is None:
                self._session = PublishSession(app, 2 * self.batch_size)
            producer = self._session.producer
            for p in live:
                publish(app, producer, p.name, p.args, p.kwargs, p.task_id, p.options,
                        self._declared)  # fmt: skip
            self._session.flush()
        except Exception as e:  # noqa: BLE001 - the Celery broker refused: chronoq retries
            if self._session is not None:
                self._session.close(e)
                self._session = None
            self._declared.clear()  # a new connection (maybe a new broker) declares again
            self._failed(live, e)
            return
        self.published += len(live)
        if self.track_results:
            self._unmarked.extend(p.task_id for p in live)
        for p in live:
            p.fut.set_result(None if p.outcome is None else Handoff(p.outcome))

    def _publish_atomic(self, live: list[_Publish]) -> bool:
        """Publish ``live`` with one script (see :mod:`workers.executors.celery_atomic`);
        ``False`` when this app needs the general path (nothing was sent then)."""
        try:
            atomic = self._open_atomic()
        except Exception as e:  # noqa: BLE001 - the broker is unreachable: chronoq retries
            self._failed(live, e)
            return True
        if atomic is None:
            return False
        for p in live:  # before the publish: a fast outcome must not be missed
            assert p.outcome is not None
            self.watcher.watch(p.task_id, p.outcome)
        try:
            for p in live:
                atomic.add(p.name, p.args, p.kwargs, p.task_id, p.options)
            replies = atomic.flush()
        except NotScriptable as e:
            _log.info("celery publisher: %s; publishing through kombu from now on", e)
            for p in live:
                assert p.outcome is not None
                self.watcher.unwatch(p.task_id, p.outcome)
            atomic.close()
            self._atomic, self._atomic_off = None, True
            return False
        except Exception as e:  # noqa: BLE001 - the broker refused: chronoq retries
            atomic.close()
            self._atomic = None  # a new connection (maybe a new broker) next time
            self._failed(live, e)
            return True
        for p in live:
            reply = replies[p.task_id]
            assert p.outcome is not None
            if isinstance(reply, int):
                if reply != PUBLISHED and p.outcome.done() and p.outcome.exception():
                    # Published over a FAILURE a sweep may have read in the meantime:
                    # that outcome was the previous run's; wait for this one's (a sweep
                    # finds it if it came already).
                    p.outcome = Future()
                    self.watcher.watch(p.task_id, p.outcome)
                if p.job is not None:
                    p.job.mark_started()
                self.published += 1
                p.fut.set_result(Handoff(p.outcome))
            else:
                self.watcher.unwatch(p.task_id, p.outcome)
                if self._known(p, reply):  # a stored state the script could not read
                    p.outcome.set_exception(CeleryTaskFailed(
                        p.task_id, "UNREADABLE", "not published over a result-backend "
                        "entry chronoq cannot read; retried after the backoff"))  # fmt: skip
                    p.fut.set_result(Handoff(p.outcome))
        return True

    def _mark_sent(self) -> None:
        """Store ``SENT`` for the tasks published and not marked yet (see the module
        docstring); a failure is logged, not retried: those tasks were published all
        the same, only a redelivery of their messages would publish them again."""
        ids, self._unmarked = self._unmarked, []
        if not ids:
            return
        try:
            self.watcher.mark_sent(ids)
        except Exception as e:  # noqa: BLE001 - see above
            _log.warning(
                "celery result backend: could not store SENT for %d published task(s) (%s: %s); "
                "a redelivery of their messages before their outcome would publish them again "
                "(msg=%s)",
                len(ids),
                type(e).__name__,
                e,
                ", ".join(ids[:5]) + (" ..." if len(ids) > 5 else ""),
            )

    def _skip_known(self, live: list[_Publish]) -> list[_Publish]:
        """Drop the runs whose task Celery already has (see the module docstring): one
        ``MGET`` per batch, also for first attempts, since a message re-read after a
        crash of the embedded broker comes with ``attempts`` 1 again."""
        try:  # the SENT marks of the batches published since ride along (one round trip)
            metas = self.watcher.lookup((p.task_id for p in live), mark_sent=self._unmarked)
            self._unmarked = []
        except Exception as e:  # noqa: BLE001 - backend down: do not publish blindly
            self._failed(live, e, what="result backend")
            return []
        return [p for p in live if self._known(p, metas.get(p.task_id))]

    def _known(self, p: _Publish, meta: dict[str, Any] | None) -> bool:
        """Act on what the result backend has for ``p``'s task: ``True`` when it is
        to be published (nothing, ``PENDING``, or a ``FAILURE``/``REVOKED`` this
        delivery retries); else ``p``'s future is completed here."""
        state = None if meta is None else meta.get("status")
        if state is None or state == "PENDING":
            return True
        if state == "SUCCESS":
            _log.info("celery task %s already succeeded; not published again", p.task_id)
            p.fut.set_result(meta.get("result") if meta else None)
            return False
        if state in READY_STATES:  # FAILURE/REVOKED: this delivery is chronoq's retry
            self.watcher.forget(p.task_id)
            return True
        # SENT, STARTED, RETRY, RECEIVED: Celery has it; wait for it instead of a second run
        _log.info("celery task %s is %s; waiting for it, not publishing", p.task_id, state)
        assert p.outcome is not None
        self.watcher.watch(p.task_id, p.outcome)
        p.fut.set_result(Handoff(p.outcome))
        return False

    def _failed(self, runs: list[_Publish], exc: BaseException, what: str = "broker") -> None:
        where = _broker_url(self.celery_app) if what == "broker" else ""
        how = "unreachable" if _is_connection_error(exc) else "refused the publish"
        ids = ", ".join(p.task_id for p in runs[:5]) + (" ..." if len(runs) > 5 else "")
        _log.warning(
            "celery %s %s %s (%s: %s): %d job(s) not published, the dispatcher releases "
            "them for a retry after the backoff (msg=%s)",
            what,
            where,
            how,
            type(exc).__name__,
            exc,
            len(runs),
            ids,
        )
        reason = f"celery {what} {how}: {type(exc).__name__}: {exc}"
        for p in runs:
            if p.outcome is not None:
                self.watcher.unwatch(p.task_id, p.outcome)
            if not p.fut.done():
                p.fut.set_exception(JobNotStarted(p.task_id, reason))


def _is_connection_error(exc: BaseException) -> bool:
    from kombu.exceptions import OperationalError

    return isinstance(exc, OperationalError | OSError | ConnectionError | TimeoutError) or (
        type(exc).__module__.startswith("redis") and "Connection" in type(exc).__name__
    )


def _broker_url(celery_app: Any) -> str:
    try:
        return str(celery_app.connection_for_write().as_uri())
    except Exception:  # noqa: BLE001 - only for a log line
        return "?"


__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_LINGER_MS",
    "RUN_TASK",
    "TASK_JOB_PREFIX",
    "CeleryExecutor",
    "publish",
    "task_id_for",
    "task_message",
]
