"""Redis Cluster against one instance, same load, same run, rounds alternated (issue 19 §3).

Each round flushes its Redis, opens a ``RedisBroker`` on it and sends ``rate x
seconds`` messages (body ``--body-size`` B) in batches of ``--batch`` from ``-p``
threads, due uniformly over ``seconds`` starting ``--lead`` s after sending began:
``rate`` fires/s. One consumer thread in the process pulls 256 at a time and acks
each message; lateness is its receipt time minus the due time (ms). The rounds
alternate one instance (``--single-shards`` shards, default 1) and a 3-master
cluster (``--cluster-shards``, default 12; several counts, e.g. ``12,3``, are setups
of their own in every round), all started once by this script on
loopback ports (tests/redis_server.py). Keyless messages on the cluster go to the
master of their due time's slice (``RedisBroker(keyless_slice_ms=)``); ``--slices
8,0`` makes each value its own setup (0: the even spread of before), ``--keyed``
gives every message a key of its own (placed by the key's hash, never by time).

The firing phase runs with the bench's own objects frozen out of the garbage
collector (``gc.freeze()`` after sending, in every setup alike): otherwise one
full collection of this process's ~60k objects, 17-46 ms on this VM, lands in the
firing phase of some rounds and not others and makes their maximum.

Per round it prints lateness P50/P99/P99.9, the batched send rate, and for the
firing phase (end of sending to the last receipt) per redis-server: CPU (user +
system, psutil) per message, script calls (``EVALSHA``, i.e. round trips) and
commands (every ``INFO commandstats`` call, the ones Lua runs included) per
message, and the mean time per script call in Redis. The client process's own CPU
per message is printed beside them: with a fast enough Redis it is the limit. At
the end: cluster/single ratios per round pair and their median, and
``os.getloadavg()`` per round (the machine is shared: compare within one run).

Run from the project root::

    .venv/bin/python bench/redis_cluster_fire.py                  # 3 rounds each, 5k/s, 20 s
    .venv/bin/python bench/redis_cluster_fire.py --rounds 1 --seconds 8
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
from typing import TYPE_CHECKING

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # type: ignore[import-untyped]
import redis

from bench.loadgen import ConsumerThread
from bench.redis_job_start import PassLog
from bench.stats import cpu_seconds, format_percentiles, load_average, num, percentiles, print_block
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker

if TYPE_CHECKING:
    from tests.redis_server import RedisServer

#: Every firing pass of the run, the threads' and the pulls', timed (bench-only).
PASSES = PassLog()
PASSES.instrument()


@dataclass
class Node:
    """One redis-server of a setup: its port and process."""

    port: int
    proc: psutil.Process

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def snapshot(self) -> tuple[float, dict[str, tuple[int, int]]]:
        """CPU seconds so far and ``{command: (calls, usec)}`` from INFO commandstats."""
        c = self.client()
        try:
            stats = c.info("commandstats")
        finally:
            c.close()
        t = self.proc.cpu_times()
        cmds = {
            k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()
        }
        return t.user + t.system, cmds


@dataclass
class Setup:
    """A Redis to run rounds on (one instance or a cluster)."""

    name: str
    url: str
    nodes: list[Node]
    per_master: bool = False  # RedisBroker's default: one firing thread
    slice_ms: int | None = None  # None: RedisBroker's default keyless_slice_ms

    def flush(self) -> None:
        for n in self.nodes:
            c = n.client()
            try:
                c.flushall()
                c.config_resetstat()
            finally:
                c.close()


@dataclass
class Round:
    """The figures of one round."""

    setup: str
    load: str
    send_rate: float
    lat: dict[str, float | None]
    fire_lat: dict[str, float | None]
    got: int
    n: int
    fire_s: float
    cpu_us: list[float] = field(default_factory=list)  # per server, per message
    evalsha: list[float] = field(default_factory=list)  # per server, per message
    commands: list[float] = field(default_factory=list)  # per server, per message
    call_us: list[float] = field(default_factory=list)  # per server, mean per EVALSHA
    client_us: float = 0.0
    send_cpu_us: list[float] = field(default_factory=list)  # per server, per message


def run_round(setup: Setup, args: argparse.Namespace, shards: int, seed: int) -> Round:
    setup.flush()
    PASSES.starts.clear()
    PASSES.ends.clear()
    extra = {} if setup.slice_ms is None else {"keyless_slice_ms": setup.slice_ms}
    broker = RedisBroker.from_url(
        setup.url, shards=shards, fire_per_master=setup.per_master, **extra
    )
    consumer = broker.consumer("bench", ["bench"], max_inflight=10_000)
    stop = threading.Event()
    # One ack per message, as a dispatcher settles each job on its own.
    worker = ConsumerThread(consumer, stop, pull_max=256, wait_ms=100, ack_each=True)
    lateness = worker.lateness
    worker.start()
    n = int(args.rate * args.seconds)
    start = int(time.time() * 1000) + int(args.lead * 1000)
    rng = random.Random(seed)
    span = int(args.seconds * 1000)
    dues = [start + rng.randrange(span) for _ in range(n)]
    body = b"x" * args.body_size
    before = [node.snapshot() for node in setup.nodes]
    step = -(-n // args.producers)

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi, args.batch):
            j = min(i + args.batch, hi)
            if args.keyed:  # each its own key: placed by the key's hash
                batch = [
                    Message("bench", body, key=f"k{seed}.{k}", deliver_at_ms=dues[k])
                    for k in range(i, j)
                ]
            else:
                batch = [Message("bench", body, deliver_at_ms=d) for d in dues[i:j]]
            broker.send_batch(batch)

    threads = [threading.Thread(target=send, args=(i, min(i + step, n))) for i in range(0, n, step)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    send_rate = n / (time.perf_counter() - t0)
    sent = [node.snapshot() for node in setup.nodes]
    gc.collect()
    gc.freeze()  # see the module doc: the bench's own full collections, not the broker's
    c0, f0 = cpu_seconds(), time.perf_counter()
    deadline = max(dues) / 1000 + args.grace
    while len(lateness) < n and time.time() < deadline:
        time.sleep(0.05)
    fire_s = time.perf_counter() - f0
    client_cpu = cpu_seconds() - c0
    after = [node.snapshot() for node in setup.nodes]
    stop.set()
    worker.join(5)
    broker.close()
    gc.unfreeze()
    fired = [PASSES.fire_time(d) for d in dues]
    fire_lat = percentiles(t * 1000 - d for t, d in zip(fired, dues, strict=True) if t is not None)
    r = Round(
        setup.name,
        load_average(),
        send_rate,
        percentiles(lateness),
        fire_lat,
        len(lateness),
        n,
        fire_s,
    )
    got = max(len(lateness), 1)
    r.client_us = client_cpu / got * 1e6
    for (cpu_b, _), (cpu_s, cmd_s), (cpu_a, cmd_a) in zip(before, sent, after, strict=True):
        r.send_cpu_us.append((cpu_s - cpu_b) / n * 1e6)
        r.cpu_us.append((cpu_a - cpu_s) / got * 1e6)
        calls = {k: v[0] - cmd_s.get(k, (0, 0))[0] for k, v in cmd_a.items()}
        ev = calls.get("evalsha", 0)
        ev_us = cmd_a.get("evalsha", (0, 0))[1] - cmd_s.get("evalsha", (0, 0))[1]
        r.evalsha.append(ev / got)
        r.commands.append(sum(v for k, v in calls.items() if k != "info") / got)
        r.call_us.append(ev_us / ev if ev else 0.0)
    return r


def show(r: Round, args: argparse.Namespace) -> None:
    def each(values: Sequence[float], fmt: str) -> str:
        return " / ".join(fmt.format(v) for v in values)

    print_block(
        f"redis_cluster_fire: {r.setup}",
        [
            ("load", r.load),
            ("messages", f"{num(r.n)} at ~{num(args.rate)} fires/s, received {num(r.got)}"),
            (
                "send batched",
                f"{num(r.send_rate)} msgs/s (batch {args.batch}, {args.producers} thr)",
            ),
            ("lateness ms", format_percentiles(r.lat)),
            ("fire pass end - due", format_percentiles(r.fire_lat)),
            (
                "server CPU/msg",
                f"{each(r.cpu_us, '{:.1f}')} us firing; send {each(r.send_cpu_us, '{:.1f}')} us",
            ),
            ("EVALSHA/msg", each(r.evalsha, "{:.3f}")),
            ("commands/msg", each(r.commands, "{:.1f}")),
            ("us per EVALSHA", each(r.call_us, "{:.0f}")),
            ("client CPU/msg", f"{r.client_us:.1f} us (this process, firing phase)"),
        ],
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary(singles: list[Round], clusters: list[Round], title: str, keyed: bool) -> None:
    rows: list[tuple[str, str]] = []
    for key in ("p50", "p99", "p99.9", "send"):
        per: list[float] = []
        for s, c in zip(singles, clusters, strict=True):
            x = ratio(c.send_rate, s.send_rate) if key == "send" else ratio(c.lat[key], s.lat[key])
            if x is not None:
                per.append(x)
        text = " ".join(f"{x:.2f}" for x in per)
        med = f"median {statistics.median(per):.2f}x" if per else "-"
        rows.append((f"{key} cluster/single", f"{text}  ({med})"))
    rows.append(("keys", "a key per message" if keyed else "keyless"))
    for name, rounds in (("single", singles), ("cluster", clusters)):
        cpu = statistics.median(max(r.cpu_us) for r in rounds)
        total = statistics.median(sum(r.cpu_us) for r in rounds)
        client = statistics.median(r.client_us for r in rounds)
        rows.append(
            (
                f"{name} CPU/msg",
                f"busiest server {cpu:.1f} us, all servers {total:.1f} us, client {client:.1f} us",
            )
        )
    # On paper: a master serves 1/M of the messages (shards spread evenly), so its CPU per
    # message it serves is its CPU per message of the run times M; it saturates at
    # 1e6 / that per second, M masters at M times it, unless the client runs out first.
    masters = len(clusters[0].cpu_us)
    own = statistics.median(max(r.cpu_us) for r in clusters) * masters
    client = statistics.median(r.client_us for r in clusters)
    one = statistics.median(max(r.cpu_us) for r in singles)
    rows.append(("master CPU/own msg", f"{own:.1f} us (one instance: {one:.1f} us)"))
    limits = ", ".join(f"{m}: {num(m * 1e6 / own)}" for m in (1, 3, 6, 12))
    rows.append(("max fires/s Redis", f"by masters {limits}"))
    rows.append(("max fires/s client", f"{num(1e6 / client)} per core a client process gets"))
    print_block(f"redis_cluster_fire: {title} / one instance (per round pair)", rows)


def one_master_cluster(workdir: Path) -> RedisServer:
    """A cluster-enabled ``redis-server`` that holds all 16,384 slots itself (``redis-cli
    --cluster create`` wants 3 masters at least), once it says ``cluster_state:ok``."""
    from tests.redis_server import RedisServer

    node = RedisServer(workdir, cluster=True).start()
    c = redis.Redis(host="127.0.0.1", port=node.port)
    try:
        c.cluster("ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 30
        while c.cluster("INFO").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError("the one-master cluster did not become ok")
            time.sleep(0.05)
    finally:
        c.close()
    return node


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of each setup")
    p.add_argument("--rate", type=float, default=5000.0, help="fires/s")
    p.add_argument("--seconds", type=float, default=20.0, help="firing time per round")
    p.add_argument("--lead", type=float, default=4.0, help="s from sending to the first due")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("-p", "--producers", type=int, default=2)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument("--single-shards", type=int, default=1)
    p.add_argument(
        "--per-master",
        action="store_true",
        help="also the first cluster shard count with a firing thread per master",
    )
    p.add_argument(
        "--one-master",
        action="store_true",
        help=(
            "also a cluster of ONE master holding every slot, with the first cluster shard"
            " count: the cluster client and shards without two more processes to schedule"
        ),
    )
    p.add_argument(
        "--keyed",
        action="store_true",
        help="every message with a key of its own (placed by the key's hash, not its due time)",
    )
    p.add_argument(
        "--slices",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help=(
            "keyless_slice_ms values for the cluster, each its own setup of every shard"
            " count (e.g. 8,0: by due time, and the even spread); default: the broker's"
        ),
    )
    p.add_argument(
        "--cluster-shards",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[12],
        help="shard counts on the cluster, each its own setup in every round (e.g. 12,3)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.redis_server import RedisClusterProcs, RedisServer

    with tempfile.TemporaryDirectory(prefix="chronoq-bench-") as tmp:
        server = RedisServer(Path(tmp) / "single").start()
        cluster = RedisClusterProcs(Path(tmp) / "cluster").start()
        servers: list[RedisServer] = []
        try:
            assert server.proc is not None
            single = Setup(
                "one instance", server.url, [Node(server.port, psutil.Process(server.proc.pid))]
            )
            nodes: list[Node] = []
            for node in cluster.nodes:
                assert node.proc is not None
                nodes.append(Node(node.port, psutil.Process(node.proc.pid)))
            slices: list[int | None] = list(args.slices) if args.slices else [None]
            plan = [(single, args.single_shards)] + [
                (
                    Setup(
                        f"3-master cluster, {n} shards"
                        + ("" if sl is None else f", keyless_slice_ms={sl}"),
                        cluster.url,
                        nodes,
                        slice_ms=sl,
                    ),
                    n,
                )
                for n in args.cluster_shards
                for sl in slices
            ]
            if args.one_master:
                alone = one_master_cluster(Path(tmp) / "alone")
                servers.append(alone)
                assert alone.proc is not None
                n = args.cluster_shards[0]
                url = f"redis+cluster://127.0.0.1:{alone.port}"
                lone = Node(alone.port, psutil.Process(alone.proc.pid))
                plan.append((Setup(f"1-master cluster, {n} shards", url, [lone]), n))
            if args.per_master:
                n = args.cluster_shards[0]
                name = f"3-master cluster, {n} shards, a firing thread per master"
                plan.append((Setup(name, cluster.url, nodes, per_master=True), n))
            rounds: dict[str, list[Round]] = {setup.name: [] for setup, _ in plan}
            for i in range(args.rounds):
                for setup, shards in plan:
                    r = run_round(setup, args, shards, seed=i)
                    show(r, args)
                    rounds[setup.name].append(r)
            for setup, _ in plan[1:]:
                summary(rounds[single.name], rounds[setup.name], setup.name, args.keyed)
        finally:
            for extra in servers:
                extra.stop()
            cluster.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
