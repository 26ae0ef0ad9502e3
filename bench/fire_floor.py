"""The floor under an embedded fire's lateness on this machine (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/fire_floor.py              # 6 s of each
    .venv/bin/python bench/fire_floor.py --seconds 20

Two figures a pull that fires due messages itself cannot go below, each printed
as P50 / P99 / P99.9 / max in us:

* the overshoot of a timed ``Condition.wait`` of 0.2-1.5 ms (random), with the
  thread's timer slack tightened as firing threads do
  (:mod:`broker_adapter.timer_slack`);
* the length of a fire's lazy write on a fresh ``rocksdb://`` directory (WAL
  on, no fsync): four messages moved (a wheel delete and a ready put each) and
  the fire position, one write every 0.7 ms, as at ~3,300 jobs/s.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.store import RocksStore
from broker_adapter.timer_slack import tighten


def summary(name: str, us: list[float]) -> str:
    us = sorted(us)
    n = len(us)
    pct = " / ".join(f"{us[min(n - 1, int(n * q))]:.0f}" for q in (0.5, 0.99, 0.999))
    return f"{name}: {n} samples, P50 / P99 / P99.9 {pct} us, max {us[-1]:.0f} us"


def wait_overshoot(seconds: float, seed: int) -> list[float]:
    tighten()
    cond = threading.Condition(threading.Lock())
    rng = random.Random(seed)
    out: list[float] = []
    end = time.time() + seconds
    while time.time() < end:
        delay = rng.uniform(0.0002, 0.0015)
        at = time.time() + delay
        with cond:
            cond.wait(delay)
        out.append((time.time() - at) * 1e6)
    return out


def fire_writes(seconds: float) -> list[float]:
    tmp = tempfile.mkdtemp(prefix="chronoq-fire-floor-")
    store = RocksStore(os.path.join(tmp, "db"), "wal")
    try:
        h_wheel, h_ready, h_meta = (store.handle[cf] for cf in (K.CF_WHEEL, K.CF_READY, K.CF_META))
        record = b"x" * 120
        seq = 0
        out: list[float] = []
        end = time.time() + seconds
        while time.time() < end:
            batch = store.batch()
            wkey = b""
            for _ in range(4):
                seq += 1
                wkey = K.wheel_key(1_700_000_000_000 + seq, seq)
                batch.delete(wkey, h_wheel)
                batch.put(b"\x00\x01" + wkey, record, h_ready)
            batch.put(K.META_FIRED_UPTO, K.next_key(wkey), h_meta)
            t0 = time.perf_counter()
            store.write(batch, lazy=True)
            out.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.0007)
        return out
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=6.0, help="per figure (default 6)")
    p.add_argument("--seed", type=int, default=16)
    args = p.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== fire_floor: {os.cpu_count()} CPUs, load {load} ==")
    print(summary("timed wait 0.2-1.5 ms, overshoot", wait_overshoot(args.seconds, args.seed)))
    print(summary("fire write (4 messages), length", fire_writes(args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
