"""AckQueue: the acks a consumer answered itself, waiting on a
:class:`~broker_adapter.server.link.Link` to be written.

Acks a consumer answered itself (:meth:`Link.ack_later
<broker_adapter.server.link.Link.ack_later>`) are written without anyone waiting
for them, one ``ack_batch`` per consumer: at once on a quiet link (no call under way
or ended within :data:`ACK_WRITE_DELAY_S`); while a call (a dispatcher's long poll)
or an ack batch is under way, with the next request (a dispatcher's next pull
carries them: no write of their own) or by the link's background reader within
:data:`ACK_WRITE_DELAY_S` (while acks flow, it looks at the queue every
:data:`ACK_WRITE_DELAY_S` rather than being woken for each batch: a thread wake-up
less per pull). Either way the server applies them before whatever this process
asks next. The link's reader reads their answers. If the link breaks first they are
lost, and the server delivers those messages again after their invisible time (at
least once, as ever).

This module keeps the queue, its timing and its frames; the link writes them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from broker_adapter.server import protocol as P

# The link's logger (link.py adds its NullHandler): these lines are about its requests.
log = logging.getLogger("chronoq.broker_adapter.Link")

#: Longest an ack of :meth:`Link.ack_later <broker_adapter.server.link.Link.ack_later>`
#: waits for a request to carry it before the background reader writes it.
ACK_WRITE_DELAY_S = 0.005
#: While acks were queued this recently (s), the background reader looks at the queue
#: every :data:`ACK_WRITE_DELAY_S` instead of being woken for each batch.
ACK_BUSY_S = 0.1


class AckQueue:
    """Receipts acked without waiting, per consumer id, until written as ``ack_batch``
    frames, and when they are due.

    Not locked by itself: the owning link's lock guards it, held around every call
    but :meth:`answered`, which takes it (it runs on the thread that read the answer).

    :param lock: the owning link's lock.
    :param address: the server's address, for log lines.
    """

    __slots__ = ("_due", "_last", "_lock", "_receipts", "address", "batches")

    def __init__(self, lock: threading.Lock, address: str) -> None:
        self._lock = lock
        self.address = address
        self._receipts: dict[int, list[bytes]] = {}  # consumer id -> receipts not yet written
        #: ``ack_batch`` requests written and not answered yet.
        self.batches = 0
        self._due = 0.0  # monotonic time by which queued acks are written
        self._last = -math.inf  # monotonic time acks were last queued with a wait

    def __bool__(self) -> bool:
        """Whether acks wait to be written."""
        return bool(self._receipts)

    def add(self, cid: int, receipt: bytes) -> bool:
        """Queue ``receipt`` of consumer ``cid``; whether the queue was empty before."""
        receipts = self._receipts
        first = not receipts
        acks = receipts.get(cid)
        if acks is None:
            receipts[cid] = [receipt]
        else:
            acks.append(receipt)
        return first

    def arm(self, t: float) -> float:
        """The first ack was queued at ``t`` (monotonic) with no write of its own: it is
        due :data:`ACK_WRITE_DELAY_S` later. That due time."""
        self._last = t
        self._due = t + ACK_WRITE_DELAY_S
        return self._due

    def wait_s(self, now: float) -> float | None:
        """How long the background reader may wait before it writes the queue (at
        ``now``, monotonic): at most 0 when due, ``None`` when nothing is to be timed."""
        if self._receipts:
            return self._due - now
        if now - self._last < ACK_BUSY_S:
            # Acks flow: look again within ACK_WRITE_DELAY_S, so ack_later need not
            # wake the reader for each batch (issue 16).
            return ACK_WRITE_DELAY_S
        return None

    def take_frames(
        self,
        rids: Iterator[int],
        pending: MutableMapping[int, Callable[[Any, BaseException | None], None]],
    ) -> list[bytes]:
        """Empty the queue into ``ack_batch`` frames, one per consumer, each with a
        request id from ``rids`` and its answer awaited in ``pending`` (by
        :meth:`answered`)."""
        acks, self._receipts = self._receipts, {}
        frames = []
        for cid, receipts in acks.items():
            rid = next(rids)
            pending[rid] = self.answered
            self.batches += 1
            frames.append(P.request(rid, "ack_batch", {"cid": cid, "receipts": receipts}))
        return frames

    def drop(self) -> None:
        """Forget the queued acks (the link is dead: delivered again after their
        invisible time)."""
        self._receipts = {}

    def answered(self, result: Any, error: BaseException | None) -> None:
        """An ``ack_batch`` of the queue was answered (or failed with the link)."""
        with self._lock:
            self.batches -= 1
        if error is not None:
            log.debug("acks to %s failed (delivered again later): %s", self.address, error)
        elif isinstance(result, list) and not all(result):
            log.debug("%d acks to %s came too late", result.count(False), self.address)


__all__ = ["ACK_BUSY_S", "ACK_WRITE_DELAY_S", "AckQueue"]
