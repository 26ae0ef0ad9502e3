"""The runtime calls over ``chronoq://`` beyond the shared contract: typed errors over
the wire, pages with bodies, a long prefix abort that stalls no one, the async
client, limits shared by several client processes, a server too old for a call,
and their metrics. Real server processes on 127.0.0.1 throughout."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_adapter.errors import InvalidArgument, InvalidDelay, MessageTooLarge, UnknownTopic
from broker_adapter.message import Message
from broker_adapter.results import MessageState, RescheduleStatus
from broker_adapter.server import protocol as P
from broker_adapter.server.async_client import AsyncRemoteBroker
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.session import ServerTooOld
from tests.helpers import eventually
from tests.server.serverproc import ROOT, ServerProcess

HOUR = 3_600_000


def test_errors_travel_back_typed_and_change_nothing(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        props = {"trace": "x" * 1000}
        sent = broker.send(
            Message("orders", b"v1", key="order:1:close", properties=props, delay_ms=HOUR)
        )
        before = broker.query(sent.msg_id)

        # a time the server's clock puts an hour in the past
        with pytest.raises(InvalidDelay) as delay:
            broker.reschedule(sent.msg_id, deliver_at_ms=int(time.time() * 1000) - HOUR)
        assert delay.value.field == "deliver_at_ms"
        # past the server's max delay (10 years)
        with pytest.raises(InvalidDelay):
            broker.reschedule(sent.msg_id, delay_ms=20 * 366 * 24 * HOUR)
        # a body under the limit alone, over it with the message's properties: the
        # server's check, answered as the same error with its numbers
        body = b"b" * (4 * 1024 * 1024 - 10)
        with pytest.raises(MessageTooLarge) as large:
            broker.reschedule(sent.msg_id, delay_ms=0, body=body)
        assert large.value.limit == 4 * 1024 * 1024
        assert large.value.size > large.value.limit
        # topics the server never had a message on
        with pytest.raises(UnknownTopic) as unknown:
            broker.abort_prefix("no-such-topic", "order:")
        assert unknown.value.topic == "no-such-topic"
        with pytest.raises(UnknownTopic):
            broker.find_pending("no-such-topic", key_prefix="order:")
        # a cursor the server did not make
        with pytest.raises(InvalidArgument, match="cursor"):
            broker.find_pending("orders", cursor="not-a-cursor")

        # nothing changed, and the connection still serves
        assert broker.query(sent.msg_id) == before
        assert broker.reschedule(key="order:1:close", topic="orders", delay_ms=2 * HOUR).status is (
            RescheduleStatus.RESCHEDULED
        )


def test_find_pending_pages_carry_bodies_in_due_order(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        n = 25
        sent = {}
        for i in range(n):  # due in the reverse of the send order
            job = "close_order" if i % 2 == 0 else "remind"
            m = Message(
                "orders",
                b"body-%d" % i,
                key=f"order:{i}:x",
                tags=job,
                delay_ms=HOUR + (n - i) * 1000,
            )
            sent[m.key] = (broker.send(m).msg_id, m.body)
        broker.send(Message("orders", b"other", key="cart:1", delay_ms=HOUR))

        views = []
        cursor = None
        for _ in range(100):
            page = broker.find_pending(
                "orders", key_prefix="order:", limit=4, cursor=cursor, with_body=True
            )
            assert len(page.messages) <= 4
            views.extend(page.messages)
            cursor = page.cursor
            if cursor is None:
                break
        assert cursor is None
        assert [v.key for v in views] == [f"order:{i}:x" for i in reversed(range(n))]
        assert all((v.msg_id, v.body) == sent[v.key] for v in views if v.key is not None)
        assert all(
            v.state is MessageState.PENDING and v.body_size == len(v.body or b"") for v in views
        )

        # by job (tag), without bodies
        page = broker.find_pending(tag="close_order", limit=100)
        while page.cursor is not None and len(page.messages) < 13:
            more = broker.find_pending(tag="close_order", limit=100, cursor=page.cursor)
            page = type(page)(page.messages + more.messages, more.cursor)
        assert sorted(v.key or "" for v in page.messages) == sorted(
            f"order:{i}:x" for i in range(0, n, 2)
        )
        assert all(v.body is None for v in page.messages)


def test_abort_prefix_of_20000_keys_while_others_are_answered(server: ServerProcess) -> None:
    n = 20_000
    with (
        RemoteBroker.from_url(server.url) as admin,
        RemoteBroker.from_url(server.url) as other,
    ):
        for start in range(0, n, 1000):
            admin.send_batch(
                [
                    Message("big", b"x", key=f"tenant:7:{i:06d}", delay_ms=HOUR)
                    for i in range(start, start + 1000)
                ]
            )
        admin.send_batch(
            [Message("big", b"y", key=f"tenant:8:{i}", delay_ms=HOUR) for i in range(5)]
        )
        admin.send(Message("big", b"now", key="tenant:7:fired"))
        eventually(lambda: admin.stats().topics["big"].fired_total == 1, what="one fired")

        # Another client sends and pulls in a loop; a thread of the aborting client
        # itself keeps asking for stats (its requests share the abort's connection).
        consumer = other.consumer("live-g", ["live"])
        stop = threading.Event()
        sends: list[float] = []
        pulls: list[tuple[float, int]] = []
        same_link: list[float] = []

        def live() -> None:
            while not stop.is_set():
                other.send(Message("live", b"p"))
                sends.append(time.monotonic())
                got = consumer.pull(32, 50)
                if got:
                    consumer.ack_batch(got)
                pulls.append((time.monotonic(), len(got)))

        def stats() -> None:
            while not stop.is_set():
                admin.stats()
                same_link.append(time.monotonic())

        threads = [threading.Thread(target=live), threading.Thread(target=stats)]
        for t in threads:
            t.start()
        eventually(lambda: len(pulls) >= 3 and len(same_link) >= 3, what="the loops run")
        t0 = time.monotonic()
        result = admin.abort_prefix("big", "tenant:7:")
        t1 = time.monotonic()
        stop.set()
        for t in threads:
            t.join(30)

        assert result.aborted == n
        assert result.already_delivered == ("tenant:7:fired",)
        assert result.already_delivered_count == 1
        assert admin.stats().topics["big"].pending == 5  # the other tenant's are left
        assert admin.find_pending("big", key_prefix="tenant:7:").messages == []
        during = [s for s in sends if t0 < s < t1]
        pulled = [c for at, c in pulls if t0 < at < t1]
        linked = [s for s in same_link if t0 < s < t1]
        assert during, "no other client's send was answered during the abort"
        assert pulled, "no other client's pull was answered during the abort"
        assert linked, "the aborting client's own connection answered nothing meanwhile"
        print(
            f"\nabort_prefix of {n}: {(t1 - t0) * 1000:.0f} ms; meanwhile {len(during)} sends, "
            f"{len(pulled)} pulls ({sum(pulled)} messages), {len(linked)} stats on the same link"
        )


def test_the_async_client_reschedules_finds_and_aborts(server: ServerProcess) -> None:
    async def main() -> str:
        broker = AsyncRemoteBroker.from_url(server.url)
        try:
            sent = await broker.send(
                Message("orders", b"v1", key="order:9:remind", tags="remind", delay_ms=HOUR)
            )
            moved = await broker.reschedule(
                key="order:9:remind", topic="orders", delay_ms=2 * HOUR, body=b"v2"
            )
            assert moved.status is RescheduleStatus.RESCHEDULED
            assert moved.msg_id == sent.msg_id
            assert moved.deliver_at_ms is not None and moved.deliver_at_ms > sent.deliver_at_ms
            page = await broker.find_pending("orders", key_prefix="order:9:", with_body=True)
            assert [(v.msg_id, v.body, v.deliver_at_ms, v.tags) for v in page.messages] == [
                (sent.msg_id, b"v2", moved.deliver_at_ms, "remind")
            ]
            assert page.cursor is None
            gone = await broker.abort_prefix("orders", "order:9:")
            assert (gone.aborted, gone.already_delivered) == (1, ())
            again = await broker.reschedule(sent.msg_id, delay_ms=0)
            assert again.status is RescheduleStatus.NOT_FOUND
            with pytest.raises(UnknownTopic):
                await broker.find_pending("nowhere")
            return sent.msg_id
        finally:
            await broker.close()

    msg_id = asyncio.run(main())
    with RemoteBroker.from_url(server.url) as sync:
        view = sync.query(msg_id)
        assert view is not None and view.state is MessageState.ABORTED


RATE_CHILD = """
import sys
from broker_adapter import open_broker
broker = open_broker(sys.argv[1])
waits = [broker.acquire_rate("exports", 5, 600_000) for _ in range(int(sys.argv[2]))]
print(sum(1 for w in waits if w == 0), min([w for w in waits if w] or [-1]))
broker.close()
"""


def test_a_rate_limit_and_a_semaphore_are_shared_by_all_clients(server: ServerProcess) -> None:
    # two processes at once take permits of one bucket: 5 per 10 minutes, a burst of 5
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RATE_CHILD, server.url, "8"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(2)
    ]
    outs = [c.communicate(timeout=120)[0].split() for c in children]
    assert all(c.returncode == 0 for c in children)
    taken = [int(o[0]) for o in outs]
    assert sum(taken) == 5, outs
    assert all(int(o[1]) > 0 for o in outs), "a refusal names a wait"

    # slots: two connections, one semaphore of 2
    with RemoteBroker.from_url(server.url) as a, RemoteBroker.from_url(server.url) as b:
        assert a.acquire_slot("backup", 2, "run-a", 60_000)
        assert b.acquire_slot("backup", 2, "run-b", 60_000)
        assert not a.acquire_slot("backup", 2, "run-c", 60_000)
        assert b.acquire_slot("backup", 2, "run-b", 60_000)  # a renewal
        assert b.release_slot("backup", "run-a")  # any client may give back a holder's slot
        assert a.acquire_slot("backup", 2, "run-c", 60_000)
        assert not a.release_slot("backup", "run-a")


def _old_server(seen: list[str]) -> socket.socket:
    """A stand-in for a server of before the runtime calls: its hello lists no ops, and
    it records every later request (a real old server would close on an unknown op)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                frames = P.FrameReader(conn)
                hello = P.decode_request((frames.frames() or [b""])[0])
                info = {"v": 1, "node": "0ld5e7ve", "max_body": 4 << 20, "max_frame": P.MAX_FRAME}
                conn.sendall(P.response(hello.rid, info))
                while got := frames.frames():
                    seen.extend(P.decode_request(f).op for f in got)
                    return  # unknown to it: it closes the connection

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_server_too_old_for_a_call_is_named_not_hung() -> None:
    seen: list[str] = []
    listener = _old_server(seen)
    port = listener.getsockname()[1]
    try:
        with RemoteBroker([("127.0.0.1", port)]) as broker:
            calls: list[Callable[[], object]] = [
                lambda: broker.reschedule("x", delay_ms=0),
                lambda: broker.abort_prefix("t", "p"),
                lambda: broker.find_pending("t"),
                lambda: broker.acquire_rate("b", 1, 1000),
                lambda: broker.acquire_slot("s", 1, "h", 1000),
                lambda: broker.release_slot("s", "h"),
            ]
            for call in calls:
                with pytest.raises(ServerTooOld, match="upgrade chronoq"):
                    call()

        async def via_async() -> None:
            client = AsyncRemoteBroker([("127.0.0.1", port)])
            try:
                with pytest.raises(ServerTooOld, match="'find_pending'"):
                    await client.find_pending("t")
            finally:
                await client.close()

        asyncio.run(via_async())
    finally:
        listener.close()
    assert seen == [], "a call the server does not know was sent to it"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_count_the_runtime_calls(tmp_path: Path) -> None:
    port = _free_port()
    proc = ServerProcess(tmp_path / "d", extra=("--metrics-port", str(port))).start()
    try:
        with RemoteBroker.from_url(proc.url) as broker:
            r = broker.send(Message("mt", b"x", key="k:1", delay_ms=HOUR))
            broker.send_batch([Message("mt", b"x", key=f"k:{i}", delay_ms=HOUR) for i in (2, 3)])
            broker.reschedule(r.msg_id, delay_ms=2 * HOUR)
            broker.reschedule(key="none", topic="mt", delay_ms=0)
            broker.find_pending("mt", key_prefix="k:")
            broker.abort_prefix("mt", "k:")
            broker.acquire_rate("b", 1, 60_000)
            broker.acquire_rate("b", 1, 60_000)
            broker.acquire_slot("s", 1, "h", 60_000)
            broker.release_slot("s", "h")
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
            lines = set(text.read().decode().splitlines())
        assert 'chronoq_reschedules_total{status="RESCHEDULED"} 1.0' in lines
        assert 'chronoq_reschedules_total{status="NOT_FOUND"} 1.0' in lines
        assert "chronoq_prefix_aborted_messages_total 3.0" in lines
        assert 'chronoq_rate_permits_total{outcome="taken"} 1.0' in lines
        assert 'chronoq_rate_permits_total{outcome="refused"} 1.0' in lines
        assert 'chronoq_slot_acquires_total{outcome="taken"} 1.0' in lines
        for op, n in (
            ("reschedule", 2),
            ("find_pending", 1),
            ("abort_prefix", 1),
            ("acquire_rate", 2),
            ("acquire_slot", 1),
            ("release_slot", 1),
        ):
            assert f'chronoq_requests_total{{op="{op}"}} {n}.0' in lines, op
    finally:
        proc.kill()
