"""What the progress bar of ``chronoq cancel --key-prefix`` costs: one plain
``abort_prefix`` against the chunked cancel the command runs on a terminal (list
the keys, abort sub-prefix chunks, one last ``abort_prefix``), on a fresh
``rocksdb://`` directory of N keys each, the bar drawn to /dev/null.

    python bench/cancel_progress.py [--keys 20000] [--others 100000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

from broker_adapter import Message, open_broker
from broker_adapter.base import BrokerAdapter
from scheduler.progress import progress
from workers.prefix_cancel import cancel_prefix

TOPIC = "shop.jobs"


def fill(broker: BrokerAdapter, keys: int, others: int) -> None:
    """``keys`` messages under ``order:`` and ``others`` under ``other:``, due in an hour."""
    due = int(time.time() * 1000) + 3_600_000
    for prefix, n in (("order", keys), ("other", others)):
        for lo in range(0, n, 5000):
            broker.send_batch(
                [
                    Message(TOPIC, b"{}", f"{prefix}:{i}:close", deliver_at_ms=due + i)
                    for i in range(lo, min(n, lo + 5000))
                ]
            )


def timed(keys: int, others: int, chunked: bool) -> tuple[float, int]:
    """Seconds of one cancel of ``order:`` and how many it aborted."""
    with tempfile.TemporaryDirectory() as d, open_broker(f"rocksdb://{d}") as broker:
        fill(broker, keys, others)
        start = time.perf_counter()
        if chunked:
            with (
                open(os.devnull, "w") as null,
                progress("cancelling", unit=" keys", stream=null, force=True) as bar,
            ):
                results = cancel_prefix(broker, [TOPIC], "order:", bar, strict=True)
            aborted = sum(r.aborted for r in results)
        else:
            aborted = broker.abort_prefix(TOPIC, "order:").aborted
        return time.perf_counter() - start, aborted


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=20_000, help="keys under the prefix")
    p.add_argument("--others", type=int, default=100_000, help="other pending messages")
    args = p.parse_args(argv)
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    plain, n0 = timed(args.keys, args.others, chunked=False)
    chunked, n1 = timed(args.keys, args.others, chunked=True)
    assert n0 == n1 == args.keys, (n0, n1)
    print(f"{args.keys} keys under the prefix, {args.others} others pending, rocksdb://:")
    print(f"  one abort_prefix:        {plain * 1000:8.1f} ms ({args.keys / plain:,.0f} keys/s)")
    print(
        f"  chunked, with a bar:     {chunked * 1000:8.1f} ms ({args.keys / chunked:,.0f} keys/s)"
    )
    print(f"  ratio:                   {chunked / plain:8.2f}x")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
