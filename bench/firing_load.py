"""FiringLoad: messages firing at a steady rate while a bench times one call, and the
fire lateness of those due while the call ran against those due before it.

The load is ``rate`` messages/s on a topic of their own for ``window_ms``, starting
``lead_ms`` from now, pulled (256 at a time) and acked by one
:class:`~bench.loadgen.ConsumerThread`. Lateness is receive time minus due time, so a
call that stalls the broker (a backup, a big ``abort_prefix``) shows up as the
lateness of the messages due while it ran.
"""

from __future__ import annotations

import threading
import time

from bench.loadgen import ConsumerThread, now_ms, stop_consumers
from bench.stats import format_percentiles, percentiles
from broker_adapter import BrokerAdapter, Message


class FiringLoad:
    """Sends the load and starts its consumer.

    :param broker: where the load fires.
    :param topic: the load's own topic.
    :param group: the consumer group that pulls it.
    :param rate: messages due per second.
    :param window_ms: how long messages keep coming due.
    :param lead_ms: from now to the first due time.
    :param ack_each: ack one message at a time instead of one ``ack_batch`` per pull.
    """

    def __init__(
        self,
        broker: BrokerAdapter,
        topic: str,
        group: str,
        rate: int,
        window_ms: int,
        lead_ms: int = 2_000,
        ack_each: bool = False,
    ) -> None:
        self.start_ms = int(now_ms()) + lead_ms
        self.window_ms = window_ms
        self.count = rate * window_ms // 1_000
        self.rate = rate
        for lo in range(0, self.count, 1_000):
            broker.send_batch(
                [
                    Message(topic, b"l", deliver_at_ms=self.start_ms + i * 1_000 // rate)
                    for i in range(lo, min(lo + 1_000, self.count))
                ]
            )
        self._stop = threading.Event()
        consumer = broker.consumer(group, [topic], max_inflight=10_000)
        self.thread = ConsumerThread(consumer, self._stop, 256, 100, ack_each=ack_each)
        self.thread.start()

    def sleep_into(self, ms: int) -> None:
        """Sleep until ``ms`` into the load."""
        time.sleep(max(self.start_ms + ms - now_ms(), 0) / 1000)

    def finish(self) -> int:
        """Wait for the whole load (at most its window and 15 s), stop the consumer;
        how many messages it received.

        :raises RuntimeError: when the consumer failed.
        """
        deadline = time.monotonic() + self.window_ms / 1000 + 15
        while self.thread.count < self.count and time.monotonic() < deadline:
            time.sleep(0.1)
        stop_consumers([self.thread], self._stop)
        return self.thread.count

    def lateness(self, a0: float, a1: float) -> tuple[list[float], list[float]]:
        """Lateness (ms) of the messages due within ``[a0, a1]`` and of those due before."""
        t = self.thread
        during: list[float] = []
        before: list[float] = []
        i = 0
        for at, n in zip(t.batch_ms, t.batch_n, strict=True):
            for late in t.lateness[i : i + n]:
                due = round(at - late)  # the message's deliver_at_ms
                if a0 <= due <= a1:
                    during.append(late)
                elif due < a0:
                    before.append(late)
            i += n
        return during, before

    def report(self, what: str, a0: float, a1: float) -> None:
        """Print the lateness percentiles during ``what`` (``[a0, a1]``) and before it."""
        during, before = self.lateness(a0, a1)
        print(f"  fire lateness ms during {what} ({len(during):,} fired, {self.rate:,}/s):")
        print(f"      {format_percentiles(percentiles(during))}")
        print(f"  fire lateness ms before it (baseline, {len(before):,} fired):")
        print(f"      {format_percentiles(percentiles(before))}")


__all__ = ["FiringLoad"]
