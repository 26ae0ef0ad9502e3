"""AsyncSender: one thread that turns ``send_async``/``send_oneway`` calls into batches.

Messages queue up while a batch is being written, so under load async sends
cost about what ``send_batch`` does (group commit). The adapter base
(:class:`~broker_adapter.adapter.AdapterBase`) checks each message before it is
queued, so a batch fails only for reasons that concern all of it (e.g. the
broker closed), and then every callback hears the error.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence

from broker_adapter.base import SendCallback
from broker_adapter.errors import BrokerClosed
from broker_adapter.message import Message
from broker_adapter.results import SendResult

log = logging.getLogger("chronoq.broker_adapter.AsyncSender")
log.addHandler(logging.NullHandler())

MAX_BATCH = 1000


class AsyncSender:
    """Background batching sender.

    :param send_batch: the broker's ``send_batch``.
    """

    def __init__(self, send_batch: Callable[[Sequence[Message]], list[SendResult]]) -> None:
        self._send_batch = send_batch
        self._queue: deque[tuple[Message, SendCallback | None]] = deque()
        self._cond = threading.Condition()
        self._busy = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def submit(self, message: Message, callback: SendCallback | None) -> None:
        """Queue ``message`` (already checked); ``callback`` (if any) hears the outcome on
        the sender thread.

        :raises BrokerClosed: when the sender is closing.
        """
        with self._cond:
            if self._closing:
                raise BrokerClosed("broker is closing")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="chronoq-async-send", daemon=True
                )
                self._thread.start()
            self._queue.append((message, callback))
            self._cond.notify()

    def flush(self, timeout_s: float) -> None:
        """Wait until everything queued before has been written (or ``timeout_s`` passed)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                n = min(len(self._queue), MAX_BATCH)
                items = [self._queue.popleft() for _ in range(n)]
                self._busy += 1
            try:
                results: list[SendResult] | None = self._send_batch([m for m, _ in items])
                error: BaseException | None = None
            except Exception as e:  # every callback must hear it
                results, error = None, e
                log.warning("async send of %d messages failed", len(items), exc_info=True)
            for i, (_, callback) in enumerate(items):
                if callback is None:
                    continue
                try:
                    callback(results[i] if results else None, error)
                except Exception:
                    log.exception("send_async callback raised")
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()
