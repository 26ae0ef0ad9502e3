"""How long one refill of the timing wheel's near window takes, per ``step_ms`` (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/wheel_refill.py                       # 100,000 due over 30 s
    .venv/bin/python bench/wheel_refill.py --n 20000 --steps 100,20

A refill runs in the thread that fires (often the dispatcher's pull) and holds the
GIL through its RocksDB scan, so a due job waits for it: its length is a job-start
stall. The script puts ``--n`` messages due uniformly over 30 s on a fresh
``rocksdb://`` directory's wheel (as sends do), then for each step replays three
seconds of firing, one millisecond at a time, with a new ``TimingWheel`` (the
window ``--window-ms``, default 1,000) and prints per step: refills, the median and
longest refill in us, and the refill time per second of firing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import encode
from broker_adapter.embedded.timing_wheel import TimingWheel

START_MS = 1_700_000_000_000
BODY = b'{"v":1,"job":"bench.vs.record","args":[12345,1700000012345],"kwargs":{}}'


def fill(core: BrokerCore, n: int, seed: int) -> None:
    """Put ``n`` messages due 5-35 s after ``START_MS`` on the wheel, in batches of 1,000."""
    rng = random.Random(seed)
    dues = sorted(int(rng.uniform(START_MS + 5000, START_MS + 35000)) for _ in range(n))
    with core.lock:
        tid = core.topic_id("bench.refill")
        for i in range(0, n, 1000):
            entries = []
            for due in dues[i : i + 1000]:
                wkey = K.wheel_key(due, core.take_seqs(1))
                record = encode(tid, 0, due, START_MS, K.make_id(wkey, tid), b"", b"", b"", BODY)
                entries.append((wkey, tid, record))
            core.write_pending(core.store.batch(), entries)


def replay(core: BrokerCore, window_ms: int, step_ms: int, seconds: int) -> list[float]:
    """Fire ``seconds`` of due messages a ms at a time; each refill's length in us."""
    wheel = TimingWheel(core.store, K.wheel_key(0, 0), window_ms=window_ms, step_ms=step_ms)
    now = START_MS + 10_000
    while wheel.refill(now, force=True):  # the window as a running broker has it
        pass
    took: list[float] = []
    for ms in range(now, now + seconds * 1000):
        t0 = time.perf_counter()
        loaded = wheel.refill(ms)
        t1 = time.perf_counter()
        if loaded:
            took.append((t1 - t0) * 1e6)
        wheel.pop_due(ms, 1 << 20)
    return took


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, default=100_000, help="messages due over 30 s")
    p.add_argument("--steps", default="100,50,20,10", help="step_ms values, comma list")
    p.add_argument("--window-ms", type=int, default=1000)
    p.add_argument("--seconds", type=int, default=3, help="seconds of firing replayed")
    p.add_argument("--seed", type=int, default=16)
    args = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="chronoq-refill-")
    try:
        core = BrokerCore(os.path.join(tmp, "db"), ManualClock(START_MS))
        try:
            fill(core, args.n, args.seed)
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"== wheel_refill: N={args.n:,} due over 30 s, load {load} ==")
            for step in (int(x) for x in args.steps.split(",") if x):
                took = sorted(replay(core, args.window_ms, step, args.seconds))
                if not took:
                    print(f"step {step:>4} ms: no refill")
                    continue
                print(
                    f"step {step:>4} ms: {len(took):>4} refills, median {took[len(took) // 2]:6.0f} "
                    f"us, longest {took[-1]:6.0f} us, {sum(took) / 1000 / args.seconds:5.2f} ms "
                    "of refills per s"
                )
        finally:
            core.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
