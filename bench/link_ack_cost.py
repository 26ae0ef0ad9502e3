"""CPU per message of a remote consumer's pull-and-ack loop over one ``chronoq://`` link,
the path of :meth:`~broker_adapter.server.link.Link.ack_later` (acks written without
waiting, carried by the next pull).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/link_ack_cost.py [--n 20000] [--rounds 3] [--batch 64]

A :class:`~broker_adapter.server.server.BrokerServer` runs in this process on
127.0.0.1 (a fresh data directory per round); a
:class:`~broker_adapter.server.client.RemoteBroker` sends ``--n`` messages due at
once, then pulls them ``--batch`` at a time and acks each one. Prints the CPU time
of the process (client and server threads together, ``time.process_time``) and
the wall time per message of the pull-and-ack phase, with the load average.
To compare two trees, run this script from each (A, B, A, B).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker_adapter.message import Message
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.server import BrokerServer


def run(tmp: Path, n: int, batch: int) -> tuple[float, float]:
    """CPU and wall microseconds per message of pulling and acking ``n`` messages."""
    server = BrokerServer(Path(tempfile.mkdtemp(dir=tmp)) / "d", "127.0.0.1", 0)
    server.start()
    try:
        with RemoteBroker.from_url(f"chronoq://127.0.0.1:{server.port}") as broker:
            for i in range(0, n, 1000):
                broker.send_batch(
                    [Message("bench.ack", b"x" * 32) for _ in range(min(1000, n - i))]
                )
            consumer = broker.consumer("g", ["bench.ack"])
            got = 0
            c0, w0 = time.process_time(), time.perf_counter()
            deadline = time.monotonic() + 120
            while got < n and time.monotonic() < deadline:
                for m in consumer.pull(max_messages=batch, wait_ms=200):
                    consumer.ack(m)
                    got += 1
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            if got < n:
                raise SystemExit(f"only {got} of {n} messages came within 120 s")
            consumer.close()
            return cpu / n * 1e6, wall / n * 1e6
    finally:
        server.shutdown(5)


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="messages per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds")
    p.add_argument("--batch", type=int, default=64, help="messages per pull")
    args = p.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== link_ack_cost: n={args.n}, batch={args.batch}, {os.cpu_count()} CPUs, load {load}")
    cpus = []
    with tempfile.TemporaryDirectory(prefix="chronoq-ack-") as tmp:
        for r in range(args.rounds):
            cpu, wall = run(Path(tmp), args.n, args.batch)
            cpus.append(cpu)
            print(f"round {r + 1}  pull+ack CPU {cpu:6.1f} us / wall {wall:6.1f} us per message")
    print(f"median CPU {sorted(cpus)[len(cpus) // 2]:.1f} us per message")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
