"""Runtime calls per broker: reschedule/s, find_pending pages/s and a 100,000-key
abort_prefix under a firing load.

For each broker (``--broker embedded|memory|remote|redis|all``, or one ``--url``):

1. **fill**: ``--pending`` messages (default 100,000) due uniformly 1-2 h ahead,
   keyed ``tenant:<t>:order:<i>`` (100 tenants) and tagged ``job<i % 20>``;
2. **reschedule**: ``--reschedules`` calls by id, then as many by key, each to a
   random time in the same hour, one thread;
3. **find_pending**: pages of 100 (``--pages`` each at most) by tag (5 % match),
   by a key prefix (``tenant:7:``, 1 % match; ``tenant:7:order:1000``, one key)
   and by a one-minute time range, each read from the first page to the last,
   again and again for 2 s;
4. **abort_prefix**: ``--abort-keys`` more messages keyed ``bulk:<i>`` (3 h ahead),
   then, while messages fire at ``--fire-rate``/s (default 1,000) into a consumer
   that pulls and acks on its own thread, one ``abort_prefix(topic, "bulk:")``.
   Printed: the call's time and answer, and the fire lateness (receive time minus
   due time, nearest-rank percentiles) of the messages due while the call ran and
   of those due before it (baseline), and the longest pass of this process's
   garbage collector during the call (``memory://`` holds every message as Python
   objects: with ~230,000 of them a full pass takes ~100-170 ms here, whatever the
   call).

``embedded`` is ``rocksdb://TMP?share=0`` in this process; ``memory`` is
``memory://``; ``remote`` starts ``python -m broker_adapter.server`` on a temp
directory and a free 127.0.0.1 port; ``redis`` starts a ``redis-server`` child
on a free 127.0.0.1 port without persistence. The load average is printed
before and after (the machine's other work shows up in the figures).

Run from the project root::

    .venv/bin/python bench/runtime_calls.py                       # embedded
    .venv/bin/python bench/runtime_calls.py --broker all --pending 100000
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.firing_load import FiringLoad
from bench.stats import load_average
from broker_adapter import Message, open_broker
from broker_adapter.base import BrokerAdapter

TOPIC = "bench.runtime"
LOAD_TOPIC = "bench.runtime.load"
HOUR_MS = 3_600_000
BROKERS = ("embedded", "memory", "remote", "redis")


def now_ms() -> int:
    return int(time.time() * 1000)


@contextmanager
def broker_url(kind: str) -> Iterator[str]:
    """The URL of a fresh broker of ``kind`` (a temp directory or a child process)."""
    if kind == "memory":
        yield "memory://"
        return
    tmp = tempfile.mkdtemp(prefix="chronoq-bench-runtime-")
    try:
        if kind == "embedded":
            yield f"rocksdb://{tmp}/data?share=0"
        elif kind == "remote":
            from bench.remote_send import start_server, stop_server

            proc, url = start_server(os.path.join(tmp, "data"))
            try:
                yield url
            finally:
                stop_server(proc)
        elif kind == "redis":
            from bench.async_client import redis_server

            with redis_server() as url:
                yield url
        else:
            raise SystemExit(f"unknown broker {kind!r}: one of {', '.join(BROKERS)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>10,.0f}/s  ({n:,} in {seconds:.2f} s)"


def fill(broker: BrokerAdapter, n: int, base: int) -> list[str]:
    """``n`` keyed, tagged messages due 1-2 h after ``base``; their ids."""
    rand = random.Random(1).randrange
    ids: list[str] = []
    for start in range(0, n, 1_000):
        msgs = [
            Message(
                TOPIC,
                b"x" * 100,
                key=f"tenant:{i % 100}:order:{i}",
                tags=f"job{i % 20}",
                deliver_at_ms=base + HOUR_MS + rand(HOUR_MS),
            )
            for i in range(start, min(start + 1_000, n))
        ]
        ids.extend(r.msg_id for r in broker.send_batch(msgs))
    return ids


def bench_reschedule(broker: BrokerAdapter, ids: list[str], n: int, base: int) -> None:
    rng = random.Random(2)
    picks = [rng.randrange(len(ids)) for _ in range(n)]
    t0 = time.perf_counter()
    for i in picks:
        broker.reschedule(ids[i], deliver_at_ms=base + HOUR_MS + rng.randrange(HOUR_MS))
    by_id = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in picks:
        broker.reschedule(
            key=f"tenant:{i % 100}:order:{i}",
            topic=TOPIC,
            deliver_at_ms=base + HOUR_MS + rng.randrange(HOUR_MS),
        )
    by_key = time.perf_counter() - t0
    print(f"  reschedule by id     {rate(n, by_id)}")
    print(f"  reschedule by key    {rate(n, by_key)}")


def read_all(broker: BrokerAdapter, max_pages: int, **filters: Any) -> tuple[int, int]:
    """Pages and messages of one read of ``find_pending(**filters)`` from the start."""
    pages = found = 0
    cursor = None
    while pages < max_pages:
        page = broker.find_pending(limit=100, cursor=cursor, **filters)
        pages += 1
        found += len(page.messages)
        cursor = page.cursor
        if cursor is None:
            break
    return pages, found


def bench_find(broker: BrokerAdapter, max_pages: int, base: int) -> None:
    minute = base + HOUR_MS + 30 * 60_000
    cases: list[tuple[str, dict[str, Any]]] = [
        ("by tag (5 %)", {"topic": TOPIC, "tag": "job3"}),
        ("by key prefix (1 %)", {"topic": TOPIC, "key_prefix": "tenant:7:"}),
        ("by key prefix (1 key)", {"topic": TOPIC, "key_prefix": "tenant:7:order:1000"}),
        ("by time range (1 min)", {"topic": TOPIC, "start_ms": minute, "end_ms": minute + 60_000}),
    ]
    for label, filters in cases:
        pages = found = reads = 0
        t0 = time.perf_counter()
        while pages < max_pages and (reads == 0 or time.perf_counter() - t0 < 2.0):
            p, f = read_all(broker, max_pages - pages, **filters)
            pages, found, reads = pages + p, found + f, reads + 1
        dt = time.perf_counter() - t0
        per_read = found // reads
        print(
            f"  find {label:<22}{pages / dt:>8,.0f} pages/s  {found / dt:>9,.0f} msgs/s  "
            f"({per_read:,} found per read, {pages:,} pages in {dt:.2f} s)"
        )


class GcPauses:
    """The garbage collector's passes in this process: ``(start ms, ms, generation)``."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, float, int]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            ms = (time.perf_counter() - self._start) * 1000
            self.passes.append((time.time() * 1000 - ms, ms, info["generation"]))

    def longest(self, start_ms: float, end_ms: float) -> str:
        """The longest pass that overlapped ``[start_ms, end_ms]``, in words."""
        inside = [p for p in self.passes if p[0] <= end_ms and p[0] + p[1] >= start_ms]
        if not inside:
            return "none"
        _at, ms, gen = max(inside, key=lambda p: p[1])
        return f"{ms:.1f} ms (generation {gen}; {len(inside)} passes in all)"


