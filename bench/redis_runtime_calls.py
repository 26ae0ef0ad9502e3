"""The runtime calls on Redis: one instance and a 3-master Redis Cluster (issue 15).

Per target (``--target single|cluster|both``; each on a fresh ``redis-server`` child,
or a cluster of three, on free 127.0.0.1 ports without persistence):

1. **fill**: ``--pending`` messages (default 100,000) due uniformly 1-2 h ahead, keyed
   ``tenant:<i % 100>:order:<i>`` and tagged ``job<i % 20>``, in batches of 1,000:
   keyed sends/s and Redis memory per pending message (``used_memory``, summed over
   the masters);
2. **reschedule**: ``--reschedules`` calls by id then as many by key, each to a random
   time in the same hour, from one thread and from 4 threads: calls/s;
3. **find_pending**: pages of 100 read from the first to the last (at most ``--pages``
   per read), again and again for ~2 s per filter: everything, by tag (5 % match),
   by a narrow key prefix (``tenant:7:``, 1 %) and a one-minute due range: pages/s
   and messages/s;
4. **abort_prefix**: ``--abort-keys`` more messages keyed ``bulk:<i>`` (3 h ahead);
   messages due at ``--fire-rate``/s over the next seconds are fired into a consumer
   that pulls and acks on its own thread; after 2 s, one ``abort_prefix(topic,
   "bulk:")``. Printed: its time and answer, and the fire lateness (receive time
   minus due time, nearest-rank percentiles, ms) of the messages due while it ran
   and of those due in the 2 s before (baseline).

A firing ``RedisBroker`` runs in this process (it fires the load of step 4); the calls
are made by a second one (``fire=False``), as an app's client would. The load average
is printed before and after each target: the machine's other work shows up in the
figures.

Run from the project root::

    .venv/bin/python bench/redis_runtime_calls.py                    # both targets
    .venv/bin/python bench/redis_runtime_calls.py --target single --pending 20000
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis

from bench.stats import format_percentiles, num, percentiles, print_block
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker

TOPIC = "bench.rt"
LOAD_TOPIC = "bench.rt.load"
HOUR_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


@contextmanager
def target(kind: str, workdir: Path) -> Iterator[tuple[str, list[int]]]:
    """A fresh Redis of ``kind``: its broker URL and its masters' ports."""
    from tests.redis_server import RedisClusterProcs, RedisServer

    if kind == "single":
        server = RedisServer(workdir / "single").start()
        try:
            yield server.url, [server.port]
        finally:
            server.stop()
    else:
        procs = RedisClusterProcs(workdir / "cluster", masters=3).start()
        try:
            yield procs.url, [n.port for n in procs.nodes]
        finally:
            procs.stop()


def used_memory(ports: Sequence[int]) -> int:
    total = 0
    for port in ports:
        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            total += int(client.info("memory")["used_memory"])
        finally:
            client.close()
    return total


def timed(n: int, fn: Callable[[], None]) -> str:
    t = time.perf_counter()
    fn()
    return f"{num(n / (time.perf_counter() - t))}/s"


def fill(client: RedisBroker, ports: Sequence[int], n: int) -> tuple[list[str], list[str]]:
    base = now_ms() + HOUR_MS
    before = used_memory(ports)
    ids: list[str] = []

    def send() -> None:
        for j in range(0, n, 1_000):
            batch = [
                Message(
                    TOPIC,
                    b"x" * 100,
                    key=f"tenant:{i % 100}:order:{i}",
                    tags=f"job{i % 20}",
                    deliver_at_ms=base + random.randrange(HOUR_MS),
                )
                for i in range(j, min(n, j + 1_000))
            ]
            ids.extend(r.msg_id for r in client.send_batch(batch))

    rate = timed(n, send)
    per = (used_memory(ports) - before) / max(n, 1)
    print_block(
        f"fill: {num(n)} keyed messages",
        [("send_batch(1,000)", rate), ("Redis memory per message", f"{per:.0f} B")],
    )
    return ids, [f"tenant:{i % 100}:order:{i}" for i in range(n)]


