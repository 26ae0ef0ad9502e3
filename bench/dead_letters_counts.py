"""Dead letters and pending counts with a million pending messages (issue 17's dashboard).

Per broker (``--brokers``, default every one; each fresh: a temp directory, a server
child or a ``redis-server`` child, see :func:`bench.runtime_calls.broker_url`):

1. **fill**: ``--pending`` messages (default 1,000,000; ``--memory-pending`` for
   ``memory://``, default 300,000: it holds Python objects) due uniformly from 1 min
   to 8 days ahead on two topics (``bench.dl.a`` 3 of 4, ``bench.dl.b``), in batches
   of 5,000; the due times are kept here to count the truth.
2. **count_pending**: for ~``--seconds`` each, the overview histogram (now, +1 h,
   +1 d, +1 w), 24 hourly buckets, 168 hourly buckets of the week, and the overview
   of one topic: latency P50/P99/max (ms), whether the answer said exact, and the
   largest relative error of a bucket against the true count (buckets of >= 100);
   and the P50 CPU time of the calling thread (for the local brokers, the call's own
   work whatever the machine's load).
3. **dead letters**: ``--dead`` messages (default 5,000) due now are pulled and
   dead-lettered; then ``dead_letters`` pages of 100 are read first to last (latency
   of a page), ``requeue_dead(limit=1000)`` is called until 0 (dead letters/s; the
   requeued ones are pulled and dead-lettered again), and ``purge_dead(limit=1000)``
   until 0 (dead letters/s).

The load average is printed before and after each broker; other work on the machine
shows in the figures.

Run from the project root::

    .venv/bin/python bench/dead_letters_counts.py
    .venv/bin/python bench/dead_letters_counts.py --brokers embedded --pending 200000
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import itertools

from bench.runtime_calls import BROKERS, broker_url
from bench.stats import format_percentiles, load_average, percentiles, print_block
from broker_adapter import open_broker
from broker_adapter.base import BrokerAdapter
from broker_adapter.message import Message
from broker_adapter.results import PendingCounts

TOPICS = ("bench.dl.a", "bench.dl.b")
DEAD_TOPIC = "bench.dl.dead"
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def now_ms() -> int:
    return int(time.time() * 1000)


def fill(broker: BrokerAdapter, n: int, base: int) -> dict[str | None, list[int]]:
    """``n`` messages due 1 min - 8 d after ``base``; their sorted due times (all, by topic)."""
    rng = random.Random(17)
    dues: dict[str | None, list[int]] = {None: [], TOPICS[0]: [], TOPICS[1]: []}
    start = time.perf_counter()
    for first in range(0, n, 5_000):
        batch = []
        for i in range(first, min(n, first + 5_000)):
            due = base + 60_000 + rng.randrange(8 * DAY_MS)
            topic = TOPICS[1] if i % 4 == 3 else TOPICS[0]
            batch.append(Message(topic, b"{}", deliver_at_ms=due))
            dues[None].append(due)
            dues[topic].append(due)
        broker.send_batch(batch)
    took = time.perf_counter() - start
    print(f"  fill: {n:,} pending in {took:.1f} s ({n / took:,.0f}/s)")
    for values in dues.values():
        values.sort()
    return dues


def truth(dues: list[int], edges: Sequence[int]) -> list[int]:
    return [
        bisect.bisect_left(dues, hi) - bisect.bisect_left(dues, lo)
        for lo, hi in itertools.pairwise(edges)
    ]


def worst_error(got: PendingCounts, want: list[int]) -> str:
    errors = [abs(g - w) / w for g, w in zip(got.counts, want, strict=True) if w >= 100]
    return f"{max(errors, default=0.0) * 100:.1f} %"


def timed(
    call: Callable[[], PendingCounts], seconds: float
) -> tuple[list[float], list[float], PendingCounts]:
    """Latencies and CPU times of this thread (ms) of ``call`` repeated for ~``seconds``
    (at least 5 times), and an answer. The CPU time is the call's own work for a local
    broker (load on the machine does not inflate it); for a network broker, the client's."""
    times: list[float] = []
    cpu: list[float] = []
    answer = call()
    stop = time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < stop:
        t, c = time.perf_counter(), time.thread_time()
        answer = call()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
    return times, cpu, answer


