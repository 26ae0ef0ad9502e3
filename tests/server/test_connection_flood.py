"""Connection floods against a real ``chronoq broker serve`` (issue 18 §3): sockets
that never speak, from several loopback source addresses (127.0.0.1-3 via
``bind``), cannot lock out a client that says hello; one address holds at most
``--max-connections-per-peer``; refusals are logged once per few seconds with counts.
:class:`Admission` and :class:`RefusalLog` are also checked on their own."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.errors import ConnectionFailed
from broker_adapter.message import Message
from broker_adapter.results import SendStatus
from broker_adapter.server import protocol as P
from broker_adapter.server.admission import Admission, RefusalLog
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.session import hello_request
from tests.helpers import eventually, pull_until
from tests.server.flood import Flood
from tests.server.serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

#: The flood's source addresses: eight flooding ones, and the good clients' own.
FLOODERS = tuple(f"127.0.0.{i}" for i in range(2, 10))
GOOD = "127.0.0.1"
PER_PEER = 16
TOKEN = "flood-test-token"


def raw_hello(port: int, source: str, token: str | None = None) -> tuple[socket.socket, str]:
    """Connect from ``source`` and say hello; the socket and ``"ok"`` or the error text."""
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(15)
    s.connect(("127.0.0.1", port))
    s.sendall(hello_request(token))
    frames = P.FrameReader(s).frames()
    if not frames:
        return s, "closed"
    resp = P.decode_response(frames[0])
    return s, "ok" if resp.ok else str(P.decode_error(resp.result))


def connect_and_send(url: str, body: bytes, attempts: int = 5) -> int:
    """Connect a new client and send once; how many connection attempts it took (a
    refused connection is tried again after 0.1 s, as a reconnecting client would).

    :raises ConnectionFailed: when every attempt was refused.
    """
    for attempt in range(1, attempts + 1):
        try:
            with RemoteBroker.from_url(url) as client:
                assert client.send(Message("flood", body)).status is SendStatus.OK
                return attempt
        except ConnectionFailed:
            if attempt == attempts:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def refusal_lines(log_path: Path) -> list[str]:
    return [line for line in log_path.read_text().splitlines() if "turned away" in line]


@pytest.fixture
def flood_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    log_path = tmp_path / "server.log"
    proc = ServerProcess(
        tmp_path / "d",
        extra=("--max-connections-per-peer", str(PER_PEER), "--log-level", "WARNING"),
        env={"CHRONOQ_HELLO_TIMEOUT_S": "1.0"},
        log_path=log_path,
    ).start()
    try:
        yield proc, log_path
    finally:
        proc.kill()


def test_a_silent_flood_from_many_addresses_does_not_lock_out_a_good_client(
    flood_server: tuple[ServerProcess, Path],
) -> None:
    server, log_path = flood_server
    # Given: a client connected before the flood
    early = RemoteBroker.from_url(server.url)
    consumer = early.consumer("g", ["flood"])
    early.send(Message("flood", b"before"))
    # When: 680 sockets connect and never say anything (60 from each of eight
    # addresses, 200 from the good clients' own), opened again whenever the server
    # closes them: more than the opening pool (64) and each address's cap (16)
    want = {**dict.fromkeys(FLOODERS, 60), GOOD: 200}
    with Flood(server.port, want) as flood:
        eventually(lambda: flood.closed_by_server >= 600, timeout=60, what="the flood churns")
        # Then: the early client keeps sending and pulling ...
        sent = [early.send(Message("flood", b"%d" % i)).msg_id for i in range(20)]
        got = {m.msg_id for m in pull_until(consumer, 21, timeout=30)}
        assert set(sent) <= got
        # ... new clients connect during the flood (a retry at most now and then) ...
        attempts = [connect_and_send(server.url, b"late%d" % i) for i in range(10)]
        assert attempts == [1] * 10, attempts
        # ... and an address holds at most its cap of working connections
        held = [raw_hello(server.port, "127.0.0.20") for _ in range(PER_PEER + 4)]
        answers = [answer for _, answer in held]
        assert answers.count("ok") == PER_PEER, answers
        assert all("maximum of 16 connections" in a for a in answers if a != "ok"), answers
        for s, _ in held:
            s.close()
        opened, closed = flood.opened, flood.closed_by_server
    consumer.close()
    early.close()
    # Then: thousands of refusals and closings, a handful of log lines with counts
    assert opened > 600 and closed >= 600
    server.stop()  # the last counts are written at shutdown
    lines = refusal_lines(log_path)
    assert len(lines) < 20, lines
    assert any("address at its cap" in line for line in lines), lines


def test_two_thousand_silent_sockets_from_one_address_do_not_lock_out_its_clients(
    flood_server: tuple[ServerProcess, Path],
) -> None:
    server, log_path = flood_server
    # Given: 2,000 sockets connected at once from 127.0.0.1 that never send a byte
    # (issue 18: this refused every client, with one WARNING per refusal)
    silent = []
    for _ in range(2000):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", server.port))
        silent.append(s)
    try:
        # Then: clients from that same address connect and work, on the first try
        attempts = [connect_and_send(server.url, b"c%d" % i) for i in range(10)]
        assert attempts == [1] * 10, attempts
    finally:
        for s in silent:
            s.close()
    server.stop()  # the last counts are written at shutdown
    lines = refusal_lines(log_path)
    assert 1 <= len(lines) < 10, lines


def test_with_a_token_an_unauthenticated_flood_does_not_lock_out_a_client_with_it(
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "server.log"
    server = ServerProcess(
        tmp_path / "d",
        token=TOKEN,
        extra=("--log-level", "WARNING"),
        env={"CHRONOQ_HELLO_TIMEOUT_S": "1.0"},
        log_path=log_path,
    ).start()
    try:
        # Given: silent sockets and wrong-token hellos from every address
        stop = threading.Event()
        wrong: list[tuple[str, str]] = []

        def bad_tokens() -> None:
            while not stop.is_set():
                for source in (GOOD, *FLOODERS[:2]):
                    s, answer = raw_hello(server.port, source, "not-the-token")
                    s.close()
                    wrong.append((source, answer))

        t = threading.Thread(target=bad_tokens, daemon=True)
        with Flood(server.port, {**dict.fromkeys(FLOODERS, 40), GOOD: 8}) as flood:
            t.start()
            eventually(lambda: flood.closed_by_server >= 300, timeout=60, what="flood churns")
            # When/Then: clients with the token connect and work throughout
            attempts = [connect_and_send(server.url, b"tok%d" % i) for i in range(10)]
            assert sum(attempts) < 20, attempts
            stop.set()
            t.join(20)
        # A flooding address's opening socket may be evicted before its hello is read
        # (the busiest address's oldest goes first); every answer given is a refusal.
        assert wrong and all(
            "refused the token" in a or (a == "closed" and src != GOOD) for src, a in wrong
        ), set(wrong)
        assert any(src == GOOD and "refused the token" in a for src, a in wrong)

        # a client without the token is still refused (once the flood's last sockets
        # have left the opening pool: until then it may be told to try again later)
        def tokenless_answer() -> str:
            s, answer = raw_hello(server.port, GOOD, None)
            s.close()
            return answer

        answers: list[str] = []
        eventually(
            lambda: answers.append(tokenless_answer()) or "try again later" not in answers[-1],
            timeout=30,
            what="the opening pool drains after the flood",
        )
        assert "refused the token" in answers[-1], answers
        eventually(lambda: refusal_lines(log_path), what="a refusal line")
        lines = refusal_lines(log_path)
        assert len(lines) < 20 and len(wrong) > len(lines), (len(wrong), lines)
        assert any("wrong or missing token" in line for line in lines)
    finally:
        server.kill()


# -- the bookkeeping on its own ---------------------------------------------------------------


def test_admission_caps_each_address_and_evicts_its_oldest_silent_connection() -> None:
    speaking: set[str] = set()
    adm: Admission[str] = Admission(
        max_connections=10,
        max_per_peer=3,
        max_unauthenticated=100,
        silent=lambda c: c not in speaking,
    )
    for c in ("a1", "a2", "a3"):
        assert adm.admit(c, "A", 0.0).refusal is None
    # a fourth from A evicts A's oldest silent one (a1 is saying hello: a2 goes)
    speaking.add("a1")
    verdict = adm.admit("a4", "A", 0.1)
    assert verdict.refusal is None and verdict.evict == ("a2",)
    assert adm.authenticate("a2") is not None  # evicted: may not stay
    # when all of A's opening connections are saying hello, a newcomer is refused
    speaking.update({"a3", "a4"})
    refused = adm.admit("a5", "A", 0.2)
    assert refused.refusal is not None and refused.evict == ()
    for c in ("a1", "a3", "a4"):
        assert adm.authenticate(c) is None
    # three working connections: A is at its cap, B is not
    refused = adm.admit("a5", "A", 1.0)
    assert refused.refusal is not None and "maximum of 3" in refused.refusal
    assert adm.admit("b1", "B", 1.0).refusal is None
    adm.release("a1")
    assert adm.admit("a5", "A", 1.0).refusal is None
    assert (adm.authenticated, adm.unauthenticated) == (2, 2)


def test_admission_keeps_silent_connections_in_their_own_pool() -> None:
    adm: Admission[str] = Admission(
        max_connections=2, max_per_peer=100, max_unauthenticated=4, hello_timeout_s=3.0
    )
    for i in range(4):
        adm.admit(f"x{i}", "X", 0.0)
    # the pool is full: X (the busiest address) loses its oldest, however young
    assert adm.admit("y0", "Y", 0.0).evict == ("x0",)
    assert adm.admit("y1", "Y", 1.0).evict == ("x1",)
    assert adm.unauthenticated == 4
    assert adm.authenticate("y1") is None and adm.authenticate("y0") is None
    assert adm.authenticate("x2") is not None  # two working connections: the maximum
    assert sorted(adm.expired(3.5)) == ["x3"]  # past its hello deadline
    assert adm.unauthenticated == 0


def test_refusal_log_says_how_many_in_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("chronoq.test.refusals")
    caplog.set_level(logging.WARNING, logger=logger.name)
    refusals = RefusalLog(logger, interval_s=3600)
    for i in range(500):
        refusals.note("refused: address at its cap", f"10.0.0.{i % 3}")
    refusals.flush(force=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # the first at once, then the rest in one line
    assert "1 refused" in lines[0] and "499 refused: address at its cap" in lines[1]
    refusals.flush(force=True)  # nothing more to say
    assert len(caplog.records) == 2
