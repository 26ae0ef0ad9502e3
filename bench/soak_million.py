"""1,000,000 messages through send -> fire -> pull -> ack in one process (issue 18 §6):
do RSS, open file descriptors and threads stay flat?

An embedded broker on a fresh ``rocksdb://`` directory. A producer thread sends
batches of ``--batch`` messages due 0-``--window-ms`` ahead, keeping at most
``--outstanding`` sent but not yet acked (a steady state, not a backlog that grows
with N). The main thread pulls and acks (``ack_batch``). Every ``--every`` acked
it samples ``VmRSS`` (``/proc/self/status``), the entries of ``/proc/self/fd`` and
of ``/proc/self/task`` (every OS thread: RocksDB's background threads too).

Printed: the sample table, the growth from the first sample to the last, and the
verdict against the tolerances below. Exit 1 when a figure grows beyond them, or
when the deliveries acked are not exactly N with nothing left pending, ready or in
flight (a loss or a duplicate), 0 otherwise.

Tolerances (first sample -> last sample; the first is taken after ``--every``
messages, when RocksDB's memtables, block cache and compaction threads are warm):

* RSS: at most ``--rss-tolerance-mb`` (default 64 MB). What legitimately moves
  RSS in a steady state is bounded and does not scale with N: RocksDB's memtables
  (filled and flushed in turn), its table reader and index blocks as SST files
  come and go, and the Python allocator keeping freed arenas. A leak of one small
  object per message (~100 B) over 900k messages would add ~90 MB and fail.
  Warm-up growth levels off (RocksDB's caches and memtables reach their size): the
  growth over the second half of the samples alone must stay within half of it,
  which a leak that scales with N would not (~45 MB over 500k at ~100 B each).
* open descriptors: at most ``--fd-tolerance`` more (default 24). RocksDB keeps
  each live SST file open; consumed ready entries and done records are retained
  (72 h by default) so the directory holds more data at the end, and compaction
  keeps the file count bounded, not constant. A descriptor leaked per message
  (or per pull) would add thousands.
* threads: at most ``--thread-tolerance`` more (default 2): none should appear
  per message, pull or batch.

Run from the project root::

    .venv/bin/python bench/soak_million.py
    .venv/bin/python bench/soak_million.py --messages 200000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stats import mb, num, rss_bytes
from broker_adapter import BrokerAdapter, Message, open_broker

TOPIC, GROUP = "million", "million-group"


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    """OS threads of this process (Python's and the native libraries')."""
    return len(os.listdir("/proc/self/task"))


class Pacer:
    """Counts acked messages; the producer waits on it to keep the window."""

    def __init__(self, outstanding: int) -> None:
        self.outstanding = outstanding
        self.acked = 0
        self.cond = threading.Condition()

    def wait_room(self, sent: int) -> None:
        """Block until fewer than ``outstanding`` of ``sent`` are unacked (60 s at most)."""
        with self.cond:
            self.cond.wait_for(lambda: sent - self.acked < self.outstanding, timeout=60)

    def add(self, n: int) -> None:
        """Count ``n`` more acked and wake the producer."""
        with self.cond:
            self.acked += n
            self.cond.notify_all()


def produce(
    broker: BrokerAdapter, args: argparse.Namespace, pacer: Pacer, errors: list[str]
) -> None:
    """Send ``args.messages`` in batches, due within ``args.window_ms``."""
    rng = random.Random(1)
    sent = 0
    try:
        while sent < args.messages:
            pacer.wait_room(sent)
            n = min(args.batch, args.messages - sent)
            now = int(time.time() * 1000)
            batch = [
                Message(TOPIC, b"m", deliver_at_ms=now + rng.randrange(args.window_ms))
                for _ in range(n)
            ]
            broker.send_batch(batch)
            sent += n
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        errors.append(repr(e))


def run(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """The soak; its samples, growth, verdict."""
    samples: list[dict[str, float]] = []
    pacer = Pacer(args.outstanding)
    errors: list[str] = []
    t0 = time.perf_counter()
    with open_broker(f"rocksdb://{data}?share=0") as broker:
        consumer = broker.consumer(GROUP, [TOPIC])
        producer = threading.Thread(target=produce, args=(broker, args, pacer, errors), daemon=True)
        producer.start()
        next_sample = args.every
        idle_since = time.monotonic()
        while pacer.acked < args.messages and not errors:
            got = consumer.pull(max_messages=1024, wait_ms=200)
            if not got:
                if time.monotonic() - idle_since > 60:
                    errors.append("nothing delivered for 60 s")
                continue
            idle_since = time.monotonic()
            consumer.ack_batch(got)
            pacer.add(len(got))
            if pacer.acked >= next_sample:
                samples.append(
                    {
                        "acked": pacer.acked,
                        "seconds": time.perf_counter() - t0,
                        "rss": rss_bytes(),
                        "fds": open_fds(),
                        "threads": os_threads(),
                    }
                )
                next_sample += args.every
        producer.join(60)
        consumer.close()
        stats = broker.stats()
    first, middle, last = samples[0], samples[len(samples) // 2 - 1], samples[-1]
    growth = {k: last[k] - first[k] for k in ("rss", "fds", "threads")}
    second_half_rss = last["rss"] - middle["rss"]
    flat = (
        growth["rss"] <= args.rss_tolerance_mb * 1e6
        and second_half_rss <= args.rss_tolerance_mb * 1e6 / 2
        and growth["fds"] <= args.fd_tolerance
        and growth["threads"] <= args.thread_tolerance
    )
    group = stats.groups.get(GROUP)
    acked_total = group.acked_total if group is not None else 0
    # N deliveries acked and nothing left anywhere: every message exactly once (no
    # id set is kept: 1M ids would be ~100 MB of this process's RSS themselves)
    left = stats.pending + (group.ready + group.inflight if group is not None else 0)
    return {
        "messages": args.messages,
        "acked": pacer.acked,
        "broker_acked_total": acked_total,
        "left": left,
        "errors": errors,
        "samples": samples,
        "growth": growth,
        "second_half_rss": second_half_rss,
        "flat": flat,
        "ok": flat
        and not errors
        and pacer.acked == args.messages
        and acked_total == args.messages
        and left == 0,
        "seconds": time.perf_counter() - t0,
    }


def show(fig: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the table, the growth and the verdict."""
    print(f"{'acked':>10}  {'seconds':>8}  {'RSS':>10}  {'fds':>5}  {'threads':>7}")
    for s in fig["samples"]:
        print(
            f"{num(s['acked']):>10}  {s['seconds']:8.1f}  {mb(s['rss']):>10}  "
            f"{s['fds']:>5}  {s['threads']:>7}"
        )
    g = fig["growth"]
    print(
        f"growth first->last: RSS {g['rss'] / 1e6:+.1f} MB (tolerance {args.rss_tolerance_mb} MB),"
        f" fds {g['fds']:+d} (tolerance {args.fd_tolerance}),"
        f" threads {g['threads']:+d} (tolerance {args.thread_tolerance});"
        f" RSS over the second half {fig['second_half_rss'] / 1e6:+.1f} MB"
        f" (tolerance {args.rss_tolerance_mb / 2:g} MB)"
    )
    print(
        f"acked {num(fig['acked'])} of {num(fig['messages'])} (broker's acked total "
        f"{num(fig['broker_acked_total'])}), left pending/ready/in flight {fig['left']}, "
        f"errors {fig['errors']}, "
        f"{fig['seconds']:.0f} s ({num(fig['acked'] / fig['seconds'])} msgs/s end to end)"
    )
    print(f"flat: {fig['flat']}; load average after: {os.getloadavg()}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000, help="sample every N acked")
    parser.add_argument("--batch", type=int, default=1_000, help="messages per send_batch")
    parser.add_argument("--outstanding", type=int, default=50_000, help="sent, not yet acked")
    parser.add_argument("--window-ms", type=int, default=2_000, help="due 0..window ahead")
    parser.add_argument("--rss-tolerance-mb", type=float, default=64.0)
    parser.add_argument("--fd-tolerance", type=int, default=24)
    parser.add_argument("--thread-tolerance", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chronoq-million-") as tmp:
        fig = run(args, Path(tmp) / "data")
    show(fig, args)
    if args.json:
        print(json.dumps(fig))
    return 0 if fig["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
