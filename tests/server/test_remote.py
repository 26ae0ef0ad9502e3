"""RemoteBroker and BrokerServer beyond the shared contract: several endpoints,
failover, reconnects, vanished clients, long polls, limits, SIGTERM, metrics, CLI."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from broker_adapter.errors import ConnectionFailed
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, MessageState, SendStatus
from broker_adapter.server import protocol as P
from broker_adapter.server.cli import add_serve_parser, serve_main
from broker_adapter.server.client import RemoteBroker
from tests.helpers import assert_nothing, eventually, pull_one, pull_until
from tests.server.conftest import TOKEN
from tests.server.serverproc import ROOT, ServerProcess


def _pair_url(a: ServerProcess, b: ServerProcess) -> str:
    return f"chronoq://127.0.0.1:{a.port},127.0.0.1:{b.port}?token={TOKEN}"


def _fired_or_pending(proc: ServerProcess, topic: str) -> int:
    with RemoteBroker.from_url(proc.url) as one:
        t = one.stats().topics.get(topic)
        return 0 if t is None else t.pending + t.fired_total


def test_several_endpoints_share_sends_and_route_ids(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    with RemoteBroker.from_url(_pair_url(a, b)) as broker:
        results = [broker.send(Message("multi", b"%d" % i, delay_ms=60_000)) for i in range(20)]
        assert {r.msg_id.partition(":")[0] for r in results} == {a.node, b.node}
        assert (_fired_or_pending(a, "multi"), _fired_or_pending(b, "multi")) == (10, 10)
        view = broker.query(results[3].msg_id)
        assert view is not None and view.msg_id == results[3].msg_id
        assert view.state is MessageState.PENDING
        assert broker.abort(results[4].msg_id).status is AbortStatus.ABORTED
        assert broker.abort(results[4].msg_id).status is AbortStatus.ABORTED
        assert len(broker.pending(topic="multi")) == 19
        assert broker.stats().topics["multi"].pending == 19
        assert broker.query(f"{'0' * 8}:{results[5].msg_id.partition(':')[2]}") is None


def test_keyed_sends_stick_to_one_endpoint_and_stay_idempotent(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    with RemoteBroker.from_url(_pair_url(a, b)) as broker:
        first = broker.send(Message("keyed", b"1", key="order:1", delay_ms=60_000))
        again = [
            broker.send(Message("keyed", b"2", key="order:1", delay_ms=60_000)) for _ in range(5)
        ]
        assert {r.status for r in again} == {SendStatus.DUPLICATE}
        assert {r.msg_id for r in again} == {first.msg_id}
        assert broker.abort(key="order:1", topic="keyed").msg_id == first.msg_id


def test_a_consumer_gets_messages_of_every_endpoint(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    with RemoteBroker.from_url(_pair_url(a, b)) as broker:
        c = broker.consumer("g", ["both"])
        ids = {broker.send(Message("both", b"%d" % i)).msg_id for i in range(10)}
        got = pull_until(c, 10)
        assert {m.msg_id for m in got} == ids
        assert all(c.ack(m) for m in got)
        assert not any(c.ack(m) for m in got)
        assert_nothing(c)


def test_ack_batch_splits_by_endpoint_and_keeps_the_order(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    with RemoteBroker.from_url(_pair_url(a, b)) as broker:
        c = broker.consumer("g", ["both"])
        for i in range(10):
            broker.send(Message("both", b"%d" % i))
        got = pull_until(c, 10)
        nodes = {m.msg_id.split(":")[0] for m in got}
        assert len(nodes) == 2  # round-robin put messages on both servers
        assert c.ack(got[3])
        mixed = [got[3], *got, got[0]]  # interleaved endpoints, an acked one, a repeat
        assert c.ack_batch(mixed) == [False] + [i != 3 for i in range(10)] + [False]
        assert_nothing(c)


def test_a_consumer_keeps_consuming_when_one_endpoint_dies(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    with RemoteBroker.from_url(_pair_url(a, b)) as broker:
        c = broker.consumer("g", ["half"])
        a.kill()
        ids = {broker.send(Message("half", b"%d" % i)).msg_id for i in range(5)}
        got = pull_until(c, 5)  # no ConnectionFailed: the dead endpoint is skipped
        assert {m.msg_id for m in got} == ids
        assert all(c.ack(m) for m in got)


def test_sync_sends_fail_over_to_a_live_endpoint_and_avoid_the_dead_one(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    with RemoteBroker.from_url(_pair_url(a, b)) as broker:
        broker.send(Message("fo", b"warm"))
        a.kill()
        results = [broker.send(Message("fo", b"%d" % i)) for i in range(10)]
        assert {r.msg_id.partition(":")[0] for r in results} == {b.node}
        assert not broker.fault.available(0)  # 30 s out after the failure
        assert broker.fault.available(1)


def test_a_sync_send_with_no_live_endpoint_raises_connection_failed(
    server: ServerProcess,
) -> None:
    broker = RemoteBroker.from_url(server.url)
    server.kill()
    with pytest.raises(ConnectionFailed):
        broker.send(Message("gone", b"x"))
    broker.close()


def test_consumers_and_producers_reconnect_after_a_server_restart(
    server: ServerProcess,
) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        c = broker.consumer("g", ["re"])
        broker.send(Message("re", b"before"))
        assert pull_one(c).body == b"before"
        server.restart()
        r = broker.send(Message("re", b"after"))
        got = eventually(
            lambda: [m for m in _pull_quiet(c) if m.msg_id == r.msg_id],
            timeout=20,
            what="the consumer reconnected",
        )
        assert c.ack(got[0]) is True


def _pull_quiet(c: object) -> list[object]:
    try:
        return c.pull(10, 200)  # type: ignore[attr-defined,no-any-return]
    except ConnectionFailed:
        return []


VANISH = """
import os, sys
from broker_adapter import open_broker
b = open_broker(sys.argv[1])
c = b.consumer("g", ["v"], invisible_ms=5000)
m = c.pull(1, 10000)[0]
sys.stdout.write(m.msg_id + "\\n"); sys.stdout.flush()
os._exit(0)  # vanish: no close, no ack
"""


def test_inflight_messages_of_a_vanished_client_come_back_after_their_invisible_time(
    manual_server: ServerProcess,
) -> None:
    with RemoteBroker.from_url(manual_server.url) as broker:
        r = broker.send(Message("v", b"x"))
        done = subprocess.run(
            [sys.executable, "-c", VANISH, manual_server.url],
            cwd=ROOT,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout.strip() == r.msg_id
        c = broker.consumer("g", ["v"], invisible_ms=5000)
        assert_nothing(c)  # still invisible: the vanished client might come back
        manual_server.admin("advance", ms=5_001)
        again = pull_one(c)
        assert (again.msg_id, again.attempts) == (r.msg_id, 2)
        assert c.ack(again)


def test_a_long_poll_blocks_no_other_client(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as waiting, RemoteBroker.from_url(server.url) as other:
        c = waiting.consumer("g", ["later"])
        box: list[object] = []
        t = threading.Thread(target=lambda: box.append(c.pull(1, 30_000)), daemon=True)
        t.start()
        for i in range(50):
            assert other.send(Message("now", b"%d" % i)).status is SendStatus.OK
        now = other.stats().topics["now"]  # one snapshot: a message may fire between two
        assert now.fired_total + now.pending == 50
        assert t.is_alive()  # still waiting while the other client was served
        other.send(Message("later", b"wake"))
        t.join(30)
        assert [m.body for m in box[0]] == [b"wake"]  # type: ignore[attr-defined]


def test_max_inflight_per_connection_holds_back_further_requests(tmp_path: Path) -> None:
    """With one request in flight allowed, a stats request behind a parked long poll is
    answered only after the poll: answers come in request order."""
    proc = ServerProcess(tmp_path / "d", extra=("--max-inflight", "1")).start()
    try:
        link = proc.link()
        cid = link.call(
            "consumer_open",
            {
                "group": "g",
                "topics": ["t"],
                "invisible_ms": 1000,
                "max_attempts": 3,
                "max_inflight": 10,
                "max_inflight_bytes": 1000,
            },
            10,
        )
        order: list[str] = []
        done = threading.Event()

        def note(name: str) -> P.Response:
            def record(result: object, error: BaseException | None) -> None:
                order.append(name)
                if len(order) == 2:
                    done.set()

            return record  # type: ignore[return-value]

        link.submit("pull", {"cid": cid, "max": 1, "wait": 500}, note("pull"))
        link.submit("stats", {}, note("stats"))
        assert done.wait(30)
        assert order == ["pull", "stats"]
        link.close()
    finally:
        proc.kill()


def test_sigterm_drains_flushes_and_exits_zero(server: ServerProcess) -> None:
    broker = RemoteBroker.from_url(server.url)
    c = broker.consumer("g", ["idle"])
    parked = threading.Thread(target=lambda: _pull_quiet(c), daemon=True)
    parked.start()
    ids = [
        r.msg_id
        for r in broker.send_batch(
            [Message("drain", b"%d" % i, delay_ms=60_000) for i in range(500)]
        )
    ]
    assert server.stop() == 0  # SIGTERM
    parked.join(30)
    assert not parked.is_alive()
    broker.close()
    server.start()
    with RemoteBroker.from_url(server.url) as again:
        assert {v.msg_id for v in again.pending(topic="drain", limit=1000)} == set(ids)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_metrics(tmp_path: Path) -> None:
    port = _free_port()
    proc = ServerProcess(tmp_path / "d", extra=("--metrics-port", str(port))).start()
    try:
        with RemoteBroker.from_url(proc.url) as broker:
            c = broker.consumer("mg", ["mt"])
            broker.send_batch([Message("mt", b"x") for _ in range(3)])
            broker.send(Message("mt", b"later", delay_ms=60_000))
            r = broker.send(Message("mt", b"gone", delay_ms=60_000))
            broker.abort(r.msg_id)
            got = pull_until(c, 3)
            c.ack(got[0])

            def scrape() -> set[str]:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    return set(r.read().decode().splitlines())

            # The client answers an ack it holds itself and writes it without waiting
            # (as on Redis): the server applies it a moment later.
            eventually(
                lambda: 'chronoq_inflight{group="mg"} 2.0' in scrape(),
                what="the ack reached the server",
            )
            lines = scrape()
        assert 'chronoq_pending{topic="mt"} 1.0' in lines
        assert 'chronoq_fired_total{topic="mt"} 3.0' in lines
        assert 'chronoq_inflight{group="mg"} 2.0' in lines
        assert 'chronoq_ready{group="mg"} 0.0' in lines
        assert 'chronoq_dead{group="mg"} 0.0' in lines
        assert "chronoq_sent_messages_total 5.0" in lines
        assert 'chronoq_aborts_total{status="ABORTED"} 1.0' in lines
        assert "chronoq_pulled_messages_total 3.0" in lines
        assert "chronoq_fire_lateness_seconds_count 3.0" in lines
        assert 'chronoq_requests_total{op="send_batch"} 1.0' in lines
    finally:
        proc.kill()


def test_the_serve_parser_plugs_into_a_chronoq_broker_command() -> None:
    parser = argparse.ArgumentParser(prog="chronoq")
    broker = parser.add_subparsers(dest="command").add_parser("broker")
    add_serve_parser(broker.add_subparsers(dest="broker_command"))
    args = parser.parse_args(
        [
            "broker",
            "serve",
            "--data-dir",
            "/d",
            "--port",
            "7421",
            "--token",
            "t",
            "--metrics-port",
            "9000",
        ]
    )
    assert (args.data_dir, args.host, args.port, args.token, args.metrics_port) == (
        "/d",
        "127.0.0.1",
        7421,
        "t",
        9000,
    )
    assert args.func is serve_main
    assert args.manual_clock is None


def test_sigint_stops_the_server_too(server: ServerProcess) -> None:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(30) == 0


CHRONOQ = "import sys; from workers.cli import main; sys.exit(main(sys.argv[1:]))"


def _chronoq(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHRONOQ, *argv],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_chronoq_command_line_reaches_a_server_by_url(server: ServerProcess) -> None:
    sent = _chronoq(
        "send",
        "--url",
        server.url,
        "--topic",
        "cli",
        "--body",
        "hi",
        "--delay-ms",
        "60000",
        "--json",
    )
    assert sent.returncode == 0, sent.stderr
    with RemoteBroker.from_url(server.url) as b:
        (view,) = b.pending(topic="cli")
    stats = _chronoq("stats", "--url", server.url, "--json")
    assert stats.returncode == 0, stats.stderr
    assert "cli" in stats.stdout
    aborted = _chronoq("abort", "--url", server.url, "--id", view.msg_id, "--json")
    assert aborted.returncode == 0, aborted.stderr
    assert "ABORTED" in aborted.stdout


def test_a_send_timeout_raises_and_keeps_the_link(server: ServerProcess) -> None:
    """A server that does not answer (SIGSTOP) makes a sync send raise after its timeout;
    the link is kept, so once the server answers again the next send uses it."""
    from broker_adapter.server.link import RequestTimeout

    assert server.proc is not None
    with RemoteBroker.from_url(server.url, send_timeout_ms=300, retries=0) as broker:
        broker.send(Message("slow", b"warm"))
        link = broker.endpoints[0].link(lambda: None)
        server.proc.send_signal(signal.SIGSTOP)
        pid = server.proc.pid
        eventually(
            lambda: "\tT" in Path(f"/proc/{pid}/status").read_text(), what="the server is stopped"
        )
        try:
            with pytest.raises(ConnectionFailed) as info:
                broker.send(Message("slow", b"late"))
            assert isinstance(info.value.__context__, RequestTimeout) or "300 ms" in str(info.value)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert broker.send(Message("slow", b"after")).status is SendStatus.OK
        assert broker.endpoints[0].link(lambda: None) is link


def test_async_and_oneway_sends_to_a_dead_server_report_and_flush(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    broker = RemoteBroker.from_url(server.url)
    broker.send(Message("dead", b"warm"))
    server.kill()
    calls: list[tuple[object, BaseException | None]] = []
    broker.send_async(Message("dead", b"x"), lambda r, e: calls.append((r, e)))
    broker.send_oneway(Message("dead", b"y"))
    broker.flush(30)
    eventually(lambda: calls, what="the callback heard the failure")
    broker.close()
    assert len(calls) == 1
    assert calls[0][0] is None and isinstance(calls[0][1], ConnectionFailed)
    assert any("one-way send" in r.getMessage() for r in caplog.records)
