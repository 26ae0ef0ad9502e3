"""Fire lateness at a remote consumer: messages firing at ``--rate``/s through a
broker server, pulled by a consumer in another process.

Starts ``python -m broker_adapter.server`` on a fresh temp data dir and a free
127.0.0.1 port (or uses ``--broker chronoq://...``). The producer sends
``rate x --seconds`` messages due uniformly over a window that starts
``--lead`` s later (all sent before it starts, with ``send_batch``). One
consumer thread long-polls (``pull(--pull-max, 100)``) and hands each batch to
an ack thread, so acking never delays the next pull, as a dispatcher with worker
threads does. Lateness per message: the wall time (ms) when ``pull`` returned it
minus its ``deliver_at_ms``, nearest-rank percentiles. ``--inline-acks`` acks
on the pulling thread instead (as ``bench/timer_load.py`` does).

Run from the project root::

    .venv/bin/python bench/remote_lateness.py                # 5,000/s for 20 s
    .venv/bin/python bench/remote_lateness.py --inline-acks
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.remote_send import start_server, stop_server
from bench.stats import format_percentiles, percentiles
from broker_adapter import Message, open_broker
from broker_adapter.base import Consumer
from broker_adapter.results import ReceivedMessage


def consume(
    c: Consumer,
    stop: threading.Event,
    pull_max: int,
    inline: bool,
    lateness: list[float],
    ids: set[str],
) -> None:
    """Pull until ``stop``; record lateness and ids; ack inline or on a helper thread."""
    acks: queue.Queue[list[ReceivedMessage] | None] = queue.Queue()

    def acker() -> None:
        while (batch := acks.get()) is not None:
            for m in batch:
                c.ack(m)

    helper = threading.Thread(target=acker, daemon=True)
    helper.start()
    while not stop.is_set():
        got = c.pull(pull_max, 100)
        if not got:
            continue
        now = time.time() * 1000
        lateness.extend(now - m.deliver_at_ms for m in got)
        ids.update(m.msg_id for m in got)
        if inline:
            for m in got:
                c.ack(m)
        else:
            acks.put(got)
    acks.put(None)
    helper.join(30)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--broker", help="chronoq:// URL (default: start a server)")
    p.add_argument("--rate", type=int, default=5_000, help="fires per second")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the firing window")
    p.add_argument("--lead", type=float, default=5.0, help="s from start to the window")
    p.add_argument("--pull-max", type=int, default=256)
    p.add_argument("--inline-acks", action="store_true", help="ack on the pulling thread")
    p.add_argument("--body-size", type=int, default=100)
    args = p.parse_args(argv)
    tmp = proc = None
    url = args.broker
    if url is None:
        tmp = tempfile.mkdtemp(prefix="chronoq-bench-")
        proc, url = start_server(os.path.join(tmp, "data"))
    topic = f"bench.lateness.{os.getpid()}"
    n = int(args.rate * args.seconds)
    try:
        with open_broker(url) as broker:
            c = broker.consumer(f"bench-lateness-{os.getpid()}", [topic], max_inflight=10_000)
            lateness: list[float] = []
            got: set[str] = set()
            stop = threading.Event()
            t = threading.Thread(
                target=consume, args=(c, stop, args.pull_max, args.inline_acks, lateness, got)
            )
            t.start()
            start = int(time.time() * 1000) + int(args.lead * 1000)
            span = int(args.seconds * 1000)
            rand = random.Random(1).random
            body = b"x" * args.body_size
            sent: set[str] = set()
            for i in range(0, n, 1000):
                msgs = [
                    Message(topic, body, deliver_at_ms=start + int(rand() * span))
                    for _ in range(min(1000, n - i))
                ]
                sent.update(r.msg_id for r in broker.send_batch(msgs))
            sent_by = int(time.time() * 1000)
            deadline = time.monotonic() + args.lead + args.seconds + 15
            while len(got) < len(sent) and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            t.join(30)
            c.close()
        pct = percentiles(lateness)
        print(f"== chronoq remote_lateness: {url} ==")
        print(
            f"  messages      {n:,} due uniformly over {args.seconds:g} s "
            f"({args.rate:,}/s), sends done {start - sent_by} ms before the first"
        )
        print(
            f"  acks          {'inline on the pulling thread' if args.inline_acks else 'on a helper thread'}"
        )
        print(f"  lateness ms   {format_percentiles(pct)}")
        print(f"  lost          {len(sent - got)} of {len(sent):,}")
        return 1 if sent - got else 0
    finally:
        if proc is not None:
            stop_server(proc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
