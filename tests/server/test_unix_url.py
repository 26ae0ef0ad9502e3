"""``chronoq+unix:///path``: a broker server on a Unix socket (``chronoq broker serve
--unix PATH``), reached by the sync and async clients, the scheduler, ``chronoq run``
and the inspection commands. Real server subprocesses, real sockets, real RocksDB."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter import Message, open_async_broker, open_broker
from broker_adapter.errors import (
    AuthenticationFailed,
    ChronoqError,
    ConnectionFailed,
    InvalidArgument,
)
from broker_adapter.results import AbortStatus, MessageState
from broker_adapter.server.unix import SUN_PATH_MAX
from broker_adapter.server.unix_url import socket_path, unix_url
from scheduler.scheduler import Scheduler
from tests.helpers import CHRONOQ, ROOT, chronoq, eventually, pull_one, stop_process

pytestmark = pytest.mark.timeout(120)

TOKEN = "unix-s3cret"


class UnixServer:
    """A ``python -m broker_adapter.server --unix PATH`` child; its listening line read."""

    def __init__(self, data_dir: Path, path: Path, *extra: str) -> None:
        argv = [sys.executable, "-m", "broker_adapter.server", "--data-dir", str(data_dir)]
        self.path = path
        self.proc = subprocess.Popen(
            [*argv, "--unix", str(path), *extra],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        self.line = self.proc.stdout.readline() if ready else ""
        if not self.line.startswith("chronoq broker listening on"):
            self.stop()
            raise AssertionError(f"server did not start: {self.line!r}")
        self.url = self.line.split()[-1]

    def stop(self) -> int | None:
        rc = stop_process(self.proc, 30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc


@pytest.fixture
def sock_dir(tmp_path: Path) -> Path:
    """A short directory for sockets (``sun_path`` holds 107 bytes)."""
    d = tmp_path / "s"
    d.mkdir()
    return d


@pytest.fixture
def server(tmp_path: Path, sock_dir: Path) -> Iterator[UnixServer]:
    """A server without a token on ``sock_dir/b.sock``."""
    s = UnixServer(tmp_path / "data", sock_dir / "b.sock")
    try:
        yield s
    finally:
        s.stop()


# -- the URL -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("chronoq+unix://", "names no socket path"),
        ("chronoq+unix:///", "names no socket path"),
        ("chronoq+unix://?token=t", "names no socket path"),
        ("chronoq+unix://./b.sock", "relative path"),
        ("chronoq+unix://b.sock", "relative path"),
        ("chronoq+unix://~/b.sock", "relative path"),
        ("chronoq+unix://127.0.0.1:7420/run/b.sock", "use chronoq://127.0.0.1:7420"),
        ("chronoq+unix://localhost/run/b.sock", "not a host"),
        ("chronoq+unix:///run/chronoq/", "is a directory"),
        ("chronoq+unix:///run/b.sock?port=7420", "unknown parameter"),
    ],
)
def test_a_bad_unix_url_is_refused_at_open_saying_what_to_use(url: str, says: str) -> None:
    for opener in (open_broker, open_async_broker):
        with pytest.raises(InvalidArgument, match=says) as info:
            opener(url)
        assert isinstance(info.value, ChronoqError)
        if "unknown parameter" not in says:
            assert "chronoq+unix:///abs/path/broker.sock" in str(info.value)


def test_the_url_round_trips_an_awkward_path() -> None:
    path = "/tmp/a dir/b?c%d,e.sock"
    url = unix_url(path)
    assert " " not in url and "?" not in url
    assert socket_path(url.partition("://")[2]) == path
    assert unix_url("rel.sock") == unix_url(Path.cwd() / "rel.sock")  # made absolute


def test_a_missing_socket_fails_at_the_first_call_naming_the_path(sock_dir: Path) -> None:
    # Opening connects nothing (a dispatcher may start before its server)
    with (
        open_broker(unix_url(sock_dir / "none.sock")) as b,
        pytest.raises(ConnectionFailed, match="none.sock"),
    ):
        b.stats()


# -- clients over the socket -----------------------------------------------------------------


def test_sync_client_sends_pulls_acks_and_aborts(server: UnixServer) -> None:
    assert server.url == unix_url(server.path)
    with open_broker(server.url) as b:
        kept = b.send(Message("ux", b"kept", key="k:1", delay_ms=300))
        gone = b.send(Message("ux", b"gone", key="k:2", delay_ms=400))
        assert b.abort(key="k:2", topic="ux").status is AbortStatus.ABORTED
        with b.consumer(group="g", topics=["ux"]) as c:
            m = pull_one(c)
            assert (m.msg_id, m.body) == (kept.msg_id, b"kept")
            c.ack(m)
            assert c.pull(max_messages=8, wait_ms=600) == []  # the aborted one never comes

        def done() -> bool:
            view = b.query(kept.msg_id)
            return view is not None and view.state is MessageState.DONE

        eventually(done, what="the acked message DONE")
        view = b.query(gone.msg_id)
        assert view is not None and view.state is MessageState.ABORTED


def test_async_client_sends_and_aborts_what_a_consumer_then_pulls(server: UnixServer) -> None:
    """The async client has no consumer (dispatchers pull with the sync one): what it
    sends arrives, what it aborts never does."""

    async def main() -> tuple[str, AbortStatus, MessageState | None]:
        async with open_async_broker(server.url) as b:
            sent = await b.send(Message("ax", b"one", delay_ms=200))
            await b.send_batch([Message("ax", b"two", key="a:2", delay_ms=300)])
            aborted = await b.abort(key="a:2", topic="ax")
            view = await b.query(sent.msg_id)
            return sent.msg_id, aborted.status, None if view is None else view.state

    msg_id, aborted, state = asyncio.run(main())
    assert (aborted, state) == (AbortStatus.ABORTED, MessageState.PENDING)
    with open_broker(server.url) as b, b.consumer(group="g", topics=["ax"]) as c:
        m = pull_one(c)
        assert (m.msg_id, m.body) == (msg_id, b"one")
        c.ack(m)
        assert c.pull(max_messages=8, wait_ms=600) == []


def test_a_deep_socket_path_works_for_both_clients(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    s = UnixServer(tmp_path / "data", deep / "broker.sock")
    try:
        assert len(str(s.path).encode()) > SUN_PATH_MAX
        with open_broker(s.url) as b:
            b.send(Message("deep", b"x", delay_ms=60_000))

        async def pending() -> int:
            async with open_async_broker(s.url) as ab:
                return (await ab.stats()).topics["deep"].pending

        assert asyncio.run(pending()) == 1
    finally:
        s.stop()


def test_a_token_is_optional_and_checked_when_the_server_has_one(
    tmp_path: Path, sock_dir: Path, server: UnixServer
) -> None:
    with open_broker(server.url + "?token=unused") as b:  # a server without one accepts it
        assert b.stats().topics == {}
    guarded = UnixServer(tmp_path / "data2", sock_dir / "t.sock", "--token", TOKEN)
    try:
        with open_broker(guarded.url) as b, pytest.raises(AuthenticationFailed):
            b.stats()
        with open_broker(f"{guarded.url}?token={TOKEN}") as b:
            assert b.send(Message("t", b"x")).msg_id
    finally:
        guarded.stop()


# -- chronoq broker serve --unix -----------------------------------------------------------


def test_the_socket_is_private_and_removed_on_sigterm(server: UnixServer) -> None:
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert server.line.split()[4] == str(server.path)  # where the TCP line has HOST:PORT
    assert server.stop() == 0
    assert not server.path.exists()


def test_serve_unix_refuses_host_or_port_and_a_taken_path(
    tmp_path: Path, sock_dir: Path, server: UnixServer
) -> None:
    data = str(tmp_path / "other")
    for flags, says in (
        (["--port", "7420"], "drop --port"),
        (["--host", "127.0.0.1"], "drop --host"),
        (["--host", "0.0.0.0", "--port", "0"], "drop --host and --port"),
    ):
        r = chronoq(
            "broker", "serve", "--data-dir", data, "--unix", str(sock_dir / "x.sock"), *flags
        )
        assert (r.returncode, r.stdout) == (2, "")
        assert says in r.stderr
    # A live server's socket is not taken over
    r = chronoq("broker", "serve", "--data-dir", data, "--unix", str(server.path))
    assert r.returncode == 2 and "already listens" in r.stderr
    with open_broker(server.url) as b:
        assert b.stats().topics == {}
    # Nor a file that is not a socket, nor a path in a missing directory
    plain = sock_dir / "plain"
    plain.write_text("keep me")
    r = chronoq("broker", "serve", "--data-dir", data, "--unix", str(plain))
    assert r.returncode == 2 and "not a socket" in r.stderr
    assert plain.read_text() == "keep me"
    r = chronoq("broker", "serve", "--data-dir", data, "--unix", str(sock_dir / "no" / "b.sock"))
    assert r.returncode == 2 and "not a directory" in r.stderr
    assert not Path(data).exists()  # refused before the data directory was opened


def test_serve_unix_replaces_a_stale_socket(tmp_path: Path, sock_dir: Path) -> None:
    stale = sock_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale))
    dead.close()  # a dead server's socket file: nobody listens
    s = UnixServer(tmp_path / "data", stale)
    try:
        with open_broker(s.url) as b:
            assert b.send(Message("st", b"x")).msg_id
    finally:
        s.stop()


def test_backup_through_the_unix_url(tmp_path: Path, server: UnixServer) -> None:
    with open_broker(server.url) as b:
        b.send(Message("bk", b"x", delay_ms=60_000))
    dest = tmp_path / "backup"
    r = chronoq("broker", "backup", str(dest), "--url", server.url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] == str(dest)
    with open_broker(f"rocksdb://{dest}?share=0") as copy:
        assert copy.stats().topics["bk"].pending == 1
    r = chronoq("broker", "backup", str(tmp_path / "b2"), "--url", "chronoq+unix://b.sock")
    assert r.returncode == 2 and "relative path" in r.stderr


# -- the scheduler, chronoq run and the inspection commands ------------------------------------

APP = textwrap.dedent(
    """
    import os

    from scheduler.scheduler import Scheduler

    app = Scheduler()  # CHRONOQ_BROKER_URL from the environment

    @app.job(name="unix.mark")
    def mark(n: int) -> None:
        with open(os.environ["UNIX_OUT"], "a") as f:
            f.write(f"{n}\\n")
    """
)


def _nothing(n: int) -> None:
    raise AssertionError("runs in the dispatcher, not here")


def test_chronoq_run_runs_jobs_end_to_end(tmp_path: Path, server: UnixServer) -> None:
    (tmp_path / "unix_app.py").write_text(APP)
    out = tmp_path / "runs.txt"
    env = dict(
        os.environ,
        CHRONOQ_BROKER_URL=server.url,
        UNIX_OUT=str(out),
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
    )
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        run = subprocess.Popen(
            [CHRONOQ, "run", "unix_app:app"], env=env, cwd=tmp_path, stdout=f, stderr=f
        )
    app = Scheduler(server.url)
    try:
        mark = app.job(name="unix.mark")(_nothing)
        eventually(lambda: "dispatcher joined group" in log.read_text(), 60, "chronoq run joined")
        for n in range(5):
            mark.schedule(n, delay=0.2, key=f"m:{n}")
        assert mark.cancel(key="m:3") is AbortStatus.ABORTED
        eventually(lambda: out.exists() and len(out.read_text().split()) >= 4, 30, "4 runs")
        r = chronoq("stats", "--url", server.url, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["topics"][app.settings.topic]["fired_total"] == 4
    finally:
        app.close()
        run.send_signal(signal.SIGTERM)
        rc = stop_process(run, 30)
    assert sorted(out.read_text().split()) == ["0", "1", "2", "4"], log.read_text()
    assert rc == 0, log.read_text()
