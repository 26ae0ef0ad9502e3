"""A connection flood against a real ``chronoq broker serve`` child (issue 18 §3).

Silent sockets (they connect and never send a byte) from ``--addresses`` loopback
source addresses (127.0.0.2, 127.0.0.3, ...; ``--per-address`` each) and ``--own``
from 127.0.0.1, the good clients' own address, each opened again as soon as the
server closes it, for ``--seconds``. Meanwhile
a good client on 127.0.0.1 that was connected before sends and pulls one message at a
time, and every 100 ms a new client connects and sends once (retrying a refused
connection after 0.1 s), timed.

Printed: flood sockets opened and closed by the server; the long-lived client's
send+pull round trips (P50/P99/max, ms); new clients: connected on the first try, after
retries, never; the server's refusal log lines (one per 5 s, with counts); the load
average before and after.

Run from the project root::

    .venv/bin/python bench/connection_flood.py
    .venv/bin/python bench/connection_flood.py --addresses 16 --per-address 100 --seconds 20
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

from bench.stats import format_percentiles, percentiles
from broker_adapter.errors import ConnectionFailed
from broker_adapter.message import Message
from broker_adapter.server.client import RemoteBroker

ERRORS: list[str] = []


def new_client(url: str, attempts: int = 5) -> int:
    """Attempts a new client needed to connect and send once (0: never)."""
    for attempt in range(1, attempts + 1):
        try:
            with RemoteBroker.from_url(url) as client:
                client.send(Message("bench.flood", b"new"))
                return attempt
        except ConnectionFailed as e:
            ERRORS.append(str(e))
            time.sleep(0.1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addresses", type=int, default=8, help="flooding source addresses")
    parser.add_argument("--per-address", type=int, default=60, help="silent sockets each")
    parser.add_argument("--own", type=int, default=200, help="silent sockets from 127.0.0.1")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--per-peer", type=int, default=16, help="--max-connections-per-peer")
    args = parser.parse_args(argv)
    from tests.server.flood import Flood
    from tests.server.serverproc import ServerProcess

    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="chronoq-flood-") as tmp:
        log_path = Path(tmp) / "server.log"
        server = ServerProcess(
            Path(tmp) / "d",
            extra=("--max-connections-per-peer", str(args.per_peer), "--log-level", "WARNING"),
            log_path=log_path,
        ).start()
        try:
            early = RemoteBroker.from_url(server.url)
            consumer = early.consumer("g", ["bench.flood.rt"])
            want = {f"127.0.0.{i}": args.per_address for i in range(2, 2 + args.addresses)}
            want["127.0.0.1"] = args.own
            rtts: list[float] = []
            tries: list[int] = []
            joins: list[float] = []
            with Flood(server.port, want) as flood:
                end = time.monotonic() + args.seconds
                next_new = 0.0
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    early.send(Message("bench.flood.rt", b"x"))
                    got = consumer.pull(1, wait_ms=5000)
                    for m in got:
                        consumer.ack(m)
                    rtts.append((time.perf_counter() - t0) * 1000)
                    if time.monotonic() >= next_new:
                        next_new = time.monotonic() + 0.1
                        t1 = time.perf_counter()
                        tries.append(new_client(server.url))
                        joins.append((time.perf_counter() - t1) * 1000)
                opened, closed = flood.opened, flood.closed_by_server
            consumer.close()
            early.close()
        finally:
            server.stop()  # the last counts reach the log at shutdown
        lines = [x for x in log_path.read_text().splitlines() if "turned away" in x]
    p = percentiles(rtts, (50, 99, 100))
    print(
        f"flood: {args.addresses} addresses x {args.per_address} silent sockets + {args.own} "
        f"from 127.0.0.1 for {args.seconds:.0f} s: {opened:,} opened, {closed:,} closed by "
        "the server",
        flush=True,
    )
    print(f"good client send+pull round trip ms ({len(rtts):,}): {format_percentiles(p)}")
    first = sum(1 for t in tries if t == 1)
    never = sum(1 for t in tries if t == 0)
    print(
        f"new clients: {len(tries)}: {first} on the first try, "
        f"{len(tries) - first - never} after retries, {never} never; connect+send+close ms: "
        + format_percentiles(percentiles(joins, (50, 99)))
    )
    for error in sorted(set(ERRORS)):
        print(f"  refused: {error}")
    print(f"server refusal log: {len(lines)} lines")
    for line in lines:
        print("  " + line.split(": ", 1)[-1])
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
