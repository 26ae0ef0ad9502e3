"""Tokens, loopback-only binding without a token, and connection limits."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker_adapter import open_broker
from broker_adapter.errors import AuthenticationFailed, ConnectionFailed, InvalidArgument
from broker_adapter.listen import is_loopback
from broker_adapter.message import Message
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.server import BrokerServer
from tests.server.conftest import TOKEN
from tests.server.serverproc import ROOT, ServerProcess


def _topics(server: ServerProcess) -> dict[str, object]:
    with RemoteBroker.from_url(server.url) as b:
        return dict(b.stats().topics)


@pytest.mark.parametrize(
    "token",
    [None, "", "wrong", TOKEN + "x", TOKEN[:-1]],
    ids=["none", "empty", "wrong", "longer", "prefix"],
)
def test_a_wrong_or_missing_token_is_refused(server: ServerProcess, token: str | None) -> None:
    url = f"chronoq://127.0.0.1:{server.port}" + (f"?token={token}" if token is not None else "")
    broker = open_broker(url)
    with pytest.raises(AuthenticationFailed):
        broker.send(Message("auth", b"x"))
    broker.close()
    assert "auth" not in _topics(server)


def test_requests_pipelined_behind_a_wrong_hello_are_not_executed(
    server: ServerProcess,
) -> None:
    """Wrong token: the server answers AuthenticationFailed, closes, and runs nothing else."""
    msg = V.encode_message(Message("sneaky", b"x"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(
            P.request(0, "hello", {"v": 1, "token": "wrong"})
            + P.request(1, "send", {"m": msg})
            + P.request(2, "send", {"m": msg})
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    (length,) = P.HEADER.unpack(data[:4])
    resp = P.decode_response(data[4 : 4 + length])
    assert (resp.rid, resp.ok) == (0, False)
    assert isinstance(P.decode_error(resp.result), AuthenticationFailed)
    assert len(data) == 4 + length  # nothing after the refusal
    assert "sneaky" not in _topics(server)


def test_requests_before_hello_close_the_connection(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(P.request(1, "send", {"m": V.encode_message(Message("early", b"x"))}))
        assert s.recv(65536) == b""
    assert "early" not in _topics(server)


def test_the_right_token_is_served(server: ServerProcess) -> None:
    with RemoteBroker(f"127.0.0.1:{server.port}", token=TOKEN) as b:
        assert b.send(Message("auth-ok", b"x")).status.value == "OK"
    assert "auth-ok" in _topics(server)


def test_the_token_comes_from_chronoq_token(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "d", env={"CHRONOQ_TOKEN": "from-env"}).start()
    try:
        with pytest.raises(AuthenticationFailed):
            RemoteBroker.from_url(f"chronoq://127.0.0.1:{proc.port}").stats()
        with RemoteBroker.from_url(f"chronoq://127.0.0.1:{proc.port}?token=from-env") as b:
            assert b.stats().topics == {}
    finally:
        proc.kill()


def test_no_token_on_loopback_serves_everyone(manual_server: ServerProcess) -> None:
    with RemoteBroker.from_url(manual_server.url) as b:
        assert b.send(Message("open", b"x")).status.value == "OK"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.invalid"])
def test_a_non_loopback_bind_without_a_token_is_refused(tmp_path: Path, host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(InvalidArgument, match="without a token"):
        BrokerServer(tmp_path / "d", host, 0)
    assert not (tmp_path / "d").exists()  # refused before the data dir is touched


def test_the_cli_refuses_a_non_loopback_bind_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "CHRONOQ_TOKEN"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker_adapter.server",
            "--data-dir",
            str(tmp_path / "d"),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 2
    assert "without a token" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_names_are_loopback(host: str) -> None:
    assert is_loopback(host) or host == "::1" and not socket.has_ipv6


def test_connections_over_the_limit_are_refused(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "d", extra=("--max-connections", "2")).start()
    try:
        a = RemoteBroker.from_url(proc.url)
        b = RemoteBroker.from_url(proc.url)
        a.stats()
        b.stats()
        c = RemoteBroker.from_url(proc.url)
        with pytest.raises(ConnectionFailed, match="maximum of 2 connections"):
            c.stats()
        c.close()
        a.close()  # room again
        with RemoteBroker.from_url(proc.url) as d:
            from tests.helpers import eventually

            eventually(lambda: _stats_ok(d), what="a new client is served once one left")
        b.close()
    finally:
        proc.kill()


def _stats_ok(b: RemoteBroker) -> bool:
    try:
        b.stats()
    except ConnectionFailed:
        return False
    return True
