"""The publisher thread of a :class:`~workers.celery.executor.CeleryExecutor`.

:class:`Publisher` takes the runs the executor accepted, gathers them into batches
(waiting up to ``linger_s`` for more while jobs stream in) and publishes each
batch on one of two paths: one atomic Lua script that looks the tasks up, pushes
them and stores their ``SENT`` states (:mod:`workers.celery.atomic`), or the
general path, a lookup round trip, kombu's publish batch, then the ``SENT``
writes (:mod:`workers.celery.publish`). It completes each run's future once
Celery's broker accepted the publish; the guarantees are in
:mod:`workers.celery.executor`.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kombu.exceptions import OperationalError

from workers.celery.atomic import PUBLISHED, AtomicPublisher, NotScriptable
from workers.celery.batching import LingerQueue
from workers.celery.publish import PublishSession, publish
from workers.celery.results import (
    READY_STATES,
    CeleryTaskFailed,
    ResultWatcher,
    close_thread_backend,
)
from workers.context import JobContext
from workers.executors.base import Handoff, JobNotStarted

_log = logging.getLogger("chronoq.workers.CeleryExecutor")


@dataclass(slots=True)
class PublishRun:
    """One run waiting for the publisher thread: its future, its Celery task, its job."""

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


class Publisher:
    """Publishes :class:`PublishRun` s on a thread of its own; see the module docstring.

    :param celery_app: the Celery app to publish with.
    :param watcher: where the runs' outcomes are watched for (with ``track_results``).
    :param track_results: look tasks up before publishing them and store ``SENT``
        for them (the outcome path); ``False``: publish and forget.
    :param batch_size: most publishes per round trip.
    :param linger_s: how long a batch of streaming runs waits for more after its first
        (see :mod:`workers.celery.batching`).
    :param publish_script: with ``track_results``, try the atomic script path first.
    """

    def __init__(
        self,
        celery_app: Any,
        watcher: ResultWatcher,
        *,
        track_results: bool,
        batch_size: int,
        linger_s: float,
        publish_script: bool,
    ) -> None:
        self.celery_app = celery_app
        self.watcher = watcher
        self.track_results = track_results
        self.batch_size = batch_size
        self._runs: LingerQueue[PublishRun] = LingerQueue(batch_size, linger_s)
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
        #: The one-round-trip path (see :mod:`workers.celery.atomic`), opened by the
        #: publisher thread; ``_atomic_off`` once it does not apply to this app.
        self._atomic: AtomicPublisher | None = None
        self._atomic_off = not (track_results and publish_script)
        #: Tasks published so far.
        self.published = 0

    def put(self, run: PublishRun) -> None:
        """Queue ``run`` for publishing (starts the thread on first use).

        :raises RuntimeError: after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("this CeleryExecutor is shut down")
            self._start_thread()
            self._runs.put(run)

    def start(self) -> None:
        """Start the thread now (it opens its producer and reaches the result
        backend at once); :meth:`put` does it otherwise. Never blocks."""
        with self._lock:
            if not self._closed:
                self._start_thread()

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._publisher, name="chronoq-celery-publish", daemon=True
            )
            self._thread.start()

    def close(self, wait: bool = True) -> None:
        """Stop: runs not yet published are cancelled; with ``wait``, join the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._runs.stop()
        if thread is not None and wait:
            thread.join(timeout=10)

    @property
    def script_publisher(self) -> AtomicPublisher | None:
        """The script path's publisher while the thread holds one open."""
        return self._atomic

    @property
    def kombu_session(self) -> PublishSession | None:
        """The general path's producer and batch while the thread holds them open."""
        return self._session

    @property
    def script_path_off(self) -> bool:
        """Whether every batch takes the general path from now on (the script path
        was not asked for, does not apply to this app, or met a route it cannot carry)."""
        return self._atomic_off

    # -- the thread -----------------------------------------------------------------------

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
        runs = self._runs
        while True:
            # idle: store the SENT marks now, rather than with the next batch's lookup
            batch, stop = runs.next_batch(on_idle=self._mark_sent)
            if batch:
                try:
                    self._publish(batch)
                except Exception as e:  # noqa: BLE001 - never let the thread die with runs queued
                    _log.exception("celery publisher: unexpected error")
                    self._failed([p for p in batch if not p.fut.done()], e, what="publisher")
            if stop:
                break
        for left in runs.drain():  # shut down: what is still queued never started
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

    def _publish(self, batch: list[PublishRun]) -> None:
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

    def _publish_atomic(self, live: list[PublishRun]) -> bool:
        """Publish ``live`` with one script (see :mod:`workers.celery.atomic`);
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

    def _skip_known(self, live: list[PublishRun]) -> list[PublishRun]:
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

    def _known(self, p: PublishRun, meta: dict[str, Any] | None) -> bool:
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

    def _failed(self, runs: list[PublishRun], exc: BaseException, what: str = "broker") -> None:
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
    return isinstance(exc, OperationalError | OSError | ConnectionError | TimeoutError) or (
        type(exc).__module__.startswith("redis") and "Connection" in type(exc).__name__
    )


def _broker_url(celery_app: Any) -> str:
    try:
        return str(celery_app.connection_for_write().as_uri())
    except Exception:  # noqa: BLE001 - only for a log line
        return "?"


__all__ = ["PublishRun", "Publisher"]
