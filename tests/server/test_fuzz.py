"""Garbage at a live server: 10,000 random and malformed frames.

Each bad frame closes only the connection that sent it; the server stays up,
answers the next good client, and its state is unchanged.
"""

from __future__ import annotations

import random
import re
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack

from broker_adapter.message import Message
from broker_adapter.server import protocol as P
from broker_adapter.server.client import RemoteBroker
from tests.server.conftest import TOKEN
from tests.server.serverproc import ServerProcess

FRAMES = 10_000
#: Each connection says hello (or not), then sends one garbage frame, which the
#: server must reject; a few more ride behind it and must be ignored.
TRAILING = 2
THREADS = 4


def _garbage(rng: random.Random) -> bytes:
    """One malformed frame (header included), of a random kind."""
    kind = rng.randrange(8)
    if kind == 0:  # random bytes with a matching length
        body = rng.randbytes(rng.randrange(1, 64))
        return struct.pack(">I", len(body)) + body
    if kind == 1:  # a length of zero or over the limit
        return struct.pack(">I", rng.choice([0, P.MAX_FRAME + 1, 2**32 - 1]))
    if kind == 2:  # msgpack of the wrong shape
        value = rng.choice([None, 1, "x", [], [0], [0, 1, "send"], {"a": 1}, [1, 1, 0, None]])
        return P.frame(value)
    if kind == 3:  # unknown operation
        return P.frame([0, rng.randrange(100), "drop_everything", {}])
    if kind == 4:  # known op, args of the wrong type
        return P.frame(
            [
                0,
                1,
                rng.choice(["send", "send_batch", "abort", "pull", "ack"]),
                {"m": 5, "ms": "x", "id": 3, "cid": "c", "receipt": 1},
            ]
        )
    if kind == 5:  # truncated msgpack
        body = msgpack.packb([0, 1, "stats", {"a": "b" * 20}])[:-5]
        return struct.pack(">I", len(body)) + body
    if kind == 6:  # a send whose message has the wrong number of fields
        return P.frame([0, 1, "send", {"m": ["t", b"x"]}])
    return rng.randbytes(rng.randrange(1, 40))  # not even a frame


def _state(broker: RemoteBroker) -> tuple[object, ...]:
    return (broker.stats(), [v.msg_id for v in broker.pending()])


def _unauthenticated_garbage(port: int, rng: random.Random, frames: int) -> int:
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(P.request(0, "hello", {"v": 1, "token": TOKEN}))
        s.recv(4096)  # the hello answer
        try:
            for _ in range(frames):
                s.sendall(_garbage(rng))
                sent += 1
        except OSError:
            pass  # closed by the server after the first bad frame
    return sent


def _one_per_connection(port: int, frames: list[bytes]) -> int:
    """Send each garbage in its own connection; count connections the server closed."""
    closed = 0
    for i, data in enumerate(frames):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            if i % 2:
                s.sendall(P.request(0, "hello", {"v": 1, "token": TOKEN}))
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)  # a cut-off frame ends here too
                while s.recv(65536):  # answers (hello, errors) until the server closes
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed by the server while we were still sending
            closed += 1
    return closed


def test_ten_thousand_garbage_frames_leave_the_server_up_and_unchanged(
    server: ServerProcess,
) -> None:
    good = RemoteBroker.from_url(server.url)
    try:
        kept = good.send(Message("fuzz", b"keep", key="k", delay_ms=3_600_000))
        before = _state(good)
        rng = random.Random(1234)
        batches = [
            [b"".join(_garbage(rng) for _ in range(1 + TRAILING)) for _ in range(FRAMES // THREADS)]
            for _ in range(THREADS)
        ]
        with ThreadPoolExecutor(THREADS) as pool:
            closed = sum(pool.map(lambda b: _one_per_connection(server.port, b), batches))
        assert closed == FRAMES
        assert _unauthenticated_garbage(server.port, rng, 20) >= 1
        assert server.alive()
        # the connection that was open all along still works, and nothing changed
        assert _state(good) == before
        view = good.query(kept.msg_id)
        assert view is not None and view.key == "k"
    finally:
        good.close()
    # a brand-new client is served too
    with RemoteBroker.from_url(server.url) as fresh:
        assert fresh.send(Message("fuzz", b"after")).status.value == "OK"
        assert fresh.stats().topics["fuzz"].fired_total + fresh.stats().topics["fuzz"].pending == 2


def test_garbage_is_logged_as_counts_not_a_line_per_connection(tmp_path: Path) -> None:
    """Each connection closed for a malformed frame used to log its own WARNING: a
    garbage flood flooded the log. Now a few lines say how many, and from where."""
    log_path = tmp_path / "server.log"
    server = ServerProcess(
        tmp_path / "data", token=TOKEN, extra=("--log-level", "WARNING"), log_path=log_path
    ).start()
    try:
        rng = random.Random(99)
        closed = _one_per_connection(server.port, [_garbage(rng) for _ in range(500)])
        assert closed == 500 and server.alive()
    finally:
        server.stop()
    lines = log_path.read_text().splitlines()
    counted = [line for line in lines if "connections closed for malformed frames" in line]
    assert counted, lines[-20:]
    # At most a line per 5 s of flood plus the one at shutdown; the counts add up to
    # the connections the server closed for a bad frame (the rest were cut-off frames
    # or garbage before a hello, which close without a frame error).
    assert len(counted) <= 10
    counts = [re.search(r"malformed frames: (\d+) in", line) for line in counted]
    assert 0 < sum(int(m.group(1)) for m in counts if m is not None) <= 500
    assert not [line for line in lines if "; closing it" in line]
