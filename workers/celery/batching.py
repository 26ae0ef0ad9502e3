"""Batches that linger: a queue read a batch at a time, like Kafka's ``linger.ms``.

While items come faster than one per ``linger_s`` (a moving average of the time
between them), a batch waits up to ``linger_s`` after its first item for more: at
hundreds of items a second that cuts the cost per item of whatever the batch is
for (a publish round trip here), for at most that much added delay. Slower, each
item goes alone at once.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LingerQueue(Generic[T]):
    """A queue of items read in batches of up to ``batch_size``; see the module docstring.

    One thread reads (:meth:`next_batch`), any thread writes (:meth:`put`, :meth:`stop`).

    :param batch_size: most items per batch.
    :param linger_s: how long a batch of streaming items waits for more after its first.
    """

    def __init__(self, batch_size: int, linger_s: float) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_s
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._last_batch_at = time.monotonic()
        self._last_size = 1
        self._gap_s = 1.0

    def put(self, item: T) -> None:
        """Add ``item`` to the next batch."""
        self._queue.put(item)

    def stop(self) -> None:
        """Mark the end: :meth:`next_batch` says stop once it reaches this mark."""
        self._queue.put(None)

    def next_batch(self, on_idle: Callable[[], None]) -> tuple[list[T], bool]:
        """Block for the next batch.

        :param on_idle: called once when nothing is at hand, before blocking.
        :returns: the batch (empty only at the end) and whether the end was reached.
        """
        q = self._queue
        try:
            first = q.get_nowait()
        except queue.Empty:
            on_idle()
            first = q.get()
        if first is None:
            return [], True
        batch = [first]
        now = time.monotonic()
        # items arrive every `gap_s` on average (since the previous batch began)
        self._gap_s += 0.2 * (min(now - self._last_batch_at, 1.0) / self._last_size - self._gap_s)
        self._last_batch_at = now
        until = now + (self.linger_s if self._gap_s < self.linger_s else 0.0)
        stop = False
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
        self._last_size = len(batch)
        return batch, stop

    def drain(self) -> list[T]:
        """Take every item still queued (after the end, say), without blocking."""
        out: list[T] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out
            if item is not None:
                out.append(item)


__all__ = ["LingerQueue"]
