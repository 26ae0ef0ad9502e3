"""What one ``pull.lua`` round trip costs, fixed per call and per message (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/redis_call_cost.py                 # 2,000 calls per row
    .venv/bin/python bench/redis_call_cost.py --calls 5000 --sizes 0,1,4,16

On a fresh ``redis-server`` child (loopback, no persistence) it times, per call, the
client's CPU (this process, ``time.process_time``), the server's CPU (user + system,
psutil) and the wall time of:

* ``PING`` and ``EVALSHA`` of ``return 1``: the fixed cost of a round trip (syscalls,
  command dispatch, the RESP parser: redis-py's own, or hiredis when installed);
* the steady state of a dispatcher's pull on one instance: one ``pull.lua`` call that
  carries the acks of the previous call's messages, fires the ``k`` messages due in
  that millisecond and claims them (``k`` per row, a broker on a manual clock sends
  them beforehand, so nothing else runs meanwhile).

The rows give the split of a job's Redis cost: ``fixed + k x per message`` per call;
with ``k`` jobs per call (a dispatcher at 3,300 jobs/s pulls ~3 per ms) the fixed
part is divided by ``k``. Compare with and without hiredis in one session (the parser
is printed; ``PYTHONPATH`` to a directory holding hiredis switches it on).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # type: ignore[import-untyped]
import redis
import redis.utils

from bench.stats import load_average
from broker_adapter.clock import ManualClock
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.keys import DEFAULT_PREFIX, Keyspace
from broker_adapter.redis.scripts import Scripts, Step

T0 = 1_700_000_000_000
RETENTION = 3_600_000


def measure(server: psutil.Process, calls: int, one: Callable[[int], Any]) -> tuple[float, ...]:
    """``one(i)`` for i in 0..calls-1: client CPU, server CPU and wall us per call."""
    s0 = server.cpu_times()
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(calls):
        one(i)
    c1, w1 = time.process_time(), time.perf_counter()
    s1 = server.cpu_times()
    srv = (s1.user + s1.system) - (s0.user + s0.system)
    return ((c1 - c0) / calls * 1e6, srv / calls * 1e6, (w1 - w0) / calls * 1e6)


def pull_rows(url: str, server: psutil.Process, calls: int, k: int) -> tuple[float, ...]:
    """The steady-state pull of ``k`` messages per call, ``calls`` calls."""
    client = redis.Redis.from_url(url)
    client.flushall()
    broker = RedisBroker.from_url(url, clock=ManualClock(T0), shards=1)
    try:
        broker.consumer("g", ["t"])
        body = b"x" * 100
        msgs = [Message("t", body, deliver_at_ms=T0 + 1 + i // k) for i in range(calls * k)]
        for i in range(0, len(msgs), 1000):
            broker.send_batch(msgs[i : i + 1000])
        scripts = Scripts(client)
        keys = Keyspace.build(DEFAULT_PREFIX, 1)
        base, due_keys = keys.bases[0], keys.due_keys
        held: list[Any] = []

        def one(i: int) -> None:
            now = T0 + 1 + i
            steps: list[Step] = []
            if held:
                acks: list[Any] = [base, len(held)]
                for row in held:
                    acks += [row[0], b"%d:%d" % (row[8], row[10])]
                steps.append(("ack_batch", [0], ("g",), [acks]))
            steps.append(("fire", [0], (now, 1000, RETENTION, "", "bench"), [(base, 0, 0)]))
            steps.append(("claim", [0], ("g", now + 60_000, RETENTION), [(base, 256)]))
            held[:] = scripts.fan_steps(due_keys, steps)[-1][0]
            assert len(held) == k, (len(held), k)

        return measure(server, calls, one)
    finally:
        broker.close()
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per row")
    p.add_argument("--sizes", default="1,4,16", help="messages per pull call, per row")
    args = p.parse_args(argv)
    from tests.redis_server import RedisServer

    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "redis-py's Python parser"
    with tempfile.TemporaryDirectory(prefix="chronoq-bench-") as tmp:
        srv = RedisServer(Path(tmp) / "r").start()
        assert srv.proc is not None
        server = psutil.Process(srv.proc.pid)
        try:
            client = redis.Redis.from_url(srv.url)
            sha = client.script_load("return 1")
            rows = [
                ("PING", measure(server, args.calls, lambda _i: client.ping())),
                (
                    "EVALSHA return 1",
                    measure(server, args.calls, lambda _i: client.evalsha(sha, 0)),
                ),
            ]
            for k in (int(x) for x in args.sizes.split(",")):
                rows.append((f"pull.lua, {k} per call", pull_rows(srv.url, server, args.calls, k)))
            client.close()
        finally:
            srv.stop()
    print(f"== redis_call_cost: {args.calls:,} calls per row, {parser}, load {load_average()} ==")
    print(f"{'call':28} {'client CPU':>11} {'server CPU':>11} {'wall':>8}   us per call")
    for name, (c, s, w) in rows:
        print(f"{name:28} {c:11.1f} {s:11.1f} {w:8.1f}")
    print("per message (pull rows: slope between the first and last size):")
    pulls = [(int(x), r) for x, (_n, r) in zip(args.sizes.split(","), rows[2:], strict=True)]
    if len(pulls) > 1:
        (k0, r0), (k1, r1) = pulls[0], pulls[-1]
        slope = [(b - a) / (k1 - k0) for a, b in zip(r0, r1, strict=True)]
        fixed = [a - k0 * s for a, s in zip(r0, slope, strict=True)]
        print(f"{'  fixed per call':28} {fixed[0]:11.1f} {fixed[1]:11.1f} {fixed[2]:8.1f}")
        print(f"{'  per message':28} {slope[0]:11.1f} {slope[1]:11.1f} {slope[2]:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
