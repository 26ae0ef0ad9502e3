"""Send-rate benchmark of one client process against a broker server.

Starts ``python -m broker_adapter.server`` on a fresh temp data dir and a free
127.0.0.1 port (or uses ``--broker chronoq://...``), then measures, with the
``BrokerAdapter`` contract only:

* *single sync sends*: ``send()`` one message at a time, from ``-p`` threads
  (each waits for its answer: sync sends, RocketMQ style);
* *batched sends*: ``send_batch()`` of ``--batch`` messages from ``-p`` threads.

Messages are due one day later, so nothing fires during the run. Rates are
messages per second of wall time, including building the ``Message`` objects.

Run from the project root::

    .venv/bin/python bench/remote_send.py                 # 20,000 single, 300,000 batched
    .venv/bin/python bench/remote_send.py -p 1 -p 2 -p 4  # several thread counts
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker_adapter import Message, open_broker
from broker_adapter.base import BrokerAdapter

DAY_MS = 24 * 3600 * 1000


def start_server(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    """A server child on a free port; it and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker_adapter.server", "--data-dir", data_dir, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("chronoq broker listening on"):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, "chronoq://" + line.split()[4]


def stop_server(proc: subprocess.Popen[str]) -> None:
    """Stop a server child started by :func:`start_server` (SIGTERM drains it)."""
    proc.terminate()
    proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def timed(threads: int, work: Callable[[int], None]) -> float:
    """Wall seconds for ``threads`` threads each running ``work(i)``."""
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def bench(
    broker: BrokerAdapter, n_single: int, n_batched: int, threads: int, batch: int, body: bytes
) -> tuple[float, float]:
    """``(single sends/s, batched sends/s)``."""
    due = int(time.time() * 1000) + DAY_MS
    per = n_single // threads

    def single(i: int) -> None:
        send = broker.send
        for k in range(per):
            send(Message("bench.remote.single", body, deliver_at_ms=due + k))

    single_rate = per * threads / timed(threads, single)
    rounds = n_batched // (threads * batch)

    def batched(i: int) -> None:
        for _ in range(rounds):
            broker.send_batch(
                [Message("bench.remote.batch", body, deliver_at_ms=due) for _ in range(batch)]
            )

    batch_rate = rounds * batch * threads / timed(threads, batched)
    return single_rate, batch_rate


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--broker", help="chronoq:// URL (default: start a server)")
    p.add_argument(
        "-p",
        "--producers",
        type=int,
        action="append",
        help="producer threads (repeatable; default 1 and 2)",
    )
    p.add_argument("--single", type=int, default=20_000, help="single sends per run")
    p.add_argument("--batched", type=int, default=300_000, help="batched sends per run")
    p.add_argument("--batch", type=int, default=1_000, help="send_batch size")
    p.add_argument("--body-size", type=int, default=100)
    args = p.parse_args(argv)
    tmp = None
    proc = None
    url = args.broker
    if url is None:
        tmp = tempfile.mkdtemp(prefix="chronoq-bench-")
        proc, url = start_server(os.path.join(tmp, "data"))
    try:
        with open_broker(url) as broker:
            broker.send(Message("bench.remote.warm", b""))
            body = b"x" * args.body_size
            print(f"== chronoq remote_send: {url} ==")
            for threads in args.producers or [1, 2]:
                single, batched = bench(
                    broker, args.single, args.batched, threads, args.batch, body
                )
                print(
                    f"  {threads} thread(s): single sync sends {single:,.0f} msgs/s; "
                    f"batched ({args.batch}) {batched:,.0f} msgs/s"
                )
    finally:
        if proc is not None:
            stop_server(proc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
