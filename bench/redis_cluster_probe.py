"""Where the Redis Cluster bench's lateness stalls go (issue 19 §3): who had the CPUs.

Runs the rounds of ``bench/redis_cluster_fire.py`` (same options, same setups) while a
sampler PROCESS (not a thread: it must not take the client's GIL) reads, every
``--every-ms`` (default 2), each redis-server's main thread and the client's threads'
``/proc/.../schedstat`` (ns on a CPU, ns waiting in the run queue), ``/proc/stat``
(steal ticks) and ``/proc/loadavg`` (runnable tasks now). Every redis-server also
logs its own latency events (``latency-monitor-threshold 1``). (``/proc/stat``'s
busy ticks are not used: on this VM they came to less than the sampled tasks' own
run time.)

Per round it prints the run-queue wait per message of each redis-server and of the
client's threads, the steal time, the ``LATENCY LATEST`` events, and for the
``--worst`` consumer receipts later than ``--stall-ms`` the window from the due
time to the receipt: each sampled task's run and run-queue wait in it, their sums
against the CPU time the machine had (CPUs x window), and the most runnable tasks
sampled. A stall where a redis-server or the client waited in the run queue is the
machine's scheduling; one where they neither ran nor waited much is a wait in the
code (a lock, a sleep, news that did not come).

Run from the project root::

    .venv/bin/python bench/redis_cluster_probe.py --rounds 1 --seconds 10
    .venv/bin/python bench/redis_cluster_probe.py --rounds 2 --keyed --stall-ms 6
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import redis_cluster_fire as fire
from bench.loadgen import ConsumerThread
from bench.stats import print_block

#: CPUs of the machine (the time it had in a window: CPUS x the window).
CPUS = os.cpu_count() or 1
#: The client's threads whose schedstat is sampled, by name prefix.
CLIENT_THREADS = ("bench-consumer", "chronoq-redis-firer", "chronoq-redis-acks")


def sample(out: str, every_s: float, names: list[str], paths: list[str]) -> None:
    """The sampler process: one line per sample until stdin closes."""
    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    with open(out, "w") as f:
        f.write(" ".join(names) + "\n")
        while not stop.is_set():
            t = time.time()
            with open("/proc/stat") as s:
                cpu = s.readline().split()
            busy = sum(int(x) for x in cpu[1:4]) + sum(int(x) for x in cpu[6:9])
            with open("/proc/loadavg") as s:
                runnable = s.read().split()[3].split("/")[0]
            vals = []
            for p in paths:
                try:
                    with open(p) as s:
                        a = s.read().split()
                    vals.append(f"{a[0]},{a[1]}")
                except OSError:
                    vals.append("0,0")
            f.write(f"{t:.4f} {busy} {cpu[8]} {runnable} {' '.join(vals)}\n")
            time.sleep(every_s)


class Sampler:
    """The sampler process of one round and what it recorded."""

    def __init__(self, every_ms: float, named: dict[str, str]) -> None:
        self.path = f"/tmp/chronoq-probe-{os.getpid()}.txt"
        self.names = list(named)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--sample", self.path, str(every_ms / 1000)]
            + [f"{n}={p}" for n, p in named.items()],
            stdin=subprocess.PIPE,
        )

    def stop(self) -> list[tuple[float, int, int, int, list[tuple[int, int]]]]:
        """Stop it; each sample as ``(t, busy ticks, steal ticks, runnable, [(run, wait)])``."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        rows = []
        with open(self.path) as f:
            f.readline()
            for line in f:
                t, busy, steal, runnable, *vals = line.split()
                pairs = [(int(v.split(",")[0]), int(v.split(",")[1])) for v in vals]
                rows.append((float(t), int(busy), int(steal), int(runnable), pairs))
        os.unlink(self.path)
        return rows


class ProbedConsumer(ConsumerThread):
    """The bench's consumer thread; starting it starts the round's sampler (the broker
    and its threads exist by then)."""

    current: ProbedConsumer | None = None
    setup: fire.Setup | None = None
    every_ms = 2.0

    def start(self) -> None:
        super().start()
        ProbedConsumer.current = self
        me = os.getpid()
        named: dict[str, str] = {}
        assert ProbedConsumer.setup is not None
        for node in ProbedConsumer.setup.nodes:
            named[f"redis:{node.port}"] = f"/proc/{node.proc.pid}/schedstat"
        for t in threading.enumerate():
            if t.name.startswith(CLIENT_THREADS) and t.native_id is not None:
                named[t.name.removeprefix("chronoq-redis-")] = (
                    f"/proc/{me}/task/{t.native_id}/schedstat"
                )
        self.sampler = Sampler(ProbedConsumer.every_ms, named)


