"""The asyncio client under load: N coroutines scheduling at once, and the event
loop's lag while they run.

For each broker (``--broker embedded|remote|redis``, default all three), one
app (``Scheduler``) schedules ``--n`` runs of a job with ``schedule_async``,
all started together (``asyncio.gather``), each with its own key, due an hour
later (nothing fires). Meanwhile a ticker coroutine sleeps 1 ms in a loop and
records how late each wake-up is (the loop lag: what any other coroutine of
the app would wait). Prints, per broker, schedules per second of wall time and
the lag P50 / P99 / max over ``--rounds`` rounds (the target: P99 <= 1 ms).

The brokers are started here on loopback: the embedded broker in a temp
directory (``rocksdb://``: the app's own broker handed to threads), a
``chronoq broker serve`` child (``chronoq://``: the native asyncio client) and
a ``redis-server`` child on a free port (``redis://``: ``redis.asyncio``).

Run from the project root::

    .venv/bin/python bench/async_client.py                    # all three, n=1000
    .venv/bin/python bench/async_client.py --broker redis --n 5000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.remote_send import start_server, stop_server
from bench.stats import percentiles
from scheduler import Scheduler

BROKERS = ("embedded", "remote", "redis")
TICK_S = 0.001


@contextmanager
def broker_url(kind: str, tmp: str) -> Iterator[str]:
    """A URL of a fresh broker of ``kind``, up for the ``with`` block."""
    if kind == "embedded":
        yield f"rocksdb://{os.path.join(tmp, 'embedded')}?share=0"
    elif kind == "remote":
        proc, url = start_server(os.path.join(tmp, "server"))
        try:
            yield url
        finally:
            stop_server(proc)
    else:
        with redis_server() as url:
            yield url


@contextmanager
def redis_server() -> Iterator[str]:
    """A ``redis-server`` child on a free 127.0.0.1 port, without persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


async def ticker(lags: list[float], stop: asyncio.Event) -> None:
    """Sleep ``TICK_S`` again and again; record each wake-up's overshoot (ms)."""
    clock = time.perf_counter
    while not stop.is_set():
        t0 = clock()
        await asyncio.sleep(TICK_S)
        lags.append((clock() - t0 - TICK_S) * 1000)


async def one_round(app: Scheduler, n: int, round_no: int) -> tuple[float, list[float]]:
    """Schedule ``n`` runs at once; wall seconds and the loop lags seen meanwhile."""
    job = app.handle("bench.async_client.touch")
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(lags, stop))
    await asyncio.sleep(0.01)  # the ticker is running before the load starts
    lags.clear()
    t0 = time.perf_counter()
    receipts = await asyncio.gather(
        *(job.schedule_async(i, delay=3600, key=f"r{round_no}:{i}") for i in range(n))
    )
    elapsed = time.perf_counter() - t0
    stop.set()
    await tick
    if len({r.msg_id for r in receipts}) != n or any(r.duplicate for r in receipts):
        raise SystemExit("wrong answers: ids not unique or a duplicate")
    return elapsed, lags


async def measure(url: str, n: int, rounds: int) -> dict[str, Any]:
    """Figures of ``rounds`` rounds of ``n`` concurrent schedules through ``url``."""
    app = Scheduler(url, topic="bench.async")

    @app.job(name="bench.async_client.touch")
    def touch(i: int) -> None: ...

    try:
        await touch.schedule_async(-1, delay=3600, key="warm")  # opens the client
        rates, lags = [], []
        for r in range(rounds):
            elapsed, round_lags = await one_round(app, n, r)
            rates.append(n / elapsed)
            lags.extend(round_lags)
        native = type(await app.async_broker()).__name__
    finally:
        await app.aclose()
    lag = percentiles(lags, (50.0, 99.0))
    return {"rate": sorted(rates)[len(rates) // 2], "lag": lag, "client": native}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--broker", choices=BROKERS, action="append", help="repeatable; default all")
    p.add_argument("--n", type=int, default=1000, help="concurrent schedules per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds per broker (median rate)")
    args = p.parse_args(argv)
    print(f"== chronoq async_client: {args.n} coroutines x {args.rounds} rounds ==")
    print(
        f"{'broker':<10} {'client':<20} {'schedules/s':>12} "
        f"{'lag p50 ms':>11} {'lag p99 ms':>11} {'lag max ms':>11} {'ticks':>6}"
    )
    tmp = tempfile.mkdtemp(prefix="chronoq-bench-async-")
    try:
        for kind in args.broker or BROKERS:
            with broker_url(kind, tmp) as url:
                fig = asyncio.run(measure(url, args.n, args.rounds))
            lag = fig["lag"]
            print(
                f"{kind:<10} {fig['client']:<20} {fig['rate']:>12,.0f} {lag['p50']:>11.3f} "
                f"{lag['p99']:>11.3f} {lag['max']:>11.3f} {int(lag['count']):>6}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
