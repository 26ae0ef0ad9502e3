"""RedisBroker against a plain sorted-set poller, same load, same run (issue 7).

Both get N timed messages (body ``--body-size`` B) due uniformly ``--due-from`` to
``--due-to`` s after sending starts, sent by ``-p`` threads in batches of
``--batch``; one in-process worker records lateness (receipt time minus due time,
ms). The systems:

chronoq
    ``RedisBroker`` (``send_batch``; one consumer thread ``pull(256, wait_ms=100)``,
    each message acked after its time is read).
zset
    the hand-rolled baseline: ``ZADD`` of ``"<id>:<body>"`` scored by due time, and a
    poller thread that every 10 ms runs a Lua ``ZRANGEBYSCORE -inf now LIMIT 0 1000``
    + ``ZREM`` claim and hands the items over.
chronoq-cluster (``--cluster``)
    ``RedisBroker`` on a 3-master Redis Cluster this script starts on loopback ports;
    also prints how pending messages spread over the masters (largest / smallest).

Memory per pending message is Redis ``used_memory`` after sending (before the
first due time) minus before, over N (summed over masters on the cluster). Each
system runs on a fresh (flushed) Redis; the script starts its own redis-server on
a free 127.0.0.1 port unless ``--redis URL`` is given (that database is FLUSHED).
The ratios printed at the end are chronoq / zset (lateness: zset / chronoq, so
above 1 means chronoq is better in every ratio).

Run from the project root::

    .venv/bin/python bench/redis_vs_zset.py                     # 75,000 at ~5,000 fires/s
    .venv/bin/python bench/redis_vs_zset.py --cluster -n 100000 --due-to 25
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis

from bench.stats import format_percentiles, num, percentiles, print_block
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis import keys as K

CLAIM = """
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, 1000)
for i = 1, #items, 2 do redis.call('ZREM', KEYS[1], items[i]) end
return items
"""


def used_memory(urls: Sequence[tuple[str, int]]) -> int:
    total = 0
    for host, port in urls:
        c = redis.Redis(host=host, port=port)
        try:
            total += int(c.info("memory")["used_memory"])
        finally:
            c.close()
    return total


def flush(nodes: Sequence[tuple[str, int]]) -> None:
    for host, port in nodes:
        c = redis.Redis(host=host, port=port)
        try:
            c.flushall()
        finally:
            c.close()


def send_threads(n: int, producers: int, send: Callable[[int, int], None]) -> float:
    """Run ``send(start, stop)`` over ``producers`` threads; returns msgs/s."""
    step = -(-n // producers)
    threads = [threading.Thread(target=send, args=(i, min(i + step, n))) for i in range(0, n, step)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return n / (time.perf_counter() - t0)


def plan(args: argparse.Namespace) -> list[int]:
    start = int(time.time() * 1000)
    rng = random.Random(args.seed)
    lo, hi = int(args.due_from * 1000), int(args.due_to * 1000)
    return [start + rng.randrange(lo, hi) for _ in range(args.n)]


def run_chronoq(
    args: argparse.Namespace, url: str, nodes: Sequence[tuple[str, int]]
) -> dict[str, Any]:
    flush(nodes)
    broker = RedisBroker.from_url(url)
    consumer = broker.consumer("bench", ["bench"], max_inflight=10_000)
    lateness: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            got = consumer.pull(256, 100)
            now = time.time() * 1000
            for m in got:
                lateness.append(now - m.deliver_at_ms)
                consumer.ack(m)

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    body = b"x" * args.body_size
    mem0 = used_memory(nodes)
    dues = plan(args)

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi, args.batch):
            broker.send_batch(
                [Message("bench", body, deliver_at_ms=d) for d in dues[i : min(i + args.batch, hi)]]
            )

    rate = send_threads(args.n, args.producers, send)
    mem1 = used_memory(nodes)
    spread = pending_spread(nodes) if len(nodes) > 1 else []
    deadline = max(dues) / 1000 + args.grace
    while len(lateness) < args.n and time.time() < deadline:
        time.sleep(0.05)
    stop.set()
    worker.join(5)
    broker.close()
    return {
        "send": rate,
        "mem": (mem1 - mem0) / args.n,
        "lat": percentiles(lateness),
        "got": len(lateness),
        "spread": spread,
    }


def pending_spread(nodes: Sequence[tuple[str, int]]) -> list[int]:
    counts = []
    for host, port in nodes:
        c = redis.Redis(host=host, port=port)
        try:
            counts.append(sum(int(c.zcard(k)) for k in c.scan_iter(f"{K.DEFAULT_PREFIX}:*due")))
        finally:
            c.close()
    return counts


def run_zset(args: argparse.Namespace, nodes: Sequence[tuple[str, int]]) -> dict[str, Any]:
    flush(nodes)
    host, port = nodes[0]
    client = redis.Redis(host=host, port=port)
    claim = client.register_script(CLAIM)
    lateness: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            items = claim(keys=["zset:due"], args=[int(time.time() * 1000)])
            now = time.time() * 1000
            for i in range(1, len(items), 2):
                lateness.append(now - float(items[i]))
            time.sleep(0.010)

    worker = threading.Thread(target=poll, daemon=True)
    worker.start()
    body = b"x" * args.body_size
    mem0 = used_memory(nodes)
    dues = plan(args)

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi, args.batch):
            client.zadd(
                "zset:due",
                {b"%d:%s" % (j, body): dues[j] for j in range(i, min(i + args.batch, hi))},
            )

    rate = send_threads(args.n, args.producers, send)
    mem1 = used_memory(nodes)
    deadline = max(dues) / 1000 + args.grace
    while len(lateness) < args.n and time.time() < deadline:
        time.sleep(0.05)
    stop.set()
    worker.join(5)
    client.close()
    return {
        "send": rate,
        "mem": (mem1 - mem0) / args.n,
        "lat": percentiles(lateness),
        "got": len(lateness),
        "spread": [],
    }


def report(name: str, url: str, fig: dict[str, Any], args: argparse.Namespace) -> None:
    rows = [
        ("redis", url),
        (
            "messages",
            (
                f"{num(args.n)} due {args.due_from}-{args.due_to} s, "
                f"~{num(args.n / (args.due_to - args.due_from))} fires/s"
            ),
        ),
        (
            "send batched",
            (f"{num(fig['send'])} msgs/s (batch {args.batch}, {args.producers} threads)"),
        ),
        ("lateness ms", format_percentiles(fig["lat"])),
        ("received", f"{num(fig['got'])} of {num(args.n)}"),
        ("Redis memory", f"{fig['mem']:.0f} B per pending message"),
    ]
    if fig["spread"]:
        s = fig["spread"]
        rows.append(("pending/master", f"{s}  largest/smallest {max(s) / max(min(s), 1):.3f}"))
    print_block(f"redis_vs_zset: {name}", rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--redis", help="use this Redis (it is FLUSHED) instead of starting one")
    p.add_argument("--cluster", action="store_true", help="also run on a 3-master cluster")
    p.add_argument("-n", type=int, default=75_000)
    p.add_argument("--due-from", type=float, default=5.0)
    p.add_argument("--due-to", type=float, default=20.0)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("-p", "--producers", type=int, default=2)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.redis_server import RedisClusterProcs, RedisServer

    with tempfile.TemporaryDirectory(prefix="chronoq-bench-") as tmp:
        server = None
        if args.redis:
            url = args.redis
            parsed = redis.Redis.from_url(url).connection_pool.connection_kwargs
            nodes = [(str(parsed.get("host", "127.0.0.1")), int(parsed.get("port", 6379)))]
        else:
            server = RedisServer(__import__("pathlib").Path(tmp) / "single").start()
            url, nodes = server.url, [("127.0.0.1", server.port)]
        try:
            zset = run_zset(args, nodes)
            report("zset poller (ZADD + Lua claim every 10 ms)", url, zset, args)
            chronoq = run_chronoq(args, url, nodes)
            report("chronoq RedisBroker", url, chronoq, args)
        finally:
            if server is not None:
                server.stop()
        ratios = [("send rate", f"{chronoq['send'] / zset['send']:.2f}x (chronoq / zset)")]
        for key in ("p50", "p99", "p99.9"):
            z, c = zset["lat"][key], chronoq["lat"][key]
            if z is not None and c:
                ratios.append((f"lateness {key}", f"{z / c:.2f}x better (zset / chronoq)"))
        ratios.append(("memory/pending", f"{chronoq['mem'] / zset['mem']:.2f}x (chronoq / zset)"))
        if args.cluster:
            procs = RedisClusterProcs(__import__("pathlib").Path(tmp) / "cluster").start()
            try:
                cnodes = [("127.0.0.1", n.port) for n in procs.nodes]
                cl = run_chronoq(args, procs.url, cnodes)
                report("chronoq RedisBroker on a 3-master cluster", procs.url, cl, args)
            finally:
                procs.stop()
            ratios.append(("cluster send", f"{cl['send'] / chronoq['send']:.2f}x one instance"))
            for key in ("p50", "p99", "p99.9"):
                one, many = chronoq["lat"][key], cl["lat"][key]
                if one is not None and many is not None:
                    text = f"{many:.2f} ms vs {one:.2f} ms on one instance"
                    ratios.append((f"cluster {key}", text))
        print_block("redis_vs_zset: ratios", ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