def bench_reschedule(client: RedisBroker, ids: list[str], keys: list[str], n: int) -> None:
    base = now_ms() + HOUR_MS
    rng = random.Random(1)

    def by_id(some: Sequence[str]) -> Callable[[], None]:
        def run() -> None:
            for i in some:
                client.reschedule(i, deliver_at_ms=base + rng.randrange(HOUR_MS))

        return run

    def by_key(some: Sequence[str]) -> Callable[[], None]:
        def run() -> None:
            for k in some:
                client.reschedule(key=k, topic=TOPIC, deliver_at_ms=base + rng.randrange(HOUR_MS))

        return run

    def threaded(fns: list[Callable[[], None]]) -> Callable[[], None]:
        def run() -> None:
            threads = [threading.Thread(target=f) for f in fns]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        return run

    some_ids, some_keys = rng.sample(ids, n), rng.sample(keys, n)
    quarter = max(1, n // 4)
    rows = [
        ("by id, 1 thread", timed(n, by_id(some_ids))),
        ("by key, 1 thread", timed(n, by_key(some_keys))),
        (
            "by id, 4 threads",
            timed(n, threaded([by_id(some_ids[i : i + quarter]) for i in range(0, n, quarter)])),
        ),
    ]
    print_block(f"reschedule: {num(n)} calls each", rows)


def bench_find(client: RedisBroker, max_pages: int) -> None:
    start = now_ms() + HOUR_MS + 30 * 60_000
    filters: list[tuple[str, dict[str, Any]]] = [
        ("everything", {"topic": TOPIC}),
        ("by tag (5 %)", {"tag": "job7"}),
        ("by key prefix (1 %)", {"topic": TOPIC, "key_prefix": "tenant:7:"}),
        ("one-minute range", {"topic": TOPIC, "start_ms": start, "end_ms": start + 60_000}),
    ]
    rows = []
    for label, f in filters:
        pages = found = 0
        t = time.perf_counter()
        while time.perf_counter() - t < 2.0:
            cursor = None
            for _ in range(max_pages):
                page = client.find_pending(limit=100, cursor=cursor, **f)
                pages += 1
                found += len(page.messages)
                cursor = page.cursor
                if cursor is None:
                    break
        el = time.perf_counter() - t
        rows.append((label, f"{num(pages / el)} pages/s, {num(found / el)} messages/s"))
    print_block("find_pending: pages of 100", rows)


def bench_abort(client: RedisBroker, firing: RedisBroker, n: int, fire_rate: int) -> None:
    for j in range(0, n, 1_000):
        client.send_batch(
            [
                Message(TOPIC, b"b", key=f"bulk:{i}", delay_ms=3 * HOUR_MS)
                for i in range(j, min(n, j + 1_000))
            ]
        )
    consumer = firing.consumer("bench", [LOAD_TOPIC])
    seen: list[tuple[int, float]] = []  # (due, lateness ms)
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            got = consumer.pull(256, wait_ms=100)
            t = time.time() * 1000
            for m in got:
                seen.append((m.deliver_at_ms, t - m.deliver_at_ms))
                consumer.ack(m)

    window_s = 60
    first = now_ms() + 500
    for j in range(0, fire_rate * window_s, 1_000):
        client.send_batch(
            [
                Message(LOAD_TOPIC, b"l", deliver_at_ms=first + i * 1000 // fire_rate)
                for i in range(j, j + 1_000)
            ]
        )
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(max(0.0, (first - now_ms()) / 1000) + 2.0)
    began = now_ms()
    t = time.perf_counter()
    result = client.abort_prefix(TOPIC, "bulk:")
    took = time.perf_counter() - t
    ended = now_ms()
    time.sleep(0.5)
    stop.set()
    reader.join(5)
    consumer.close()
    during = [late for due, late in seen if began <= due <= ended]
    before = [late for due, late in seen if began - 2_000 <= due < began]
    print_block(
        f"abort_prefix of {num(n)} keys while {num(fire_rate)}/s fire",
        [
            ("time", f"{took:.2f} s ({num(n / took)} keys/s)"),
            ("answer", f"aborted {num(result.aborted)}, fired {result.already_delivered_count}"),
            ("lateness during", format_percentiles(percentiles(during))),
            ("lateness before", format_percentiles(percentiles(before))),
        ],
    )


def run(kind: str, args: argparse.Namespace) -> None:
    print(f"#### {kind} (load average {os.getloadavg()[0]:.2f})\n", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        target(kind, Path(tmp)) as (url, ports),
        RedisBroker.from_url(url) as firing,
        RedisBroker.from_url(url, fire=False) as client,
    ):
        ids, keys = fill(client, ports, args.pending)
        bench_reschedule(client, ids, keys, args.reschedules)
        bench_find(client, args.pages)
        bench_abort(client, firing, args.abort_keys, args.fire_rate)
    print(f"(load average after: {os.getloadavg()[0]:.2f})\n", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=("single", "cluster", "both"), default="both")
    p.add_argument("--pending", type=int, default=100_000)
    p.add_argument("--reschedules", type=int, default=5_000)
    p.add_argument("--pages", type=int, default=200)
    p.add_argument("--abort-keys", type=int, default=100_000)
    p.add_argument("--fire-rate", type=int, default=1_000)
    args = p.parse_args(argv)
    for kind in ("single", "cluster") if args.target == "both" else (args.target,):
        run(kind, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
