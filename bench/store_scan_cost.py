"""CPU per row of ``RocksStore.scan`` (the embedded broker's takes and refills read
through it), against the per-row Python loop it replaced (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/store_scan_cost.py [--rows 2000] [--rounds 3]

A fresh RocksDB directory holds ``--rows`` ready rows of 100 bytes. Each round
scans them with ``RocksStore.scan`` (``islice`` over rocksdict's iterator) and
with the loop of before (one ``len`` and bound check and one ``append`` per row),
alternating, for scans of 2 rows (a take at a due millisecond) and of 1,000 rows
(a burst's take, a refill). Prints CPU (``time.process_time``) per scan and per
row, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocksdict import ReadOptions

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.store import RocksStore

Scan = Callable[[str, bytes, bytes, int], list[tuple[bytes, bytes]]]


def loop_scan(store: RocksStore) -> Scan:
    """The scan of before: a Python loop with a check per row."""

    def scan(cf: str, lower: bytes, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        out: list[tuple[bytes, bytes]] = []
        for key, value in store.cf[cf].items(from_key=lower, read_opt=opt):
            if len(out) >= limit or key >= upper:
                break
            out.append((key, value))
        return out

    return scan


def cpu_per_scan(scan: Scan, limit: int, n: int) -> float:
    """CPU seconds per call of ``scan`` over ``limit`` rows, ``n`` calls."""
    t = time.process_time()
    for _ in range(n):
        scan(K.CF_READY, b"k00000", b"k99999", limit)
    return (time.process_time() - t) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print("load before:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp:
        store = RocksStore(os.path.join(tmp, "db"))
        try:
            for i in range(args.rows):
                store.put(K.CF_READY, b"k%05d" % i, b"v" * 100)
            ways: dict[str, Scan] = {"scan (islice)": store.scan, "loop (before)": loop_scan(store)}
            print(f"{'round':>5}  {'way':<14} {'rows':>5} {'us/scan':>9} {'us/row':>7}")
            for r in range(args.rounds):
                for name, scan in ways.items():
                    for limit, n in ((2, 100_000), (1000, 1000)):
                        us = cpu_per_scan(scan, limit, n) * 1e6
                        print(f"{r:>5}  {name:<14} {limit:>5} {us:>9.2f} {us / limit:>7.3f}")
        finally:
            store.close()
    print("load after: ", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
