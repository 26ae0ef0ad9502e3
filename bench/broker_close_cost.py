"""How long opening and closing a broker takes, per adapter (the suite's budget, and
how long an app's shutdown waits on the broker).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/broker_close_cost.py              # 20 rounds per adapter
    .venv/bin/python bench/broker_close_cost.py --rounds 50

Each round opens a broker on a manual clock (the embedded one on a fresh directory,
the Redis one on a ``redis-server`` child on loopback, flushed between rounds),
sends one message, pulls it once due, then closes the consumer and the broker; it
prints the median and the maximum of the open and of the close, in ms. A close
that waits for a background thread's poll timeout shows here as a close near
that timeout (the Redis listener's pub/sub read, 0.2 s, before its stop channel).
The last row is the Celery executor's result watcher (its pub/sub read, 0.2 s,
before its stop channel). A close's full garbage collection does not: it costs with the size of the heap,
small in this process (the embedded store collected at every close before
``embedded/dir_lock.py``; 67 ms per close on average inside the test suite).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis

from bench.stats import load_average
from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker

START_MS = 1_700_000_000_000


def _round(open_broker: Callable[[ManualClock], BrokerAdapter]) -> tuple[float, float]:
    """One open, send, pull and close; returns (open ms, close ms)."""
    clock = ManualClock(START_MS)
    t0 = time.perf_counter()
    broker = open_broker(clock)
    t1 = time.perf_counter()
    broker.send(Message(topic="t", body=b"x", delay_ms=10))
    consumer = broker.consumer("g", ["t"])
    clock.advance(20)
    if len(consumer.pull(max_messages=1, wait_ms=1000)) != 1:
        raise SystemExit("the due message was not pulled")
    consumer.close()
    t2 = time.perf_counter()
    broker.close()
    t3 = time.perf_counter()
    return (t1 - t0) * 1e3, (t3 - t2) * 1e3


def _row(name: str, rounds: int, open_broker: Callable[[ManualClock], BrokerAdapter]) -> None:
    opens, closes = zip(*(_round(open_broker) for _ in range(rounds)), strict=True)
    print(
        f"{name:<9} open median {statistics.median(opens):6.1f} max {max(opens):6.1f} ms"
        f"   close median {statistics.median(closes):6.1f} max {max(closes):6.1f} ms"
    )


def _watcher_row(url: str, rounds: int) -> None:
    """The Celery executor's result watcher on ``url``: started, subscribed, closed."""
    try:
        from celery import Celery
    except ImportError:
        print("celery    (not installed: pip install 'chronoq[celery]')")
        return
    from workers.celery.results import ResultWatcher

    app = Celery("close-cost", broker=url, backend=url)
    closes = []
    for _ in range(rounds):
        watcher = ResultWatcher(app)
        watcher.start()
        time.sleep(0.3)  # subscribed and reading by then
        t0 = time.perf_counter()
        watcher.close()
        closes.append((time.perf_counter() - t0) * 1e3)
    print(
        f"{'celery':<9} result watcher close median {statistics.median(closes):6.1f}"
        f" max {max(closes):6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from tests.redis_server import RedisServer  # the tests' own redis-server child

    print(f"load before: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = iter(range(1_000_000))
        _row(
            "embedded",
            args.rounds,
            lambda clock: EmbeddedBroker(str(root / f"e{next(dirs)}"), clock=clock),
        )
        server = RedisServer(root / "redis").start()
        try:
            flusher = redis.Redis.from_url(server.url)

            def open_redis(clock: ManualClock) -> BrokerAdapter:
                flusher.flushall()
                return RedisBroker.from_url(server.url, clock=clock)

            _row("redis", args.rounds, open_redis)
            flusher.close()
            _watcher_row(server.url, args.rounds)
        finally:
            server.stop()
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
