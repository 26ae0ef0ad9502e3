"""Runtime calls over ``chronoq://``: reschedule and find rates, and a big prefix abort.

Starts ``python -m broker_adapter.server`` on a fresh temp data dir (or uses
``--broker chronoq://...``), sends ``--n`` keyed messages due a day later, then
measures with the ``BrokerAdapter`` contract only:

* *reschedule by id* and *by key*: one sync call at a time from ``-p`` threads
  (each waits for its answer: one round trip per call);
* *async reschedule*: ``AsyncRemoteBroker`` with ``--coroutines`` at once on one loop;
* *find_pending*: walking every page (``limit=100``) by key prefix and by tag;
* *abort_prefix* of ``--abort-n`` keys under one prefix: its time, and meanwhile
  the fire lateness of probe messages a second client sends (due 20 ms after each
  send, one every 5 ms) and pulls: receive time minus due time.

Rates are calls (or messages) per second of wall time. Run from the project root::

    .venv/bin/python bench/remote_runtime_calls.py
    .venv/bin/python bench/remote_runtime_calls.py -p 1 -p 4 --abort-n 100000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.remote_send import start_server, stop_server, timed
from broker_adapter import Message, open_broker
from broker_adapter.base import BrokerAdapter
from broker_adapter.server.async_client import AsyncRemoteBroker

DAY_MS = 24 * 3600 * 1000


def fill(broker: BrokerAdapter, topic: str, prefix: str, n: int, tag: str) -> list[str]:
    """``n`` keyed messages ``{prefix}{i}`` due a day later; their ids."""
    ids: list[str] = []
    for start in range(0, n, 1000):
        batch = [
            Message(topic, b"x" * 64, key=f"{prefix}{i}", tags=tag, delay_ms=DAY_MS)
            for i in range(start, min(n, start + 1000))
        ]
        ids.extend(r.msg_id for r in broker.send_batch(batch))
    return ids


def rate(n: int, threads: int, call: Callable[[int], object]) -> float:
    """Calls per second of ``n`` calls ``call(i)`` spread over ``threads`` threads."""
    per = n // threads

    def work(t: int) -> None:
        for i in range(t * per, (t + 1) * per):
            call(i)

    return per * threads / timed(threads, work)


def async_rate(url: str, ids: list[str], coroutines: int) -> float:
    """Reschedules per second of the async client, ``coroutines`` at once."""

    async def main() -> float:
        client = AsyncRemoteBroker.from_url(url)
        per = len(ids) // coroutines

        async def work(c: int) -> None:
            for i in range(c * per, (c + 1) * per):
                await client.reschedule(ids[i], delay_ms=DAY_MS + 2 * i)

        try:
            await client.reschedule(ids[0], delay_ms=DAY_MS)  # connect first
            t0 = time.perf_counter()
            await asyncio.gather(*(work(c) for c in range(coroutines)))
            return per * coroutines / (time.perf_counter() - t0)
        finally:
            await client.close()

    return asyncio.run(main())


def walk(broker: BrokerAdapter, **filters: object) -> tuple[int, int, float]:
    """``(pages, messages, seconds)`` of walking every page of ``find_pending``."""
    pages = messages = 0
    cursor = None
    t0 = time.perf_counter()
    while True:
        page = broker.find_pending(limit=100, cursor=cursor, **filters)  # type: ignore[arg-type]
        pages += 1
        messages += len(page.messages)
        cursor = page.cursor
        if cursor is None:
            return pages, messages, time.perf_counter() - t0


def abort_under_probes(url: str, admin: BrokerAdapter, n: int) -> None:
    """Time an ``abort_prefix`` of ``n`` keys while probes fire; print both."""
    fill(admin, "bulk", "tenant:9:", n, "bulk")
    probe = open_broker(url)
    consumer = probe.consumer("probe-g", ["probe"])
    stop = threading.Event()
    late: list[tuple[float, float]] = []  # (receive wall ms, lateness ms)

    def send() -> None:
        while not stop.is_set():
            probe.send(Message("probe", b"p", delay_ms=20))
            time.sleep(0.005)

    def pull() -> None:
        while not stop.is_set():
            for m in consumer.pull(64, 100):
                now = time.time() * 1000
                late.append((now, now - m.deliver_at_ms))
                consumer.ack(m)

    threads = [threading.Thread(target=send), threading.Thread(target=pull)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # a baseline second of probes
    t0 = time.time() * 1000
    result = admin.abort_prefix("bulk", "tenant:9:")
    t1 = time.time() * 1000
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    consumer.close()
    probe.close()
    during = sorted(x for at, x in late if t0 <= at <= t1 + 50)
    before = sorted(x for at, x in late if at < t0)
    print(f"abort_prefix of {result.aborted:,} keys: {t1 - t0:,.0f} ms")
    for label, xs in (("before", before), ("during", during)):
        if xs:
            p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
            print(
                f"  probe lateness {label}: n={len(xs)} p50={statistics.median(xs):.1f} ms "
                f"p99={p99:.1f} ms max={xs[-1]:.1f} ms"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--broker", help="chronoq://host:port of a running server (else start one)")
    ap.add_argument("--n", type=int, default=20_000, help="messages to reschedule and find")
    ap.add_argument("-p", "--threads", type=int, action="append", help="client threads")
    ap.add_argument("--coroutines", type=int, default=64, help="async reschedules at once")
    ap.add_argument("--abort-n", type=int, default=100_000, help="keys under the aborted prefix")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="chronoq-bench-")
    proc = None
    url = args.broker
    if url is None:
        proc, url = start_server(os.path.join(tmp, "data"))
    try:
        with open_broker(url) as broker:
            ids = fill(broker, "orders", "order:", args.n, "close_order")
            print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; n={args.n:,}")
            for threads in args.threads or [1, 4]:
                by_id = rate(
                    args.n, threads, lambda i: broker.reschedule(ids[i], delay_ms=DAY_MS + i)
                )
                by_key = rate(
                    args.n,
                    threads,
                    lambda i: broker.reschedule(key=f"order:{i}", topic="orders", delay_ms=DAY_MS),
                )
                print(
                    f"reschedule, {threads} thread(s): by id {by_id:,.0f}/s, by key {by_key:,.0f}/s"
                )
            print(
                f"reschedule, async, {args.coroutines} coroutines: "
                f"{async_rate(url, ids, args.coroutines):,.0f}/s"
            )
            for label, filters in (
                ("key prefix", {"topic": "orders", "key_prefix": "order:"}),
                ("tag", {"tag": "close_order"}),
            ):
                pages, found, secs = walk(broker, **filters)
                print(
                    f"find_pending by {label}: {found:,} messages in {pages} pages, "
                    f"{pages / secs:,.0f} pages/s, {found / secs:,.0f} messages/s"
                )
            abort_under_probes(url, broker, args.abort_n)
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