def bench_abort_prefix(broker: BrokerAdapter, n: int, fire_rate: int) -> None:
    base = now_ms()
    for start in range(0, n, 1_000):
        broker.send_batch(
            [
                Message(TOPIC, b"x" * 100, key=f"bulk:{i:07d}", deliver_at_ms=base + 3 * HOUR_MS)
                for i in range(start, min(start + 1_000, n))
            ]
        )
    load = FiringLoad(broker, LOAD_TOPIC, "bench-runtime-load", fire_rate, 12_000, ack_each=True)
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    load.sleep_into(4_000)
    a0 = now_ms()
    t0 = time.perf_counter()
    result = broker.abort_prefix(TOPIC, "bulk:")
    took = time.perf_counter() - t0
    a1 = now_ms()
    gc.callbacks.remove(pauses)
    got = load.finish()
    print(
        f"  abort_prefix         {n:,} keys in {took:.2f} s ({n / took:,.0f} keys/s): "
        f"aborted {result.aborted:,}, already delivered {result.already_delivered_count}"
    )
    load.report("the abort", a0, a1)
    print(f"  longest GC pass of this process during the abort: {pauses.longest(a0, a1)}")
    print(f"  load messages       {got:,} of {load.count:,} delivered")


def run(url: str, label: str, args: argparse.Namespace) -> None:
    print(f"== chronoq runtime_calls: {label} ({url}) ==")
    with open_broker(url) as broker:
        base = now_ms()
        t0 = time.perf_counter()
        ids = fill(broker, args.pending, base)
        print(f"  fill (send_batch)    {rate(len(ids), time.perf_counter() - t0)}")
        bench_reschedule(broker, ids, args.reschedules, base)
        bench_find(broker, args.pages, base)
        bench_abort_prefix(broker, args.abort_keys, args.fire_rate)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--url", help="a broker URL (default: a fresh broker per --broker)")
    p.add_argument("--broker", default="embedded", help=f"{'|'.join(BROKERS)}|all")
    p.add_argument("--pending", type=int, default=100_000, help="pending messages to fill")
    p.add_argument("--reschedules", type=int, default=10_000, help="reschedules by id (and key)")
    p.add_argument("--pages", type=int, default=2_000, help="most pages per find case")
    p.add_argument("--abort-keys", type=int, default=100_000, help="keys under one prefix")
    p.add_argument("--fire-rate", type=int, default=1_000, help="background fires per second")
    args = p.parse_args(argv)
    print(f"load average before: {load_average()}")
    if args.url:
        run(args.url, args.url.split(":", 1)[0], args)
    else:
        kinds = BROKERS if args.broker == "all" else (args.broker,)
        for kind in kinds:
            with broker_url(kind) as url:
                run(url, kind, args)
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