def bench_counts(
    broker: BrokerAdapter, dues: dict[str | None, list[int]], base: int, seconds: float
) -> None:
    cases: list[tuple[str, list[int], str | None]] = [
        (
            "overview (1 h / 1 d / 1 w)",
            [base, base + HOUR_MS, base + DAY_MS, base + 7 * DAY_MS],
            None,
        ),
        ("24 hourly buckets", [base + h * HOUR_MS for h in range(25)], None),
        ("168 hourly buckets", [base + h * HOUR_MS for h in range(169)], None),
        (
            "overview, one topic",
            [base, base + HOUR_MS, base + DAY_MS, base + 7 * DAY_MS],
            TOPICS[0],
        ),
    ]
    rows = []
    for label, edges, topic in cases:
        times, cpu, answer = timed(partial(broker.count_pending, edges, topic=topic), seconds)
        pct = percentiles(times, (50, 99, 100))
        cpu_p50 = percentiles(cpu, (50,))["p50"] or 0.0
        want = truth(dues[topic], edges)
        rows.append(
            (
                label,
                (
                    f"{format_percentiles(pct)} ms (CPU P50 {cpu_p50:.1f} ms)  "
                    f"exact={answer.exact}  worst bucket error "
                    f"{worst_error(answer, want)}  (total {answer.total:,} of {sum(want):,})"
                ),
            )
        )
    print_block("  count_pending (latency P50/P99/max)", rows)


def bench_dead(broker: BrokerAdapter, n: int) -> None:
    consumer = broker.consumer("bench-dl", [DEAD_TOPIC], max_inflight=10_000)

    def kill_all(count: int) -> None:
        done = 0
        while done < count:
            for m in consumer.pull(max_messages=500, wait_ms=1000):
                consumer.dead_letter(m, "bench: no such job")
                done += 1

    for first in range(0, n, 1_000):
        broker.send_batch(
            [Message(DEAD_TOPIC, b"%d" % i) for i in range(first, min(n, first + 1_000))]
        )
    kill_all(n)

    page_ms: list[float] = []
    cursor = None
    seen = 0
    while True:
        t = time.perf_counter()
        page = broker.dead_letters("bench-dl", cursor=cursor, limit=100)
        page_ms.append((time.perf_counter() - t) * 1000)
        seen += len(page.messages)
        cursor = page.cursor
        if cursor is None:
            break

    def settle(call: Callable[[], int]) -> tuple[int, float]:
        total = 0
        start = time.perf_counter()
        while (k := call()) > 0:
            total += k
        return total, time.perf_counter() - start

    requeued, r_took = settle(lambda: broker.requeue_dead("bench-dl", limit=1000))
    kill_all(requeued)
    purged, p_took = settle(lambda: broker.purge_dead("bench-dl", limit=1000))
    consumer.close()
    print_block(
        "  dead letters",
        [
            ("listed", f"{seen:,} of {n:,} in {len(page_ms)} pages of 100"),
            ("page latency", f"{format_percentiles(percentiles(page_ms, (50, 99, 100)))} ms"),
            (
                "requeue_dead",
                f"{requeued:,} in {r_took:.2f} s ({requeued / max(r_took, 1e-9):,.0f}/s)",
            ),
            ("purge_dead", f"{purged:,} in {p_took:.2f} s ({purged / max(p_took, 1e-9):,.0f}/s)"),
        ],
    )


def run(kind: str, args: argparse.Namespace) -> None:
    n = args.memory_pending if kind == "memory" else args.pending
    print(f"\n== {kind}: {n:,} pending; load average {load_average()}")
    with broker_url(kind) as url, open_broker(url) as broker:
        base = now_ms()
        dues = fill(broker, n, base)
        bench_counts(broker, dues, base, args.seconds)
        bench_dead(broker, args.dead)
    print(f"  load average after: {load_average()}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated")
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--memory-pending", type=int, default=300_000)
    parser.add_argument("--dead", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=2.0, help="per count case")
    args = parser.parse_args(argv)
    for kind in args.brokers.split(","):
        run(kind.strip(), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
