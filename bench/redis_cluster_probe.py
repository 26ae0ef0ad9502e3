"""Where the Redis Cluster bench's lateness stalls go (issue 19 §3): who had the CPUs.

Runs the rounds of ``bench/redis_cluster_fire.py`` (same options, same setups) while a
sampler PROCESS (``bench/schedstat_sampler.py``; not a thread: it must not take the
client's GIL) reads, every
``--every-ms`` (default 2), each redis-server's main thread and the client's threads'
``/proc/.../schedstat`` (ns on a CPU, ns waiting in the run queue), ``/proc/stat``
(steal ticks) and ``/proc/loadavg`` (runnable tasks now). Every redis-server also
logs its own latency events (``latency-monitor-threshold 1``).

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
import sys
import threading
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import redis_cluster_fire as fire
from bench.loadgen import ConsumerThread
from bench.schedstat_sampler import TICK_MS, Row, Sampler
from bench.stats import print_block

#: CPUs of the machine (the time it had in a window: CPUS x the window).
CPUS = os.cpu_count() or 1
#: The client's threads whose schedstat is sampled, by name prefix.
CLIENT_THREADS = ("bench-consumer", "chronoq-redis-firer", "chronoq-redis-acks")


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
    w: ConsumerThread, rows: list[Row], names: list[str], stall_ms: float, worst: int
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
    times = [r.t * 1000 for r in rows]
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
        span = (b.t - a.t) * 1000
        parts = [
            f"{n} {(y[0] - x[0]) / 1e6:.1f}/{(y[1] - x[1]) / 1e6:.1f}"
            for n, x, y in zip(names, a.tasks, b.tasks, strict=True)
        ]
        ran = sum(y[0] - x[0] for x, y in zip(a.tasks, b.tasks, strict=True)) / 1e6
        waited = sum(y[1] - x[1] for x, y in zip(a.tasks, b.tasks, strict=True)) / 1e6
        most = max(r.runnable for r in rows[lo : hi + 1])
        out.append(
            (
                f"{top:.1f} ms late",
                (
                    f"window {span:.1f} ms: run/wait ms {'; '.join(parts)}; all sampled"
                    f" ran {ran:.1f}, waited {waited:.1f} of {CPUS * span:.0f} CPU-ms;"
                    f" steal {(b.steal - a.steal) * TICK_MS:.0f} ms, runnable max {most}"
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
    ends = [
        next(row.tasks[k] for row in reversed(rows) if row.tasks[k][0]) for k in range(len(names))
    ]
    per = [
        f"{n} {(y[1] - x[1]) / 1e3 / max(r.got, 1):.2f}"
        for n, x, y in zip(names, first.tasks, ends, strict=True)
    ]
    ours = sum(y[0] - x[0] for x, y in zip(first.tasks, ends, strict=True)) / 1e6
    secs = last.t - first.t
    lines = [
        ("run-queue wait/msg", "us: " + "; ".join(per)),
        (
            "machine",
            (
                f"{secs:.1f} s: the sampled tasks ran {ours / 1000:.1f} of"
                f" {CPUS * secs:.1f} CPU-s; steal {(last.steal - first.steal) * TICK_MS:.0f} ms"
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
