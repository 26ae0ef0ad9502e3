"""Acknowledged sends lost when ``redis-server`` is killed with SIGKILL (issue 18 §5).

For each ``appendfsync`` setting (``--fsync everysec|always|both``), one
``redis-server --appendonly yes --appendfsync X`` child on a free 127.0.0.1 port
(its own directory), then ``--kills`` cycles of:

1. ``--threads`` threads send keyed messages (due an hour ahead, so they stay
   pending) one by one with ``RedisBroker.send`` for ``--load-s`` seconds, each
   recording the ids Redis acknowledged (``OK``, or ``DUPLICATE`` for a keyed resend
   of a send whose reply was lost) and when;
2. ``kill -9`` of the redis-server while they send; it is started again on the same
   directory and port (it replays its append-only file), the broker reconnects by
   itself;
3. every id acknowledged in the cycle is looked up (``query``): one that is gone was
   acknowledged, then lost.

Printed per cycle: sends acknowledged, lost, and how long before the kill the lost
ones had been acknowledged (the window a crash takes); then the totals and the load
average. ``everysec`` loses what the last second (or two) wrote; ``always`` loses none.

Run from the project root::

    .venv/bin/python bench/redis_fsync_loss.py                  # both, 5 kills each
    .venv/bin/python bench/redis_fsync_loss.py --fsync everysec --kills 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker_adapter.errors import BrokerError
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.results import SendStatus

TOPIC = "bench.fsync"


class Senders:
    """Threads sending keyed messages one by one, recording acknowledged ids."""

    def __init__(self, broker: RedisBroker, threads: int, cycle: int) -> None:
        self._broker = broker
        self._cycle = cycle
        self._stop = threading.Event()
        self.acked: list[tuple[str, float]] = []  # (id, monotonic time of the answer)
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            key = f"c{self._cycle}:t{n}:{i}"
            try:
                r = self._broker.send(Message(TOPIC, b"x" * 100, key=key, delay_ms=3_600_000))
            except BrokerError:
                time.sleep(0.01)  # Redis is down: not acknowledged; the same key again
                continue
            if r.status in (SendStatus.OK, SendStatus.DUPLICATE):
                with self._lock:
                    self.acked.append((r.msg_id, time.monotonic()))
            i += 1


def run_setting(fsync: str, kills: int, load_s: float, threads: int, workdir: Path) -> int:
    """Kill cycles against one setting; returns the acknowledged sends lost in all."""
    from tests.redis_server import RedisServer

    server = RedisServer(workdir / fsync, appendfsync=fsync).start()
    broker = RedisBroker.from_url(server.url + "?fire=0")
    total_acked = total_lost = 0
    print(f"#### appendfsync {fsync} (load average {os.getloadavg()[0]:.2f})", flush=True)
    try:
        for cycle in range(kills):
            senders = Senders(broker, threads, cycle)
            senders.start()
            time.sleep(load_s)
            killed_at = time.monotonic()
            server.kill()
            time.sleep(0.3)
            server.start()
            time.sleep(0.5)  # sends go on against the restarted server
            senders.stop()
            before = [(mid, t) for mid, t in senders.acked if t < killed_at]
            lost = [(mid, t) for mid, t in before if broker.query(mid) is None]
            total_acked += len(before)
            total_lost += len(lost)
            window = max((killed_at - t) * 1000 for _, t in lost) if lost else 0.0
            rate = len(before) / load_s
            print(
                f"kill {cycle + 1}: {len(before):,} sends acknowledged before the kill "
                f"({rate:,.0f}/s), {len(lost)} lost; oldest lost acknowledged "
                f"{window:.0f} ms before the kill",
                flush=True,
            )
    finally:
        broker.close()
        server.stop()
    per_kill = total_lost / kills if kills else 0.0
    print(
        f"appendfsync {fsync}: {total_lost} of {total_acked:,} acknowledged sends lost over "
        f"{kills} kills ({per_kill:.0f} per kill); load average {os.getloadavg()[0]:.2f}\n",
        flush=True,
    )
    return total_lost


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsync", choices=["everysec", "always", "both"], default="both")
    parser.add_argument("--kills", type=int, default=5, help="kill cycles per setting")
    parser.add_argument("--load-s", type=float, default=3.0, help="sending before each kill")
    parser.add_argument("--threads", type=int, default=2, help="sending threads")
    args = parser.parse_args(argv)
    settings = ["everysec", "always"] if args.fsync == "both" else [args.fsync]
    with tempfile.TemporaryDirectory(prefix="chronoq-fsync-") as tmp:
        for fsync in settings:
            run_setting(fsync, args.kills, args.load_s, args.threads, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
