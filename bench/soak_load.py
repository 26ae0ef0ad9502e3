"""The load of the kill -9 soaks: a keyed producer that also aborts, and a consumer
that records each delivery, both writing to a :class:`~bench.soak_ledger.LedgerFile`.

Written against two small callables (send a key, abort an id or key) and the
``Consumer`` contract, so the same load drives the embedded owner, a broker-server
client and a Scheduler whose jobs a dispatcher runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable

from bench.soak_ledger import LedgerFile
from broker_adapter.base import Consumer
from broker_adapter.errors import ChronoqError

#: ``send(key, delay_ms) -> msg_id`` (``OK`` or ``DUPLICATE`` of a retried key).
SendFn = Callable[[str, int], str]
#: ``abort(msg_id, key) -> AbortStatus value``; by key when ``key`` is given.
AbortFn = Callable[[str, str | None], str]

#: How many sends back the producer aborts: far enough that some already fired.
ABORT_LAG = 40


def retrying(call: Callable[[], str], stop: threading.Event) -> str | None:
    """``call()`` until it returns (a broker that was killed comes back); ``None``
    when ``stop`` is set first. Only safe for idempotent calls: keyed sends, aborts."""
    while True:
        try:
            return call()
        except ChronoqError:
            if stop.wait(0.02):
                return None


class Producer(threading.Thread):
    """Keyed sends at about ``rate`` per second, due 0-``max_delay_ms`` ahead, and an
    abort (by id or by key, alternately) of the send ``ABORT_LAG`` back on every third.

    :param prefix: key prefix, unique per producer incarnation.
    """

    def __init__(
        self,
        ledger: LedgerFile,
        send: SendFn,
        abort: AbortFn,
        prefix: str,
        *,
        rate: float = 400.0,
        max_delay_ms: int = 1_500,
        seed: int = 0,
    ) -> None:
        super().__init__(daemon=True, name=f"producer-{prefix}")
        self.ledger, self._send, self._abort = ledger, send, abort
        self.prefix, self.rate, self.max_delay_ms = prefix, rate, max_delay_ms
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        """Send, journal, abort, until :attr:`stop` is set."""
        recent: deque[tuple[str, str]] = deque(maxlen=ABORT_LAG)
        t0 = time.monotonic()
        while not self.stop.is_set():
            key = f"{self.prefix}-{self.sent}"
            delay = self.rng.randrange(self.max_delay_ms)
            msg_id = retrying(lambda: self._send(key, delay), self.stop)  # noqa: B023
            if msg_id is None:
                return
            self.ledger.sent(msg_id, key)
            self.sent += 1
            if self.sent % 3 == 0 and len(recent) == ABORT_LAG:
                old_id, old_key = recent[0]
                by_key = old_key if self.sent % 2 else None
                self.ledger.abort_asked(old_id)
                status = retrying(lambda: self._abort(old_id, by_key), self.stop)  # noqa: B023
                if status is None:
                    return
                self.ledger.abort_answer(old_id, status)
            recent.append((msg_id, key))
            ahead = self.sent / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                self.stop.wait(ahead)


class Recorder(threading.Thread):
    """Pulls from ``consumer``, records each delivery, works ``work_s`` per pull (so
    kills land with messages in flight), then acks each and records the ack. Errors
    of a broker that went away are waited out."""

    def __init__(self, ledger: LedgerFile, consumer: Consumer, work_s: float = 0.01) -> None:
        super().__init__(daemon=True, name="recorder")
        self.ledger, self.consumer, self.work_s = ledger, consumer, work_s
        self.stop = threading.Event()
        self.delivered = 0

    def run(self) -> None:
        """Pull, record, ack, until :attr:`stop` is set."""
        while not self.stop.is_set():
            try:
                got = self.consumer.pull(max_messages=64, wait_ms=200)
            except ChronoqError:
                self.stop.wait(0.05)
                continue
            now = time.time()
            for m in got:
                self.ledger.run(m.msg_id, m.attempts, now)
            self.delivered += len(got)
            if got:
                time.sleep(self.work_s)
            for m in got:
                try:
                    self.consumer.ack(m)
                except ChronoqError:
                    continue  # not acked: it comes back, and then it is a duplicate
                self.ledger.acked(m.msg_id)