def latency_events(setup: fire.Setup, reset: bool) -> list[str]:
    out = []
    for node in setup.nodes:
        c = node.client()
        try:
            if reset:
                c.config_set("latency-monitor-threshold", 1)
                c.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
                continue
            for ev in c.execute_command("LATENCY", "LATEST"):  # type: ignore[no-untyped-call]
                name = ev[0].decode() if isinstance(ev[0], bytes) else ev[0]
                out.append(f"{node.port} {name} latest {ev[2]} ms, max {ev[3]} ms")
        finally:
            c.close()
    return out


def stalls(
    w: ConsumerThread, rows: list[Any], names: list[str], stall_ms: float, worst: int
) -> list[tuple[str, str]]:
    """The worst late receipts and, in each one's window, every sampled task's run and
    run-queue wait (ms) and the most runnable tasks."""
    late: list[tuple[float, float]] = []  # (lateness, receipt ms)
    i = 0
    for at, n in zip(w.batch_ms, w.batch_n, strict=True):
        top = max(w.lateness[i : i + n])
        i += n
        if top >= stall_ms:
            late.append((top, at))
    late.sort(reverse=True)
    out: list[tuple[str, str]] = []
    seen: list[float] = []
    times = [r[0] * 1000 for r in rows]
    for top, at in late:
        if len(out) >= worst:
            break
        if any(abs(at - s) < 50 for s in seen):
            continue
        seen.append(at)
        lo = next((k for k, t in enumerate(times) if t >= at - top), None)
        hi = next((k for k, t in enumerate(times) if t >= at), len(rows) - 1)
        if lo is None or hi <= lo:
            continue
        a, b = rows[lo], rows[hi]
        span = (b[0] - a[0]) * 1000
        parts = [
            f"{n} {(y[0] - x[0]) / 1e6:.1f}/{(y[1] - x[1]) / 1e6:.1f}"
            for n, x, y in zip(names, a[4], b[4], strict=True)
        ]
        ran = sum(y[0] - x[0] for x, y in zip(a[4], b[4], strict=True)) / 1e6
        waited = sum(y[1] - x[1] for x, y in zip(a[4], b[4], strict=True)) / 1e6
        most = max(r[3] for r in rows[lo : hi + 1])
        out.append(
            (
                f"{top:.1f} ms late",
                (
                    f"window {span:.1f} ms: run/wait ms {'; '.join(parts)}; all sampled"
                    f" ran {ran:.1f}, waited {waited:.1f} of {CPUS * span:.0f} CPU-ms;"
                    f" steal {(b[2] - a[2]) * 10} ms, runnable max {most}"
                ),
            )
        )
    return out


def probe_round(setup: fire.Setup, args: argparse.Namespace, shards: int, seed: int) -> fire.Round:
    ProbedConsumer.setup = setup
    latency_events(setup, reset=True)
    r = plain_round(setup, args, shards, seed)
    w = ProbedConsumer.current
    assert w is not None
    rows = w.sampler.stop()
    names = w.sampler.names
    # totals over the round (its firing phase dominates: sending is ~0.5 s of ~15)
    first, last = rows[0], rows[-1]
    # a thread's last reading: the broker's threads end before the sampler stops
    ends = [next(row[4][k] for row in reversed(rows) if row[4][k][0]) for k in range(len(names))]
    per = [
        f"{n} {(y[1] - x[1]) / 1e3 / max(r.got, 1):.2f}"
        for n, x, y in zip(names, first[4], ends, strict=True)
    ]
    ours = sum(y[0] - x[0] for x, y in zip(first[4], ends, strict=True)) / 1e6
    secs = last[0] - first[0]
    lines = [
        ("run-queue wait/msg", "us: " + "; ".join(per)),
        (
            "machine",
            (
                f"{secs:.1f} s: the sampled tasks ran {ours / 1000:.1f} of"
                f" {CPUS * secs:.1f} CPU-s; steal {(last[2] - first[2]) * 10} ms"
            ),
        ),
    ]
    lines += [("latency event", e) for e in latency_events(setup, reset=False)]
    lines += stalls(w, rows, names, args.stall_ms, args.worst)
    print_block(f"redis_cluster_probe: {setup.name}", lines)
    return r


plain_round = fire.run_round


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--sample":
        named = [a.split("=", 1) for a in argv[3:]]
        sample(argv[1], float(argv[2]), [n for n, _ in named], [p for _, p in named])
        return 0
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--stall-ms", type=float, default=8.0)
    extra.add_argument("--worst", type=int, default=4)
    extra.add_argument("--every-ms", type=float, default=2.0)
    mine, rest = extra.parse_known_args(argv)
    ProbedConsumer.every_ms = mine.every_ms
    fire.ConsumerThread = ProbedConsumer  # type: ignore[attr-defined]

    def run_round(
        setup: fire.Setup, args: argparse.Namespace, shards: int, seed: int
    ) -> fire.Round:
        args.stall_ms, args.worst = mine.stall_ms, mine.worst
        return probe_round(setup, args, shards, seed)

    fire.run_round = run_round
    return fire.main(rest)


if __name__ == "__main__":
    sys.exit(main())
