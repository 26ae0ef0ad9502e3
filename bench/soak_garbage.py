"""Garbage at a real ``chronoq broker serve`` child while a good client works
(issue 18 §6).

Two phases, on many short connections from eight loopback source addresses
(127.0.1.1-8, so the client side never runs out of ports):

1. ``--frames`` garbage frames (default 100,000), one connection each, half of them
   after a correct hello: random bytes with a matching length, random bytes with
   no frame at all, length prefixes of 0, just over the 8 MiB limit or 2**32-1,
   and truncated frames (a length, fewer bytes, then the end of the stream). Some
   carry more garbage behind the first bad frame; the server must close the
   connection at the first one.
2. ``--requests`` malformed-but-framed requests (default 10,000), one per
   connection after a correct hello (the server closes a connection at a request it
   cannot take, dropping the answers of requests pipelined before it): bytes that are not msgpack, msgpack of
   the wrong shape, unknown operations, known operations with arguments of the
   wrong types, and huge values (a 600-character key, a 200-character topic, a body
   over the server's ``max_body``, counts of 2**63, a ``send_batch`` of 5,000
   wrong entries). None of them is valid, so none may store anything.

Meanwhile a good client (one ``RemoteBroker``, connected before) sends, pulls and
acks one message at a time on its own topic and group. Printed: per phase the
frames/requests sent, connections the server closed, error answers by class, OK
answers; whether the server is still up and how many lines it logged; the broker's state before and after
(stats and pending list, the good client's topic and group left out): equal or
not; the good client's round trips, errors, and latency P50/P99/max (ms); the load
average. Exit 1 when the server died, the state changed, a malformed request was
answered OK, or the good client saw an error.

Run from the project root::

    .venv/bin/python bench/soak_garbage.py
    .venv/bin/python bench/soak_garbage.py --frames 10000 --requests 1000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgpack

from bench.stats import format_percentiles, percentiles, print_block
from broker_adapter.message import Message
from broker_adapter.results import ReceivedMessage
from broker_adapter.server import protocol as P
from broker_adapter.server.client import RemoteBroker

TOKEN = "soak-garbage-token"
SOURCES = [f"127.0.1.{i}" for i in range(1, 9)]
GOOD_TOPIC, GOOD_GROUP = "good", "good-group"
THREADS = 4


def garbage_frame(rng: random.Random) -> bytes:
    """One garbage frame (or not even a frame), maybe with more garbage behind it."""
    kind = rng.randrange(6)
    if kind == 0:  # random bytes behind a matching length
        body = rng.randbytes(rng.randrange(1, 200))
        data = P.HEADER.pack(len(body)) + body
    elif kind == 1:  # a length prefix of 0, over the limit, or the largest
        data = P.HEADER.pack(rng.choice([0, P.MAX_FRAME + 1, 2**32 - 1]))
    elif kind == 2:  # truncated: the length promises more than comes
        body = msgpack.packb([0, 1, "stats", {}])
        data = P.HEADER.pack(len(body) + rng.randrange(1, 1000)) + body
    elif kind == 3:  # a header cut short
        data = rng.randbytes(rng.randrange(1, 4))
    elif kind == 4:  # random bytes, no framing at all
        data = rng.randbytes(rng.randrange(4, 300))
    else:  # a length just below the limit, then a few bytes (truncated, large)
        data = P.HEADER.pack(P.MAX_FRAME) + rng.randbytes(64)
    if rng.random() < 0.3:
        data += rng.randbytes(rng.randrange(1, 100))
    return data


def bad_request(rng: random.Random, rid: int, max_body: int) -> bytes:
    """One framed request that is malformed or invalid (never a valid one)."""
    kind = rng.randrange(5)
    if kind == 0:  # a correct length, bytes that are not msgpack (0xc1 is never valid)
        body = b"\xc1" + rng.randbytes(rng.randrange(0, 50))
        return P.HEADER.pack(len(body)) + body
    if kind == 1:  # msgpack of the wrong shape
        return P.frame(rng.choice([None, 7, "x", [], [0], [0, rid, "send"], {"op": "send"},
                                   [2, rid, "stats", {}], [0, -1, "stats", {}],
                                   [0, rid, "stats", []], [0, 2**64 - 1, "stats", {}]]))  # fmt: skip
    if kind == 2:  # an unknown operation
        return P.request(rid, rng.choice(["drop_everything", "SEND", "", "flushall"]), {})
    if kind == 3:  # known operations, arguments of the wrong types
        wrong: list[tuple[str, dict[str, Any]]] = [
            ("send", {"m": 5}),
            ("send", {"m": ["t", b"x"]}),
            ("send", {"m": [1, b"x", None, None, None, None, None, None, None]}),
            ("send_batch", {"ms": "x"}),
            ("abort", {"id": 3}),
            ("abort", {"key": 5, "topic": None}),
            ("query", {"id": [1]}),
            ("pull", {"cid": "c", "max": "x", "wait": None}),
            ("ack", {"cid": "c", "receipt": 1}),
            ("consumer_open", {"group": 1, "topics": "t"}),
            ("pending", {"topic": 5, "limit": "x"}),
            ("reschedule", {"id": 5, "delay": "soon"}),
            ("abort_prefix", {"topic": "t", "prefix": 5}),
            ("count_pending", {"edges": "x", "topic": None}),
            ("backup", {"dest": 5}),
        ]
        op, args = rng.choice(wrong)
        return P.request(rid, op, args)
    m: list[Any] = ["garbage", b"x", None, None, None, None, None, None, None]
    choice = rng.randrange(6)  # huge values, each invalid
    if choice == 0:
        m[2] = "k" * 600  # key over 512 characters
    elif choice == 1:
        m[0] = "t" * 200  # topic over 127 characters
    elif choice == 2 and rng.random() < 0.05:  # a body over max_body (few: 4 MB each)
        m[1] = b"\0" * (max_body + 1)
    elif choice == 3:
        return P.request(rid, "pull", {"cid": 2**63 - 1, "max": 2**63, "wait": 2**63})
    elif choice == 4:
        return P.request(rid, "send_batch", {"ms": [[None] * 9] * 5000})
    else:
        m[5] = -(2**63)  # a negative delay
    return P.request(rid, "send", {"m": m})


def read_frames(sock: socket.socket) -> tuple[list[Any], bool]:
    """Every response frame until the server closes; and whether it did (``False``:
    the read timed out with the connection still open)."""
    buf = b""
    closed = True
    try:
        while chunk := sock.recv(65536):
            buf += chunk
    except TimeoutError:
        closed = False
    except OSError:
        pass  # reset by the server: closed too
    out = []
    while len(buf) >= 4:
        (n,) = P.HEADER.unpack_from(buf)
        if len(buf) < 4 + n:
            break
        out.append(msgpack.unpackb(buf[4 : 4 + n], raw=False, strict_map_key=False))
        buf = buf[4 + n :]
    return out, closed


def exchange(port: int, source: str, hello: bool, payload: bytes) -> tuple[list[Any], bool]:
    """Connect from ``source``, say hello if asked, send ``payload``, end the stream,
    read the answers until the server closes; the answers (hello's first) and
    whether the server closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as s:
        try:
            if hello:
                s.sendall(P.request(0, "hello", {"v": 1, "token": TOKEN}))
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # closed by the server while we were still sending
        return read_frames(s)


def count_answers(answers: list[Any], tally: Counter[str]) -> int:
    """Count error answers by class name and OK answers (hello's excluded); how many."""
    n = 0
    for a in answers:
        if isinstance(a, list) and len(a) == 4 and a[1] != 0:
            tally["answered OK" if a[2] == P.OK else f"error {a[3][0]}"] += 1
            n += 1
    return n


def phase(n_jobs: int, job: Callable[[int], tuple[int, Counter[str]]]) -> tuple[int, Counter[str]]:
    """Run ``job(worker_index)`` on :data:`THREADS` threads; sum what they return."""
    tally: Counter[str] = Counter()
    sent = 0
    with ThreadPoolExecutor(THREADS) as pool:
        for s, t in pool.map(job, range(n_jobs)):
            sent += s
            tally += t
    return sent, tally


class GoodClient(threading.Thread):
    """Sends, pulls and acks one message at a time; times each round trip."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.broker = RemoteBroker.from_url(url)
        self.consumer = self.broker.consumer(GOOD_GROUP, [GOOD_TOPIC])
        self.stop = threading.Event()
        self.latencies_ms: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        """Round trips until :attr:`stop` is set; errors are kept, not raised."""
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.broker.send(Message(GOOD_TOPIC, b"g"))
                got: list[ReceivedMessage] = []
                while not got:
                    got = self.consumer.pull(max_messages=1, wait_ms=1000)
                self.consumer.ack(got[0])
            except Exception as e:  # noqa: BLE001 - any error is a finding
                self.errors.append(repr(e))
                time.sleep(0.1)
                continue
            self.latencies_ms.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.005)


def state(broker: RemoteBroker) -> dict[str, Any]:
    """The broker's stats and pending ids, without the good client's topic and group."""
    st = broker.stats()
    return {
        "topics": {t: repr(v) for t, v in st.topics.items() if t != GOOD_TOPIC},
        "groups": {g: repr(v) for g, v in st.groups.items() if g != GOOD_GROUP},
        "pending": [v.msg_id for v in broker.pending(limit=1000) if v.topic != GOOD_TOPIC],
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both phases against one server child; the figures."""
    from tests.server.serverproc import ServerProcess

    server = ServerProcess(work / "data", token=TOKEN, log_path=work / "server.log").start()
    url = server.url
    good = GoodClient(url)
    try:
        seed = good.broker
        for i in range(100):  # state to keep: keyed messages due in an hour
            seed.send(Message("keep", b"%d" % i, key=f"keep-{i}", delay_ms=3_600_000))
        hello, _ = exchange(server.port, SOURCES[0], True, b"")  # what the server allows
        max_body = int(hello[0][3]["max_body"])
        before = state(seed)
        good.start()
        t0 = time.perf_counter()

        def frames_job(w: int) -> tuple[int, Counter[str]]:
            rng, tally = random.Random(w), Counter[str]()
            for i in range(args.frames // THREADS):
                source = SOURCES[(w * 7 + i) % len(SOURCES)]
                answers, closed = exchange(server.port, source, i % 2 == 1, garbage_frame(rng))
                count_answers(answers, tally)
                tally["closed by the server" if closed else "left open"] += 1
            return args.frames // THREADS, tally

        frames_sent, frames_tally = phase(THREADS, frames_job)
        t1 = time.perf_counter()

        def requests_job(w: int) -> tuple[int, Counter[str]]:
            rng, tally = random.Random(1000 + w), Counter[str]()
            for i in range(args.requests // THREADS):
                source = SOURCES[(w * 5 + i) % len(SOURCES)]
                answers, closed = exchange(server.port, source, True, bad_request(rng, 1, max_body))
                if not count_answers(answers, tally):
                    tally["no answer"] += 1
                tally["closed by the server" if closed else "left open"] += 1
            return args.requests // THREADS, tally

        requests_sent, requests_tally = phase(THREADS, requests_job)
        t2 = time.perf_counter()
        good.stop.set()
        good.join(30)
        alive = server.alive()
        after = state(seed)
    finally:
        good.stop.set()
        good.consumer.close()
        good.broker.close()
        server.stop()
    return {
        "frames": frames_sent,
        "frames_seconds": t1 - t0,
        "frames_answers": dict(frames_tally),
        "requests": requests_sent,
        "requests_seconds": t2 - t1,
        "requests_answers": dict(requests_tally),
        "server_alive": alive,
        "state_unchanged": before == after,
        "state_before": before if before != after else None,
        "state_after": after if before != after else None,
        "good_round_trips": len(good.latencies_ms),
        "good_errors": good.errors[:10],
        "good_latency_ms": percentiles(good.latencies_ms, (50.0, 99.0)),
        "server_log_lines": len((work / "server.log").read_text(errors="replace").splitlines()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="garbage frames")
    parser.add_argument("--requests", type=int, default=10_000, help="malformed framed requests")
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="chronoq-garbage-") as tmp:
        fig = run(args, Path(tmp))
    rows = [
        ("garbage frames", f"{fig['frames']:,} in {fig['frames_seconds']:.0f} s"),
        ("  answers", json.dumps(fig["frames_answers"])),
        ("malformed requests", f"{fig['requests']:,} in {fig['requests_seconds']:.0f} s"),
        ("  answers", json.dumps(fig["requests_answers"])),
        ("server alive", str(fig["server_alive"])),
        ("server log lines", f"{fig['server_log_lines']:,}"),
        ("state unchanged", str(fig["state_unchanged"])),
        ("good client round trips", f"{fig['good_round_trips']:,}"),
        ("good client errors", str(fig["good_errors"])),
        ("good client latency", format_percentiles(fig["good_latency_ms"])),
        ("load average before/after", f"{load_before} / {os.getloadavg()}"),
    ]
    print_block("garbage at the broker server", rows)
    if not fig["state_unchanged"]:
        print(json.dumps({"before": fig["state_before"], "after": fig["state_after"]}))
    if args.json:
        print(json.dumps(fig))
    ok = (
        fig["server_alive"]
        and fig["state_unchanged"]
        and not fig["good_errors"]
        and "answered OK" not in fig["requests_answers"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
