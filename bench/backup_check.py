"""Backup and check of an embedded broker with many pending messages.

1. **fill**: ``--pending`` messages (default 1,000,000) of 100 bytes, keyed
   ``order:<i>``, due uniformly 1-2 h ahead, in batches of 1,000;
2. **backup under a firing load**: messages fire at ``--fire-rate``/s (default
   1,000) into a consumer that pulls and acks on its own thread; 4 s into it,
   ``EmbeddedBroker.backup`` writes a checkpoint to a new directory. Printed: its
   time, size and MB/s, and the fire lateness (receive time minus due time) of the
   messages due while it ran and of those due before it (baseline);
3. **check**: ``check_directory`` of the copy (every key of every family read
   with checksums, the invariants checked): keys read, seconds, keys/s.

The data directory lives under ``--dir`` (default: a temp dir; the backup goes
next to it, so on one file system it is made of hard links: its MB/s is what the
checkpoint costs, not a disk copy). The load average is printed before and after.

Run from the project root::

    .venv/bin/python -m bench.backup_check [--pending 1000000] [--fire-rate 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.firing_load import FiringLoad
from bench.stats import dir_bytes, load_average, mb
from broker_adapter import Message
from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.embedded.check import check_directory

HOUR_MS = 3_600_000
TOPIC, LOAD_TOPIC = "bench-backup", "bench-backup-load"


def now_ms() -> float:
    return time.time() * 1000


def fill(broker: EmbeddedBroker, n: int) -> None:
    base = int(now_ms())
    t0 = time.perf_counter()
    for start in range(0, n, 1_000):
        broker.send_batch(
            [
                Message(
                    TOPIC,
                    b"x" * 100,
                    key=f"order:{i}",
                    deliver_at_ms=base + HOUR_MS + i * HOUR_MS // n,
                )
                for i in range(start, min(start + 1_000, n))
            ]
        )
    took = time.perf_counter() - t0
    print(f"  fill                {n:,} pending in {took:.1f} s ({n / took:,.0f} msgs/s)")
    print(f"  data directory      {mb(dir_bytes(str(broker.path)))}")


def backup_under_load(broker: EmbeddedBroker, dest: Path, fire_rate: int) -> None:
    load = FiringLoad(broker, LOAD_TOPIC, "bench-backup", fire_rate, 10_000)
    load.sleep_into(4_000)
    a0 = now_ms()
    info = broker.backup(dest)
    a1 = now_ms()
    got = load.finish()
    rate = info.size_bytes / 1e6 / info.seconds
    print(
        f"  backup              {mb(info.size_bytes)} in {info.files} files, "
        f"{info.seconds:.2f} s ({rate:,.0f} MB/s)"
    )
    load.report("the backup", a0, a1)
    print(f"  load messages       {got:,} of {load.count:,} delivered")


def check(dest: Path) -> None:
    report = check_directory(dest)
    keys = sum(report.families.values())
    print(
        f"  check of the copy   {keys:,} keys in {report.seconds:.2f} s "
        f"({keys / report.seconds:,.0f} keys/s), exit code {report.exit_code}"
    )
    for kind, p in report.problems.items():
        print(f"      {kind}: {p.count}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--fire-rate", type=int, default=1_000)
    parser.add_argument("--dir", help="parent of the data directory and the backup")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chronoq-bench-backup-", dir=args.dir))
    print(f"load average before: {load_average()} ({os.cpu_count()} cores)")
    try:
        broker = EmbeddedBroker(root / "data")
        try:
            fill(broker, args.pending)
            backup_under_load(broker, root / "backup", args.fire_rate)
        finally:
            broker.close()
        check(root / "backup")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
