"""CPU per request of a real ``chronoq://`` link: loopback TCP against a Unix socket
(``chronoq+unix://``, issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/remote_link_cost.py [--n 20000] [--rounds 3]

A :class:`~broker_adapter.server.server.BrokerServer` runs in this process, once on
127.0.0.1 and once on a Unix socket (fresh data directories); one
:class:`~broker_adapter.server.link.Link` makes ``--n`` sync requests one after the
other: ``query`` of an id that does not exist (a lookup in the broker, the
protocol's framing and msgpack on both sides, a round trip) and ``send`` of a
delayed 32-byte message (a RocksDB write besides). Prints CPU time of the process
(client and server threads together, ``time.process_time``) and wall time per
request, rounds alternating TCP and Unix (A, B, A, B...), with the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker_adapter.message import Message
from broker_adapter.server import values as V
from broker_adapter.server.link import Link
from broker_adapter.server.server import BrokerServer


def measure(link: Link, op: str, n: int) -> tuple[float, float]:
    """CPU and wall microseconds per request of ``n`` ``op`` requests on ``link``."""
    if op == "query":
        args: dict[str, Any] = {"id": "0" * 32}
    else:
        args = {"m": V.encode_message(Message("bench.link", b"x" * 32, delay_ms=3_600_000))}
    call = link.call
    for _ in range(min(n, 500)):  # warm-up
        call(op, args, 10.0)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        call(op, args, 10.0)
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


def run(kind: str, tmp: Path, n: int) -> dict[str, tuple[float, float]]:
    """One round on a fresh server of ``kind`` (``tcp`` or ``unix``)."""
    data = Path(tempfile.mkdtemp(dir=tmp))
    if kind == "tcp":
        server = BrokerServer(data / "d", "127.0.0.1", 0)
    else:
        server = BrokerServer(data / "d", unix_path=data / "b.sock")
    server.start()
    try:
        if kind == "tcp":
            link = Link("127.0.0.1", server.port, None)
        else:
            link = Link(str(data / "b.sock"), None, None)
        try:
            return {op: measure(link, op, n) for op in ("query", "send")}
        finally:
            link.close()
    finally:
        server.shutdown(5)


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="requests per figure")
    p.add_argument("--rounds", type=int, default=3, help="TCP/Unix pairs")
    args = p.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== remote_link_cost: n={args.n}, {os.cpu_count()} CPUs, load {load}")
    print("us per request, client + server threads of this process: CPU / wall")
    rows: dict[str, list[dict[str, tuple[float, float]]]] = {"tcp": [], "unix": []}
    with tempfile.TemporaryDirectory(prefix="chronoq-link-") as tmp:
        for r in range(args.rounds):
            for kind in ("tcp", "unix"):
                got = run(kind, Path(tmp), args.n)
                rows[kind].append(got)
                cells = "  ".join(f"{op} {c:6.1f} / {w:6.1f}" for op, (c, w) in got.items())
                print(f"round {r + 1} {kind:4}  {cells}", flush=True)
    for op in ("query", "send"):
        tcp = sorted(x[op][0] for x in rows["tcp"])
        unix = sorted(x[op][0] for x in rows["unix"])
        mid = len(tcp) // 2
        print(
            f"{op}: median CPU TCP {tcp[mid]:.1f} us, Unix {unix[mid]:.1f} us "
            f"(Unix / TCP {unix[mid] / tcp[mid]:.2f})"
        )
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
