"""Producers, consumers and exact accounting for the bench scripts.

Written against the ``BrokerAdapter`` contract only, so any adapter works.

* :func:`send_phase` sends messages due uniformly in ``[lo_ms, hi_ms)`` from P
  threads, with ``send_batch`` (``batch`` > 1) or one ``send`` per message.
  Its wall time includes building the :class:`Message` objects, as a real
  producer's would.
* :func:`abort_phase` aborts message ids from P threads and counts the outcomes.
* :class:`ConsumerThread` pulls and acks; per pulled batch it reads the clock once
  and records, per message, ``now_ms - deliver_at_ms`` (lateness) and the id.
* :func:`account` compares the set of accepted ids with what was received.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker_adapter import BrokerAdapter, Consumer, Message, SendStatus

DAY_MS = 86_400_000
HOUR_MS = 3_600_000

#: The figures of one run, as printed by ``--json``.
Figures = dict[str, Any]


def now_ms() -> float:
    """Wall-clock time, epoch ms (the clock ``deliver_at_ms`` is on)."""
    return time.time() * 1000.0


def log(args: argparse.Namespace, text: str) -> None:
    """A progress line on stderr, unless ``--quiet``."""
    if not args.quiet:
        elapsed = time.perf_counter() - args.t0
        print(f"[timer_load +{elapsed:6.1f}s] {text}", file=sys.stderr, flush=True)


@dataclass
class SendPhase:
    """What a send phase did: accepted ids per thread (if collected) and timings."""

    sent: int = 0
    accepted: int = 0
    not_ok: Counter[str] = field(default_factory=Counter)
    ids: list[list[str]] = field(default_factory=list)
    max_due_ms: int = 0
    started_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        """Messages sent per second of wall time."""
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _run_threads(targets: Sequence[Callable[[], None]]) -> tuple[float, float]:
    """Run the callables on one thread each; re-raise the first error.

    Returns ``(started, elapsed)`` in ``time.perf_counter`` seconds.
    """
    errors: list[BaseException] = []

    def guard(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                errors.append(e)

        return run

    threads = [
        threading.Thread(target=guard(fn), name=f"bench-{i}") for i, fn in enumerate(targets)
    ]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return started, elapsed


def split(n: int, parts: int) -> list[int]:
    """``n`` as ``parts`` near-equal counts."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def send_phase(
    broker: BrokerAdapter,
    topic: str,
    n: int,
    lo_ms: int,
    hi_ms: int,
    *,
    threads: int,
    batch: int,
    body: bytes,
    seed: int,
    collect_ids: bool = True,
) -> SendPhase:
    """Send ``n`` messages to ``topic`` due uniformly in ``[lo_ms, hi_ms)``.

    ``batch`` > 1 uses ``send_batch`` with that many messages per call; ``batch``
    == 1 uses ``send`` once per message. Each thread draws its due times from its
    own ``random.Random(seed, thread)``.
    """
    phase = SendPhase(ids=[[] for _ in range(threads)])
    span = max(1, hi_ms - lo_ms)
    max_due = [0] * threads
    not_ok = [Counter[str]() for _ in range(threads)]
    ok = SendStatus.OK

    def producer(i: int, count: int) -> Callable[[], None]:
        def run() -> None:
            rand = random.Random(seed * 1_000 + i).random
            ids = phase.ids[i]
            done = 0
            while done < count:
                k = min(batch, count - done)
                dues = [lo_ms + int(rand() * span) for _ in range(k)]
                msgs = [Message(topic, body, deliver_at_ms=d) for d in dues]
                if batch == 1:
                    results = [broker.send(msgs[0])]
                else:
                    results = broker.send_batch(msgs)
                if collect_ids:
                    ids.extend([r.msg_id for r in results if r.status is ok])
                for r in results:
                    if r.status is not ok:
                        not_ok[i][r.status.value] += 1
                max_due[i] = max(max_due[i], max(dues))
                done += k

        return run

    counts = split(n, threads)
    phase.started_s, phase.elapsed_s = _run_threads([producer(i, c) for i, c in enumerate(counts)])
    phase.sent = n
    for c in not_ok:
        phase.not_ok.update(c)
    phase.accepted = n - sum(phase.not_ok.values())
    phase.max_due_ms = max(max_due)
    return phase


@dataclass
class AbortPhase:
    """Ids aborted (status ``ABORTED``), the count of every status, and the time taken."""

    aborted: set[str] = field(default_factory=set)
    statuses: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        """Aborts per second of wall time."""
        n = sum(self.statuses.values())
        return n / self.elapsed_s if self.elapsed_s > 0 else 0.0


def abort_phase(broker: BrokerAdapter, ids_per_thread: Sequence[Sequence[str]]) -> AbortPhase:
    """Abort each id by ``msg_id``, one thread per list of ids."""
    phase = AbortPhase()
    aborted: list[list[str]] = [[] for _ in ids_per_thread]
    statuses = [Counter[str]() for _ in ids_per_thread]

    def aborter(i: int) -> Callable[[], None]:
        def run() -> None:
            for mid in ids_per_thread[i]:
                status = broker.abort(mid).status.value
                statuses[i][status] += 1
                if status == "ABORTED":
                    aborted[i].append(mid)

        return run

    _, phase.elapsed_s = _run_threads([aborter(i) for i in range(len(ids_per_thread))])
    for i in range(len(ids_per_thread)):
        phase.aborted.update(aborted[i])
        phase.statuses.update(statuses[i])
    return phase


