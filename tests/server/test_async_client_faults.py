"""AsyncRemoteBroker when things go wrong, against real server subprocesses: a
request cut by a dying server, sends across a restart, failover between two
servers, closing with a request waiting, timeouts, and an event loop that keeps
running while a server does not answer."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from broker_adapter.errors import BrokerClosed, ConnectionFailed
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, MessageState, SendStatus
from broker_adapter.server.async_client import AsyncRemoteBroker
from broker_adapter.server.link import RequestTimeout
from broker_adapter.server.routing import key_index
from tests.server.aio import in_flight, paused, run
from tests.server.conftest import TOKEN
from tests.server.serverproc import ServerProcess

T = TypeVar("T")


def test_a_request_in_flight_when_the_server_dies_fails_typed_and_the_client_reconnects(
    server: ServerProcess,
) -> None:
    async def main() -> None:
        b = AsyncRemoteBroker.from_url(server.url, retries=0)
        before = await b.send(Message("re", b"before", delay_ms=600_000))
        with paused(server):
            query = asyncio.create_task(b.query(before.msg_id))
            send = asyncio.create_task(b.send(Message("re", b"unread", delay_ms=600_000)))
            await in_flight()
            server.kill()
        for task in (query, send):
            with pytest.raises(ConnectionFailed):
                await task
        with pytest.raises(ConnectionFailed):  # down: refused at once, typed
            await b.stats()
        await asyncio.to_thread(server.start)
        view = await b.query(before.msg_id)  # a new connection, the data kept
        assert view is not None and view.state is MessageState.PENDING
        assert [v.msg_id for v in await b.pending("re")] == [before.msg_id]
        assert (await b.send(Message("re", b"after"))).status is SendStatus.OK
        await b.close()

    run(main)


def test_sends_across_a_server_restart_are_answered_or_fail_typed_never_lost(
    server: ServerProcess,
) -> None:
    async def main() -> None:
        b = AsyncRemoteBroker.from_url(server.url)
        ok: list[str] = []
        failed: list[ConnectionFailed] = []
        stop = asyncio.Event()

        async def sender(w: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    r = await b.send(Message("load", b"%d-%d" % (w, i), delay_ms=600_000))
                    ok.append(r.msg_id)
                except ConnectionFailed as e:  # anything else fails the test
                    failed.append(e)
                    await asyncio.sleep(0.01)
                i += 1

        async def until(count: int) -> None:
            while len(ok) < count:
                if any(s.done() for s in senders):
                    await asyncio.gather(*senders)  # a sender's unexpected error, raised
                    raise AssertionError("a sender stopped early")
                await asyncio.sleep(0.01)

        senders: list[asyncio.Task[None]] = []
        senders += [asyncio.create_task(sender(w)) for w in range(20)]
        await until(300)
        await asyncio.to_thread(server.restart)
        await until(len(ok) + 300)  # reconnected
        stop.set()
        await asyncio.gather(*senders)
        views = await asyncio.gather(*(b.query(i) for i in ok))
        assert all(v is not None and v.state is MessageState.PENDING for v in views)
        assert (await b.stats()).topics["load"].pending >= len(ok)
        await b.close()

    run(main)


def test_several_servers_share_sends_merge_reads_and_fail_over(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    url = f"chronoq://127.0.0.1:{a.port},127.0.0.1:{b.port}?token={TOKEN}"
    key_on_a = next(f"order:{i}" for i in range(100) if key_index("fo", f"order:{i}", 2) == 0)

    async def main() -> None:
        async with AsyncRemoteBroker.from_url(url) as broker:
            sent = [
                await broker.send(Message("multi", b"%d" % i, delay_ms=60_000 + i))
                for i in range(20)
            ]
            assert {r.msg_id.partition(":")[0] for r in sent} == {a.node, b.node}
            view = await broker.query(sent[3].msg_id)
            assert view is not None and view.msg_id == sent[3].msg_id
            assert [v.msg_id for v in await broker.pending("multi")] == [r.msg_id for r in sent]
            assert (await broker.stats()).topics["multi"].pending == 20
            assert (await broker.abort(sent[4].msg_id)).status is AbortStatus.ABORTED
            keyed = await broker.send(Message("fo", b"1", key=key_on_a, delay_ms=60_000))
            assert keyed.msg_id.startswith(a.node + ":")
            again = await broker.send(Message("fo", b"2", key=key_on_a, delay_ms=60_000))
            assert (again.status, again.msg_id) == (SendStatus.DUPLICATE, keyed.msg_id)

            a.kill()
            after = await asyncio.gather(
                *(broker.send(Message("fo", b"%d" % i)) for i in range(100))
            )
            assert {r.msg_id.partition(":")[0] for r in after} == {b.node}
            assert not broker.fault.available(0) and broker.fault.available(1)
            on_b = next(r for r in sent if r.msg_id.startswith(b.node))
            assert (await broker.query(on_b.msg_id)) is not None
            with pytest.raises(ConnectionFailed):  # a key's endpoint is fixed: no failover
                await broker.send(Message("fo", b"3", key=key_on_a))
            with pytest.raises(ConnectionFailed):  # its message lives on the dead one
                await broker.query(keyed.msg_id)

    run(main)


def test_a_closed_client_raises_broker_closed_and_so_does_a_request_it_cut(
    server: ServerProcess,
) -> None:
    async def main() -> None:
        b = AsyncRemoteBroker.from_url(server.url)
        r = await b.send(Message("closing", b"x", delay_ms=60_000))
        with paused(server):
            waiting = asyncio.create_task(b.query(r.msg_id))
            await in_flight()
            await b.close()
            with pytest.raises(BrokerClosed):
                await waiting
        assert b.closed
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: b.send(Message("closing", b"y")),
            lambda: b.send_batch([Message("closing", b"y")]),
            lambda: b.abort(r.msg_id),
            lambda: b.query(r.msg_id),
            lambda: b.pending(),
            lambda: b.stats(),
        ]
        for call in calls:
            with pytest.raises(BrokerClosed):
                await call()
        await b.close()  # twice: harmless

    run(main)


def test_a_request_the_server_does_not_answer_times_out_and_keeps_the_connection(
    server: ServerProcess,
) -> None:
    async def main() -> None:
        b = AsyncRemoteBroker.from_url(
            server.url, request_timeout_s=0.3, send_timeout_ms=300, retries=0
        )
        await b.stats()
        link = await b.endpoints[0].link(b.check_open)
        with paused(server):
            with pytest.raises(RequestTimeout):
                await b.stats()
            with pytest.raises(ConnectionFailed):
                await b.send(Message("slow", b"late"))
        assert (await b.send(Message("slow", b"after"))).status is SendStatus.OK
        assert await b.endpoints[0].link(b.check_open) is link
        await b.close()

    run(main)


def test_the_loop_keeps_running_while_the_server_does_not_answer(server: ServerProcess) -> None:
    """A ticker must finish its ticks while a connect and a request wait on a stopped
    server. A client that blocked the loop would only return when the timer below
    resumes the server, and then the request would be done first."""

    async def ticks_while(pid: int, request: Callable[[], Coroutine[Any, Any, T]]) -> T:
        resume = threading.Timer(20, os.kill, (pid, signal.SIGCONT))
        resume.start()
        try:
            call = asyncio.create_task(request())

            async def ticker() -> None:
                for _ in range(20):
                    await asyncio.sleep(0.005)

            tick = asyncio.create_task(ticker())
            done, _ = await asyncio.wait({call, tick}, return_when=asyncio.FIRST_COMPLETED)
            assert tick in done and not call.done()
            os.kill(pid, signal.SIGCONT)
            return await call
        finally:
            resume.cancel()

    async def main() -> None:
        b = AsyncRemoteBroker.from_url(server.url, connect_timeout_s=60)
        with paused(server) as pid:  # connecting: the kernel accepts, hello waits
            stats = await ticks_while(pid, b.stats)
        assert stats == await b.stats()
        with paused(server) as pid:  # connected: the answer waits
            sent = await ticks_while(pid, lambda: b.send(Message("tick", b"x")))
        assert sent.status is SendStatus.OK
        await b.close()

    run(main)
