"""What a step of the firing pull costs right after a timed wait, against the same
step in a hot loop (issue 16: CPU per job at ~670 jobs/s, one wake per due ms).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/wake_cost.py                  # 3,000 calls each, 1.5 ms waits
    .venv/bin/python bench/wake_cost.py --wait-ms 0.3 --calls 5000

For each step it prints the calling thread's CPU (``time.thread_time``) per call
in a hot loop and when each call follows a timed wait of ``--wait-ms`` (a
``threading.Event().wait``, as the pull's wait to a due time), the wait's own
CPU excluded. The steps, on a fresh RocksDB directory (real ``RocksStore``):

* ``nothing``: an empty call (the probe's own cost);
* ``timed wait``: the wait itself (its CPU: the futex, the wake-up, the GIL), as
  a ``threading.Event``, the pull's ``ReadySignal`` and a bare ``Lock.acquire``;
* ``WriteBatch()``: a new raw-mode batch;
* ``fire batch``: the batch of one fired message as ``BrokerCore.fire_due``
  builds it (wheel delete, ready put, counters, fire position), not written;
* ``fire write (WAL)``: that batch built and written as the fire writes it
  (``lazy``: WAL on, no fsync), and ``fire write (no WAL)`` for comparison;
* ``dict walk``: reading 64 entries of a 2,000-entry dict of tuples (a stand-in
  for Python work over data the wait left cold).

The difference between the two columns is what a wake-up adds to each step on
this machine: cold caches and TLB after the thread slept (on a VM, the vCPU
may have halted), paid by whatever runs first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocksdict import WriteBatch, WriteOptions

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.consumer import ReadySignal
from broker_adapter.embedded.store import RocksStore

_tt = time.thread_time


def per_call(step: Callable[[int], object], calls: int, wait_s: float) -> tuple[float, float]:
    """Thread CPU (us) per call of ``step``: in a hot loop, and after a ``wait_s`` wait."""
    hot = 0.0
    for i in range(calls):
        t0 = _tt()
        step(i)
        hot += _tt() - t0
    cold = 0.0
    pause = threading.Event().wait
    for i in range(calls):
        pause(wait_s)
        t0 = _tt()
        step(i)
        cold += _tt() - t0
    return hot / calls * 1e6, cold / calls * 1e6


def wait_cpu(calls: int, pause: Callable[[], object]) -> float:
    """Thread CPU (us) of one timed wait, ``pause()``."""
    t0 = _tt()
    for _ in range(calls):
        pause()
    return (_tt() - t0) / calls * 1e6


def waits(wait_s: float) -> list[tuple[str, Callable[[], object]]]:
    """The timed waits compared: a ``threading.Event`` (a ``Condition``: Python code
    around a new lock per wait), the pull's :class:`ReadySignal`, and a bare
    ``Lock.acquire`` with a timeout (C only)."""
    event = threading.Event()
    signal = ReadySignal()
    held = threading.Lock()
    held.acquire()
    return [
        ("timed wait (Event)", lambda: event.wait(wait_s)),
        ("timed wait (ReadySignal)", lambda: signal.wait(signal.epoch, wait_s)),
        ("timed wait (Lock.acquire)", lambda: held.acquire(True, wait_s)),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--wait-ms", type=float, default=1.5)
    args = p.parse_args(argv)
    wait_s = args.wait_ms / 1000
    with tempfile.TemporaryDirectory(prefix="chronoq-wake-cost-") as tmp:
        store = RocksStore(os.path.join(tmp, "db"))
        h_wheel, h_ready, h_meta = (store.handle[f] for f in (K.CF_WHEEL, K.CF_READY, K.CF_META))
        record = b"r" * 120
        counters = K.META_COUNTERS + K.tid_bytes(1)
        no_wal = WriteOptions()
        setattr(no_wal, "disable_wal", True)  # noqa: B010 (a property in rocksdict 0.3.29)

        def fire_batch(i: int) -> WriteBatch:
            batch = store.batch()
            wkey = K.wheel_key(1_000_000 + i, i)
            batch.delete(wkey, h_wheel)
            batch.put(K.tid_bytes(1) + wkey, record, h_ready)
            batch.put(counters, K.U64X2.pack(i, i), h_meta)
            batch.put(K.META_FIRED_UPTO, K.next_key(wkey), h_meta)
            return batch

        table = {i: (K.wheel_key(i, i), i, record) for i in range(2000)}

        def walk(i: int) -> int:
            return sum(table[(i * 61 + j * 31) % 2000][1] for j in range(64))

        steps: list[tuple[str, Callable[[int], object]]] = [
            ("nothing", lambda i: None),
            ("WriteBatch()", lambda i: store.batch()),
            ("fire batch", fire_batch),
            ("fire write (WAL)", lambda i: store.write(fire_batch(i), lazy=True)),
            ("fire write (no WAL)", lambda i: store.db.write(fire_batch(i), no_wal)),
            ("dict walk", walk),
        ]
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"== wake_cost: {args.calls:,} calls, waits of {args.wait_ms:g} ms, load {load} ==")
        print(f"  {'step':<26} {'hot us':>8} {'after a wait us':>16} {'added us':>9}")
        for name, pause in waits(wait_s):
            print(f"  {name:<26} {'':>8} {wait_cpu(args.calls, pause):16.1f}")
        for name, step in steps:
            hot, cold = per_call(step, args.calls, wait_s)
            print(f"  {name:<26} {hot:8.1f} {cold:16.1f} {cold - hot:9.1f}")
        store.close()
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
