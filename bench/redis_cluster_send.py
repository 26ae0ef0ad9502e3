"""Batched sends only: one instance against a 3-master Redis Cluster, rounds alternated
(issue 19 §3: "batched sends >= 1.0x one instance").

``bench/redis_cluster_fire.py`` times its send phase too, but that phase is 50 batches
(~0.4 s) beside a firing thread and a consumer: its send ratio moved 0.67-1.13x
between the rounds of one run. Here each round sends ``--messages`` keyless messages
(body ``--body-size`` B, due uniformly over ``--span`` s starting 60 s ahead, so
nothing fires) in batches of ``--batch`` from ``-p`` threads, on a broker as the
fire bench opens it (firing thread on; no consumer). Per round it prints the rate
(wall), the client process's CPU per message, each producer thread's own CPU per
message (its share of the work under the GIL) against its wall time per message,
each redis-server's CPU per message, and the machine's run queue (``procs_running``
of ``/proc/stat`` less the sampler itself, every 5 ms: above 2 the 2 cores are
oversubscribed).
``--keyed`` gives every message a key of its own; ``--cluster-shards 12,3`` makes
each count a setup of its own.

Run from the project root::

    .venv/bin/python bench/redis_cluster_send.py --rounds 4
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # type: ignore[import-untyped]
import redis

from bench.stats import cpu_seconds, load_average, num, print_block
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker


@dataclass
class Setup:
    """A Redis to send to: its URL, shard count and server processes."""

    name: str
    url: str
    shards: int
    ports: list[int]
    procs: list[psutil.Process]

    def flush(self) -> None:
        for port in self.ports:
            c = redis.Redis(host="127.0.0.1", port=port)
            try:
                c.flushall()
            finally:
                c.close()

    def cpu(self) -> list[float]:
        out = []
        for p in self.procs:
            t = p.cpu_times()
            out.append(t.user + t.system)
        return out


@dataclass
class Round:
    """The figures of one round."""

    rate: float
    client_us: float
    thread_cpu_us: float
    thread_wall_us: float
    server_us: list[float]
    runq: float
    load: str
    extra: dict[str, float] = field(default_factory=dict)


def run_queue() -> int:
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1]) - 1  # not the sampler reading it
    return 0


def run_round(setup: Setup, args: argparse.Namespace, seed: int) -> Round:
    setup.flush()
    broker = RedisBroker.from_url(setup.url, shards=setup.shards)
    n = args.messages
    start = int(time.time() * 1000) + 60_000
    rng = random.Random(seed)
    span = int(args.span * 1000)
    body = b"x" * args.body_size
    if args.keyed:
        msgs = [
            Message("bench", body, key=f"k{seed}.{k}", deliver_at_ms=start + rng.randrange(span))
            for k in range(n)
        ]
    else:
        msgs = [Message("bench", body, deliver_at_ms=start + rng.randrange(span)) for _ in range(n)]
    batches = [msgs[i : i + args.batch] for i in range(0, n, args.batch)]
    gc.collect()
    gc.freeze()
    per_thread: list[tuple[float, float]] = []
    lock = threading.Lock()

    def send(mine: list[list[Message]]) -> None:
        c0, w0 = time.thread_time(), time.perf_counter()
        for b in mine:
            broker.send_batch(b)
        with lock:
            per_thread.append((time.thread_time() - c0, time.perf_counter() - w0))

    threads = [
        threading.Thread(target=send, args=(batches[i :: args.producers],))
        for i in range(args.producers)
    ]
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            samples.append(run_queue())

    sampler = threading.Thread(target=sample, daemon=True)
    s0 = setup.cpu()
    c0, t0 = cpu_seconds(), time.perf_counter()
    sampler.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    client = cpu_seconds() - c0
    s1 = setup.cpu()
    done.set()
    sampler.join()
    broker.close()
    gc.unfreeze()
    return Round(
        n / wall,
        client / n * 1e6,
        sum(c for c, _w in per_thread) / n * 1e6,
        sum(w for _c, w in per_thread) / n * 1e6,
        [(b - a) / n * 1e6 for a, b in zip(s0, s1, strict=True)],
        statistics.mean(samples) if samples else 0.0,
        load_average(),
    )


def show(name: str, r: Round) -> None:
    print_block(
        f"redis_cluster_send: {name}",
        [
            ("load", r.load),
            ("send batched", f"{num(r.rate)} msgs/s"),
            ("client CPU/msg", f"{r.client_us:.2f} us (process, every thread)"),
            (
                "producers/msg",
                f"CPU {r.thread_cpu_us:.2f} us, wall {r.thread_wall_us:.2f} us (sum of threads)",
            ),
            ("server CPU/msg", " / ".join(f"{v:.2f}" for v in r.server_us) + " us"),
            ("run queue", f"{r.runq:.2f} runnable on average (sampled every 5 ms)"),
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("-p", "--producers", type=int, default=2)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument(
        "--span",
        type=float,
        default=None,
        help="s the dues spread over (default: messages / 5,000, the fire bench's density)",
    )
    p.add_argument(
        "--switch-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval for the run (diagnosis: GIL hand-offs between producers)",
    )
    p.add_argument("--keyed", action="store_true")
    p.add_argument("--cluster-shards", type=lambda v: [int(x) for x in v.split(",")], default=[12])
    args = p.parse_args(argv)
    if args.span is None:
        args.span = args.messages / 5000
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1000)
    from tests.redis_server import RedisClusterProcs, RedisServer

    with tempfile.TemporaryDirectory(prefix="chronoq-bench-") as tmp:
        server = RedisServer(Path(tmp) / "single").start()
        cluster = RedisClusterProcs(Path(tmp) / "cluster").start()
        try:
            assert server.proc is not None
            setups = [
                Setup(
                    "one instance",
                    server.url,
                    1,
                    [server.port],
                    [psutil.Process(server.proc.pid)],
                )
            ]
            for shards in args.cluster_shards:
                procs = [psutil.Process(n.proc.pid) for n in cluster.nodes if n.proc is not None]
                setups.append(
                    Setup(
                        f"3-master cluster, {shards} shards",
                        cluster.url,
                        shards,
                        [n.port for n in cluster.nodes],
                        procs,
                    )
                )
            rounds: dict[str, list[Round]] = {s.name: [] for s in setups}
            for i in range(args.rounds):
                for s in setups:
                    r = run_round(s, args, seed=i)
                    show(s.name, r)
                    rounds[s.name].append(r)
            one = rounds[setups[0].name]
            for s in setups[1:]:
                mine = rounds[s.name]
                per = [c.rate / o.rate for c, o in zip(mine, one, strict=True)]
                rows = [
                    (
                        "send cluster/single",
                        " ".join(f"{x:.2f}" for x in per)
                        + f"  (median {statistics.median(per):.2f}x)",
                    )
                ]
                for label, rs in (("single", one), ("cluster", mine)):
                    client = statistics.median(r.client_us for r in rs)
                    producers = statistics.median(r.thread_cpu_us for r in rs)
                    servers = statistics.median(sum(r.server_us) for r in rs)
                    runq = statistics.median(r.runq for r in rs)
                    text = f"client {client:.2f} us, producers {producers:.2f}, "
                    text += f"all servers {servers:.2f}, run queue {runq:.2f}"
                    rows.append((f"{label} CPU/msg", text))
                print_block(f"redis_cluster_send: {s.name} / one instance", rows)
        finally:
            cluster.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
