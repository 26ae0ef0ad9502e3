"""The asyncio client under load: 1,000 coroutines scheduling on each broker, the
schedules per second, and the event loop's lag while they run (target: P99 <= 1 ms).

Per broker (``--broker embedded|remote|redis``, default all three) one app
(``Scheduler``) schedules runs of a job with ``schedule_async``, each with its
own key, due an hour later (nothing fires). A ticker coroutine sleeps 1 ms
again and again and records how late each wake-up is: the loop lag, what any
other coroutine of the app (an HTTP handler) waits for its turn.

``--mode sustained`` (default): ``--n`` coroutines each schedule again and
again (await one ``schedule_async``, then the next) for ``--seconds`` after
``--warmup`` seconds; the ticker runs throughout (hundreds to thousands of
ticks). Before the load, the ticker runs alone on the same loop for
``--idle`` seconds: its P99 is the machine's floor (timer slack, other
processes), the reference for the target. Printed: schedules/s in the window,
lag P50 / P99 / P99.9 / max and ticks, the idle P99, and the 1-minute load
average when the broker's run started (the machine is shared).

``--mode burst``: ``--rounds`` rounds, each starting ``--n`` tasks at once
(``asyncio.gather``), one ``schedule_async`` each. Only ~20 ticks in all, so
its "P99" is the max, and that is the one loop turn in which all ``--n``
tasks take their first step (creating the task, building and checking the
message, queueing the send: ~10-30 us each, so 1,000 of them cost 10-30 ms
whatever the client does). It shows a burst's start cost, not the lag of a
loaded app.

Both modes check the answers: every ``msg_id`` unique, none a duplicate.

The brokers are started here on loopback: the embedded broker in a temp
directory (``rocksdb://``: the app's own broker handed to threads), a
``chronoq broker serve`` child (``chronoq://``: the native asyncio client) and
a ``redis-server`` child on a free port (``redis://``: ``redis.asyncio``).

Run from the project root::

    .venv/bin/python bench/async_client.py                    # all three, sustained
    .venv/bin/python bench/async_client.py --broker redis --seconds 10
    .venv/bin/python bench/async_client.py --mode burst --n 1000 --rounds 5
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
from bench.stats import ms, percentiles
from scheduler import Scheduler

BROKERS = ("embedded", "remote", "redis")
TICK_S = 0.001
LAG_PS = (50.0, 99.0, 99.9)


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


def check_answers(ids: Sequence[str], duplicates: int, expected: int) -> None:
    """Exit unless there are ``expected`` answers, their ``ids`` unique, none a duplicate."""
    if len(ids) != expected or len(set(ids)) != expected:
        raise SystemExit(f"wrong answers: {len(ids)} of {expected}, or ids not unique")
    if duplicates:
        raise SystemExit(f"wrong answers: {duplicates} duplicates")


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
    check_answers([r.msg_id for r in receipts], sum(r.duplicate for r in receipts), n)
    return elapsed, lags


async def burst(app: Scheduler, n: int, rounds: int) -> dict[str, Any]:
    """``rounds`` bursts of ``n`` schedules: the median rate and every round's lags."""
    rates, lags = [], []
    for r in range(rounds):
        elapsed, round_lags = await one_round(app, n, r)
        rates.append(n / elapsed)
        lags.extend(round_lags)
    return {"rate": sorted(rates)[len(rates) // 2], "lag": percentiles(lags, LAG_PS)}


async def idle_lags(seconds: float) -> list[float]:
    """The ticker alone on this loop for ``seconds``: the machine's floor."""
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(lags, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await tick
    return lags


async def sustained(app: Scheduler, n: int, seconds: float, warmup: float) -> dict[str, Any]:
    """``n`` coroutines scheduling one after another: the rate and lags of a window of
    ``seconds`` after ``warmup`` seconds, with every answer checked at the end."""
    job = app.handle("bench.async_client.touch")
    done = [0]  # schedules answered so far, by all workers
    running = True

    ids: list[str] = []  # strings: no work for the garbage collector (receipts would be)
    duplicates = 0

    async def worker(w: int) -> None:
        nonlocal duplicates
        seq = 0
        while running:
            receipt = await job.schedule_async(seq, delay=3600, key=f"s{w}:{seq}")
            ids.append(receipt.msg_id)
            duplicates += receipt.duplicate
            seq += 1
            done[0] += 1

    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(lags, stop))
    workers = [asyncio.create_task(worker(w)) for w in range(n)]
    await asyncio.sleep(warmup)
    lags.clear()
    count0, t0 = done[0], time.perf_counter()
    await asyncio.sleep(seconds)
    count1, elapsed = done[0], time.perf_counter() - t0
    window = list(lags)
    running = False
    stop.set()
    await asyncio.gather(*workers)
    await tick
    check_answers(ids, duplicates, done[0])
    return {"rate": (count1 - count0) / elapsed, "lag": percentiles(window, LAG_PS)}


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one broker at ``url`` in ``args.mode``."""
    app = Scheduler(url, topic="bench.async")

    @app.job(name="bench.async_client.touch")
    def touch(i: int) -> None: ...

    try:
        await touch.schedule_async(-1, delay=3600, key="warm")  # opens the client
        idle = percentiles(await idle_lags(args.idle), LAG_PS)
        if args.mode == "burst":
            fig = await burst(app, args.n, args.rounds)
        else:
            fig = await sustained(app, args.n, args.seconds, args.warmup)
        fig["idle_p99"] = idle["p99"]
        fig["client"] = type(await app.async_broker()).__name__
    finally:
        await app.aclose()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--broker", choices=BROKERS, action="append", help="repeatable; default all")
    p.add_argument("--mode", choices=("sustained", "burst"), default="sustained")
    p.add_argument("--n", type=int, default=1000, help="coroutines scheduling at once")
    p.add_argument("--seconds", type=float, default=3.0, help="sustained: measured window")
    p.add_argument("--warmup", type=float, default=0.5, help="sustained: seconds before it")
    p.add_argument("--idle", type=float, default=0.5, help="idle ticker seconds before the load")
    p.add_argument("--rounds", type=int, default=5, help="burst: rounds (median rate)")
    args = p.parse_args(argv)
    shape = f"{args.seconds:g} s" if args.mode == "sustained" else f"{args.rounds} rounds"
    load = os.getloadavg()
    print(
        f"== chronoq async_client: {args.mode}, {args.n} coroutines, {shape}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} =="
    )
    print(
        f"{'broker':<9} {'client':<20} {'sched/s':>8} {'idle p99':>8} {'lag p50':>8} "
        f"{'p99':>7} {'p99.9':>7} {'max':>7} {'ticks':>6} {'load':>5}"
    )
    tmp = tempfile.mkdtemp(prefix="chronoq-bench-async-")
    try:
        for kind in args.broker or BROKERS:
            with broker_url(kind, tmp) as url:
                load1 = os.getloadavg()[0]
                fig = asyncio.run(measure(url, args))
            lag = fig["lag"]
            print(
                f"{kind:<9} {fig['client']:<20} {fig['rate']:>8,.0f} {ms(fig['idle_p99']):>8} "
                f"{ms(lag['p50']):>8} {ms(lag['p99']):>7} {ms(lag['p99.9']):>7} "
                f"{ms(lag['max']):>7} {int(lag['count']):>6} {load1:>5.2f}",
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("lag in ms (P99 target <= 1 ms); idle p99: the ticker alone on the same loop")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
