"""How a :class:`~workers.celery.executor.CeleryExecutor` learns each task's outcome.

A :class:`ResultWatcher` maps Celery task ids (equal to chronoq message ids) to the
futures the dispatcher waits on, and completes them from the Celery *result
backend*, so the chronoq message stays in flight until the task has run:

* with the Redis result backend, one pattern subscription to the backend's
  channels (``celery-task-meta-*``: Celery publishes every state change there)
  delivers outcomes within milliseconds (the thread reads all at hand, then
  pauses :data:`GATHER_S` so the next ones come several to a wake-up), and a sweep (one ``MGET`` per 1,000
  watched ids) right after each (re)subscription and then every ``resweep_s``
  (5 s) catches anything published while the subscription was down;
* with any other key-value backend only the sweep runs (``mget``), every
  ``sweep_s``; with a backend that has neither, one ``get_task_meta`` per
  watched id.

A sweep reads thousands of stored metas when Celery has a backlog, so it
decodes only the ready ones (unready states are recognised by their first
bytes), and with a subscription it is rare: measured here, a 0.5 s sweep over
a few thousand watched ids cost more CPU than the publishing itself.

``SUCCESS`` completes the future with the task's return value; ``FAILURE`` with
the task's exception as the result backend rebuilds it (the original class when
it can be imported here, so ``RetryPolicy.retry_on`` works as for local jobs);
``REVOKED`` with Celery's ``TaskRevokedError``. Unready states (``PENDING``,
``SENT``, ``STARTED``, ``RETRY``...) keep waiting.

``SENT`` is chronoq's own state (the name Celery's documentation suggests for a
custom "published" state): once Celery's broker accepted a publish,
:meth:`ResultWatcher.mark_sent` stores it for each task that has no state yet
(``SET NX``, so it never hides a state the worker already wrote; the worker's own
writes replace it). A redelivered message whose task is ``SENT`` is therefore
known to be in Celery's hands, queued or running, even with ``task_track_started``
off, and is waited for instead of published twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from workers.celery.compat import built_client, thread_backend

_log = logging.getLogger("chronoq.workers.CeleryExecutor")

#: States after which a task will not run again by itself.
READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
#: The state chronoq stores for a task Celery's broker accepted (see the module docstring).
SENT_STATE = "SENT"
#: Pause after reading the outcomes at hand, so that the next ones gather, s.
GATHER_S = 0.005
#: Ids per ``MGET`` in a sweep.
SWEEP_CHUNK = 1000
#: How Celery's JSON meta of an unready state starts (``status`` is its first field):
#: such a state change is dropped without decoding it. Any other text is decoded.
_UNREADY = tuple(
    f'{{"status": "{s}"'.encode() for s in ("STARTED", "RETRY", "RECEIVED", SENT_STATE)
)


class CeleryTaskFailed(Exception):
    """A Celery task ended in ``state`` and its exception could not be rebuilt here.

    :param task_id: the task id (the chronoq message id).
    :param state: the Celery state, e.g. ``FAILURE``.
    :param detail: what the result backend said.
    """

    def __init__(self, task_id: str, state: str, detail: str) -> None:
        self.task_id = task_id
        self.state = state
        super().__init__(f"celery task {task_id} ended {state}: {detail}")


def outcome_error(task_id: str, meta: dict[str, Any]) -> BaseException | None:
    """The exception a ready ``meta`` stands for, or ``None`` for ``SUCCESS``."""
    state = meta.get("status")
    if state == "SUCCESS":
        return None
    result = meta.get("result")
    if isinstance(result, BaseException):
        return result
    return CeleryTaskFailed(task_id, str(state), repr(result))


class ResultWatcher:
    """Completes futures from a Celery app's result backend; see the module docstring.

    :param celery_app: the Celery app whose backend stores the results.
    :param sweep_s: seconds between sweeps of every watched id without a subscription.
    :param resweep_s: seconds between sweeps while subscribed (a safety net).
    """

    def __init__(self, celery_app: Any, *, sweep_s: float = 0.5, resweep_s: float = 5.0) -> None:
        self.celery_app = celery_app
        self.sweep_s = sweep_s
        self.resweep_s = resweep_s
        self._lock = threading.Lock()
        self._watched: dict[str, list[Future[Any]]] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._backend: Any = None
        self._prefix = b""
        # close() publishes on this watcher's own channel so that the subscribed
        # thread's blocking read returns at once, not at its 0.2 s timeout
        self._stop_channel = f"chronoq-results-stop:{uuid.uuid4().hex}"
        self._subscribed: Any = None  # the client whose pub/sub reads, while it does

    # -- what the executor calls ----------------------------------------------------------

    def start(self) -> None:
        """Start the thread (and its subscription) now; :meth:`watch` does it otherwise."""
        with self._lock:
            self._start_thread()

    def watch(self, task_id: str, fut: Future[Any]) -> None:
        """Complete ``fut`` once task ``task_id`` is ready (starts the thread on first use)."""
        with self._lock:
            self._watched.setdefault(task_id, []).append(fut)
            self._start_thread()

    def _start_thread(self) -> None:
        if self._thread is None and not self._stop.is_set():
            thread = threading.Thread(target=self._loop, name="chronoq-celery-results", daemon=True)
            thread.start()
            self._thread = thread

    def unwatch(self, task_id: str, fut: Future[Any]) -> None:
        """Stop waiting for ``task_id`` on behalf of ``fut`` (its publish failed)."""
        with self._lock:
            futs = self._watched.get(task_id)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self._watched[task_id]

    def lookup(
        self, task_ids: Iterable[str], *, mark_sent: Iterable[str] = ()
    ) -> dict[str, dict[str, Any] | None]:
        """The stored meta of each id that has one (one round trip for a KV backend).

        :param mark_sent: ids to store :data:`SENT_STATE` for first, in the same
            round trip (see :meth:`mark_sent`; Redis backend only, else ignored).

        Called from the executor's publisher thread; uses that thread's backend.
        """
        ids = list(task_ids)
        backend = self.celery_app.backend
        pipe = self._sent_pipeline(backend, mark_sent)
        if pipe is None:
            return dict(zip(ids, _metas(backend, ids), strict=True))
        if ids:
            pipe.mget([backend.get_key_for_task(i) for i in ids])
        replies = pipe.execute()
        if not ids:
            return {}
        values = replies[-1]
        return dict(zip(ids, (decode_meta(backend, v) for v in values), strict=True))

    def mark_sent(self, task_ids: Iterable[str]) -> bool:
        """Store :data:`SENT_STATE` for each id that has no state yet: one pipelined
        ``SET NX`` per id with the backend's result expiry, one round trip in all.
        Called from the executor's publisher thread after Celery's broker accepted
        the publishes.

        :returns: ``False`` when the backend is not Redis (nothing stored).
        """
        pipe = self._sent_pipeline(self.celery_app.backend, task_ids)
        if pipe is None:
            return False
        pipe.execute()
        return True

    @staticmethod
    def _sent_pipeline(backend: Any, task_ids: Iterable[str]) -> Any:
        """A Redis pipeline holding a ``SET NX`` of ``SENT`` per id; ``None`` when the
        backend is not Redis."""
        client = getattr(backend, "client", None)
        if client is None or not hasattr(client, "pipeline") or not _key_prefix(backend):
            return None
        expires = getattr(backend, "expires", None)
        px = int(float(expires) * 1000) if expires else None
        pipe = client.pipeline(transaction=False)
        for task_id in task_ids:
            meta = backend.encode(sent_meta(task_id))
            pipe.set(backend.get_key_for_task(task_id), meta, nx=True, px=px)
        return pipe

    def forget(self, task_id: str) -> None:
        """Delete a stored result (before a retry publishes the same id again)."""
        self.celery_app.backend.forget(task_id)

    @property
    def is_running(self) -> bool:
        """Whether the thread (subscription and sweeps) runs."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def watching(self) -> int:
        """How many task ids are waited for."""
        with self._lock:
            return len(self._watched)

    def close(self) -> None:
        """Stop the thread; futures still watched stay pending (their messages are
        released by the dispatcher's drain)."""
        self._stop.set()
        self._wake.set()
        client = self._subscribed
        if client is not None:
            with contextlib.suppress(Exception):  # the read then ends at its timeout
                client.publish(self._stop_channel, b"")
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    # -- the thread -------------------------------------------------------------------------

    def _resolve(self, task_id: str, meta: dict[str, Any]) -> None:
        if meta.get("status") not in READY_STATES:
            return
        with self._lock:
            futs = self._watched.pop(task_id, None)
        for fut in futs or ():
            if fut.done():
                continue
            error = outcome_error(task_id, meta)
            if error is None:
                fut.set_result(meta.get("result"))
            else:
                fut.set_exception(error)

    def _sweep(self) -> None:
        with self._lock:
            ids = list(self._watched)
        for start in range(0, len(ids), SWEEP_CHUNK):
            chunk = ids[start : start + SWEEP_CHUNK]
            metas = _metas(self._backend, chunk, ready_only=True)
            for task_id, meta in zip(chunk, metas, strict=True):
                if meta is not None:
                    self._resolve(task_id, meta)

    def _loop(self) -> None:
        self._backend = self.celery_app.backend  # this thread's own backend instance
        self._prefix = _key_prefix(self._backend)
        client = getattr(self._backend, "client", None)
        pubsub_ok = client is not None and hasattr(client, "pubsub") and bool(self._prefix)
        broken = False
        while not self._stop.is_set():
            try:
                if pubsub_ok:
                    self._listen(client)
                else:
                    self._sweep()
                    self._stop.wait(self.sweep_s)
                if broken:
                    _log.info("celery result backend reachable again")
                    broken = False
            except Exception as e:  # noqa: BLE001 - backend down: keep the futures, retry
                if not broken:
                    _log.warning(
                        "celery result backend %s unreachable (%s: %s); outcomes wait, "
                        "retrying every second",
                        _safe_uri(self._backend),
                        type(e).__name__,
                        e,
                    )
                broken = True
                self._stop.wait(1.0)
        close_thread_backend(self.celery_app)

    def _listen(self, client: Any) -> None:
        """Subscribe, sweep once, then read state changes until stopped or broken."""
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.psubscribe(self._prefix + b"*")
            pubsub.subscribe(self._stop_channel)  # a plain message: _on_message skips it
            self._subscribed = client
            next_sweep = 0.0
            clock = time.monotonic
            while not self._stop.is_set():
                now = clock()
                if now >= next_sweep:
                    self._sweep()
                    next_sweep = now + self.resweep_s
                msg = pubsub.get_message(timeout=0.2)
                if msg is None:
                    continue
                while msg is not None:
                    self._on_message(msg)
                    msg = pubsub.get_message(timeout=0)
                # Let the next outcomes gather: one wake-up per few instead of one per
                # task. It delays settling a message, never a task's start.
                self._stop.wait(GATHER_S)
        finally:
            self._subscribed = None
            with contextlib.suppress(Exception):  # closing a broken connection
                pubsub.close()

    def _on_message(self, msg: dict[str, Any]) -> None:
        if msg.get("type") != "pmessage":
            return
        channel = msg.get("channel")
        if isinstance(channel, str):
            channel = channel.encode()
        if not isinstance(channel, bytes) or not channel.startswith(self._prefix):
            return
        task_id = channel[len(self._prefix) :].decode("utf-8", "replace")
        with self._lock:
            if task_id not in self._watched:
                return
        data = msg["data"]
        if isinstance(data, bytes) and data.startswith(_UNREADY):
            return  # e.g. STARTED: half the messages, not worth a JSON decode
        meta = self._backend.decode_result(data)
        if isinstance(meta, dict):
            self._resolve(task_id, meta)