def pick(ids_per_thread: Sequence[Sequence[str]], frac: float, seed: int) -> list[list[str]]:
    """A random ``frac`` of each thread's ids (at least one if ``frac`` > 0 and ids exist)."""
    rng = random.Random(seed)
    out: list[list[str]] = []
    for ids in ids_per_thread:
        k = min(len(ids), max(1, round(len(ids) * frac))) if frac > 0 and ids else 0
        out.append(rng.sample(list(ids), k))
    return out


class ConsumerThread(threading.Thread):
    """Pulls and acks until ``stop`` is set, recording lateness and ids.

    Per pulled batch: one ``time.time()``; per message: ``now_ms - deliver_at_ms``
    into ``lateness``, the id into ``ids``; then the batch is acked with one
    ``ack_batch`` (one round trip to a network broker), or with ``ack_each`` one
    ``ack`` per message.
    """

    def __init__(
        self,
        consumer: Consumer,
        stop: threading.Event,
        pull_max: int,
        wait_ms: int,
        ack_each: bool = False,
    ) -> None:
        super().__init__(name=f"bench-consumer-{consumer.group}", daemon=True)
        self.consumer = consumer
        self.stop = stop
        self.pull_max = pull_max
        self.wait_ms = wait_ms
        self.ack_each = ack_each
        self.lateness = array("d")
        self.ids: list[str] = []
        self.batch_ms = array("d")  # receipt time of each pulled batch, epoch ms
        self.batch_n = array("l")  # its size
        self.count = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        pull, ack, clock = self.consumer.pull, self.consumer.ack, time.time
        ack_batch = self.consumer.ack_batch
        lateness, ids = self.lateness, self.ids
        batch_ms, batch_n = self.batch_ms, self.batch_n
        pull_max, wait_ms, stop = self.pull_max, self.wait_ms, self.stop
        try:
            while not stop.is_set():
                msgs = pull(pull_max, wait_ms)
                if not msgs:
                    continue
                now = clock() * 1000.0
                lateness.extend([now - m.deliver_at_ms for m in msgs])
                ids.extend([m.msg_id for m in msgs])
                batch_ms.append(now)
                batch_n.append(len(msgs))
                self.count += len(msgs)
                if not self.ack_each:
                    ack_batch(msgs)
                    continue
                for m in msgs:
                    ack(m)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e
            stop.set()


@dataclass
class Accounting:
    """Exact delivery accounting by ``msg_id``."""

    expected: int  # accepted and not aborted
    received: int  # deliveries, duplicates included
    lost: int  # expected but never received
    duplicated: int  # deliveries beyond the first of an id
    aborted_delivered: int  # aborted (ABORTED) yet received
    unexpected: int  # received ids this run never had accepted


def received_ids(consumers: Sequence[ConsumerThread]) -> list[str]:
    """Every id received by the consumers, duplicates included."""
    out: list[str] = []
    for c in consumers:
        out.extend(c.ids[:])
    return out


def account(
    accepted: set[str], aborted: set[str], consumers: Sequence[ConsumerThread]
) -> Accounting:
    """Compare what was accepted with what the consumers received."""
    got = received_ids(consumers)
    got_set = set(got)
    expected = accepted - aborted
    return Accounting(
        expected=len(expected),
        received=len(got),
        lost=len(expected - got_set),
        duplicated=len(got) - len(got_set),
        aborted_delivered=len(aborted & got_set),
        unexpected=len(got_set - accepted),
    )


def all_received(expected: set[str], consumers: Sequence[ConsumerThread]) -> bool:
    """Whether every expected id was received (cheap count check first)."""
    if sum(c.count for c in consumers) < len(expected):
        return False
    return expected.issubset(received_ids(consumers))


def receipts(consumers: Sequence[ConsumerThread]) -> list[tuple[float, int]]:
    """``(receipt epoch ms, messages)`` of every pulled batch, in time order."""
    out = [(t, n) for c in consumers for t, n in zip(c.batch_ms, c.batch_n, strict=True)]
    out.sort()
    return out


def start_consumers(
    broker: BrokerAdapter, group: str, topic: str, args: argparse.Namespace, stop: threading.Event
) -> list[ConsumerThread]:
    """Start ``--consumers`` members of ``group`` on ``topic``, each on its own thread."""
    threads = [
        ConsumerThread(
            broker.consumer(group, [topic], max_inflight=args.max_inflight),
            stop,
            args.pull_max,
            args.pull_wait_ms,
            ack_each=args.ack_each,
        )
        for _ in range(args.consumers)
    ]
    for t in threads:
        t.start()
    return threads


def stop_consumers(threads: Sequence[ConsumerThread], stop: threading.Event) -> None:
    """Stop, join and close the consumers; re-raise a consumer's error."""
    stop.set()
    for t in threads:
        t.join(timeout=30)
        t.consumer.close()
    for t in threads:
        if t.error is not None:
            raise RuntimeError(f"consumer failed: {t.error!r}") from t.error


def bookkeeping_bytes(
    accepted: set[str], phase: SendPhase, consumers: Sequence[ConsumerThread]
) -> int:
    """Approximate bytes this script holds for accounting (ids, lateness, receipts)."""
    total = sys.getsizeof(accepted) + sum(sys.getsizeof(s) for s in accepted)
    total += sum(sys.getsizeof(ids) for ids in phase.ids)
    for c in consumers:
        total += sys.getsizeof(c.ids) + sum(sys.getsizeof(s) for s in c.ids)
        total += sum(sys.getsizeof(a) for a in (c.lateness, c.batch_ms, c.batch_n))
    return total