def sent_meta(task_id: str) -> dict[str, Any]:
    """The meta chronoq stores as :data:`SENT_STATE` for ``task_id`` (Celery's meta
    fields, in Celery's order: ``status`` first)."""
    return {
        "status": SENT_STATE, "result": None, "traceback": None,
        "children": [], "date_done": None, "task_id": task_id,
    }  # fmt: skip


def close_thread_backend(celery_app: Any) -> None:
    """Disconnect this thread's own result-backend connections (Celery keeps one
    backend per thread unless it is thread-safe), so none is left to the GC."""
    backend = thread_backend(celery_app)  # without creating one
    if backend is None or getattr(backend, "thread_safe", False):
        return
    client = built_client(backend)  # only if it was made
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        with contextlib.suppress(Exception):
            pool.disconnect()


def _key_prefix(backend: Any) -> bytes:
    prefix = getattr(backend, "task_keyprefix", None)
    if isinstance(prefix, str):
        return prefix.encode()
    return prefix if isinstance(prefix, bytes) else b""


def _safe_uri(backend: Any) -> str:
    try:
        return str(backend.as_uri())
    except Exception:  # noqa: BLE001 - only for a log line
        return type(backend).__name__


def decode_meta(backend: Any, value: Any, ready_only: bool = False) -> dict[str, Any] | None:
    """One stored meta (``None`` when nothing is stored; with ``ready_only``, also for
    the JSON meta of an unready state, which is then not decoded)."""
    if value is None or (ready_only and isinstance(value, bytes) and value.startswith(_UNREADY)):
        return None
    meta = backend.decode_result(value)
    return meta if isinstance(meta, dict) else None


def _metas(backend: Any, ids: list[str], ready_only: bool = False) -> list[dict[str, Any] | None]:
    """Stored meta per id (``None`` when nothing is stored; with ``ready_only``, also
    for a JSON meta of an unready state, not decoded)."""
    if not ids:
        return []
    if hasattr(backend, "mget") and hasattr(backend, "get_key_for_task"):
        try:
            values = backend.mget([backend.get_key_for_task(i) for i in ids])
        except NotImplementedError:
            values = None
        if values is not None:
            return [decode_meta(backend, v, ready_only) for v in values]
    out: list[dict[str, Any] | None] = []
    for task_id in ids:
        meta = backend.get_task_meta(task_id, cache=False)
        out.append(None if meta.get("status") == "PENDING" else meta)
    return out


__all__ = [
    "READY_STATES",
    "SENT_STATE",
    "CeleryTaskFailed",
    "ResultWatcher",
    "close_thread_backend",
    "decode_meta",
    "outcome_error",
    "sent_meta",
]
