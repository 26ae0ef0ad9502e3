"""AsyncRemoteBroker against real server subprocesses on 127.0.0.1: every call and its
answers (cross-checked with the sync client), 1,000 coroutines on one connection,
tokens, the body limit, restarts, failover, closing, timeouts, and a loop that
keeps running while the server does not answer."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker_adapter.errors import (
    AuthenticationFailed,
    BrokerClosed,
    ConnectionFailed,
    InvalidArgument,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, MessageState, SendStatus
from broker_adapter.server.async_client import AsyncRemoteBroker
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.link import RequestTimeout
from broker_adapter.server.routing import key_index
from broker_adapter.urls import open_async_broker
from tests.helpers import eventually
from tests.server.conftest import TOKEN
from tests.server.serverproc import ServerProcess

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run a test's coroutine on a fresh event loop."""

    async def wrapped() -> T:
        return await main()

    return asyncio.run(wrapped())


@contextmanager
def paused(server: ServerProcess) -> Iterator[int]:
    """The server stopped (SIGSTOP: its socket accepts, nothing answers) inside the block."""
    assert server.proc is not None
    pid = server.proc.pid
    server.proc.send_signal(signal.SIGSTOP)
    eventually(lambda: "\tT" in Path(f"/proc/{pid}/status").read_text(), what="server stopped")
    try:
        yield pid
    finally:
        server.proc.send_signal(signal.SIGCONT)


async def in_flight() -> None:
    """Let the loop write what the tasks just created asked for."""
    for _ in range(5):
        await asyncio.sleep(0)


def sync_client(server: ServerProcess) -> RemoteBroker:
    return RemoteBroker.from_url(server.url)


def test_every_call_answers_as_the_sync_client_does(server: ServerProcess) -> None:
    async def main() -> dict[str, Any]:
        async with AsyncRemoteBroker.from_url(server.url) as b:
            out: dict[str, Any] = {}
            out["first"] = await b.send(Message("calls", b"1", key="order:1", delay_ms=60_000))
            out["again"] = await b.send(Message("calls", b"22", key="order:1", delay_ms=5))
            out["batch"] = await b.send_batch(
                [
                    Message("calls", b"333", key="order:2", delay_ms=30_000),
                    Message("calls", b"4", key="order:1", delay_ms=1),
                    Message("calls", b"5", delay_ms=90_000),
                ]
            )
            out["empty"] = await b.send_batch([])
            out["view"] = await b.query(out["first"].msg_id)
            out["unknown"] = await b.query("0" * 32)
            out["pending"] = await b.pending("calls")
            out["first two"] = await b.pending("calls", limit=2)
            out["window"] = await b.pending(
                start_ms=out["first"].deliver_at_ms, end_ms=out["first"].deliver_at_ms + 1
            )
            out["stats"] = await b.stats()
            out["by id"] = await b.abort(out["batch"][2].msg_id)
            out["by id again"] = await b.abort(out["batch"][2].msg_id)
            out["by key"] = await b.abort(key="order:1", topic="calls")
            out["no key"] = await b.abort(key="order:404", topic="calls")
            out["no id"] = await b.abort("0" * 32)
            now = await b.send(Message("calls", b"due now"))
            while (await b.query(now.msg_id)).state is MessageState.PENDING:  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            out["fired"] = await b.abort(now.msg_id)
            out["fired id"] = now.msg_id
            return out

    out = run(main)
    first, again, batch = out["first"], out["again"], out["batch"]
    assert first.status is SendStatus.OK
    assert (again.status, again.msg_id) == (SendStatus.DUPLICATE, first.msg_id)
    assert [r.status for r in batch] == [SendStatus.OK, SendStatus.DUPLICATE, SendStatus.OK]
    assert batch[1].msg_id == first.msg_id and out["empty"] == []
    view = out["view"]
    assert (view.msg_id, view.state, view.key, view.body_size) == (
        first.msg_id,
        MessageState.PENDING,
        "order:1",
        1,
    )
    assert out["unknown"] is None
    due_order = [batch[0].msg_id, first.msg_id, batch[2].msg_id]
    assert [v.msg_id for v in out["pending"]] == due_order
    assert [v.msg_id for v in out["first two"]] == due_order[:2]
    assert [v.msg_id for v in out["window"]] == [first.msg_id]
    assert out["stats"].topics["calls"].pending == 3
    assert out["by id"].status is AbortStatus.ABORTED
    assert out["by id again"].status is AbortStatus.ABORTED
    assert (out["by key"].status, out["by key"].msg_id) == (AbortStatus.ABORTED, first.msg_id)
    assert (out["no key"].status, out["no key"].msg_id) == (AbortStatus.NOT_FOUND, None)
    assert out["no id"].status is AbortStatus.NOT_FOUND
    assert out["fired"].status is AbortStatus.ALREADY_DELIVERED
    with sync_client(server) as sync:  # the same answers through the other client
        assert sync.pending("calls") == [v for v in out["pending"] if v.msg_id == batch[0].msg_id]
        assert sync.query(first.msg_id) is not None
        assert sync.query(first.msg_id).state is MessageState.ABORTED  # type: ignore[union-attr]
        assert sync.abort(out["fired id"]).status is AbortStatus.ALREADY_DELIVERED


def test_arguments_are_refused_before_any_io(server: ServerProcess) -> None:
    async def main() -> None:
        b = AsyncRemoteBroker.from_url(server.url)
        with pytest.raises(InvalidArgument):
            await b.send("not a message")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            await b.abort()
        with pytest.raises(InvalidArgument):
            await b.pending(limit=0)
        assert all(ep.node == "" for ep in b.endpoints)  # never connected
        await b.close()

    run(main)
    with pytest.raises(InvalidArgument):
        AsyncRemoteBroker.from_url(f"chronoq://127.0.0.1:{server.port}?colour=red")
    with pytest.raises(InvalidArgument):
        AsyncRemoteBroker("", token=TOKEN)


def test_open_async_broker_gives_the_native_client_with_url_options(
    server: ServerProcess,
) -> None:
    b = open_async_broker(server.url + "&send_timeout_ms=700&retries=1", request_timeout_s=5)
    assert isinstance(b, AsyncRemoteBroker)
    assert (b.send_timeout_ms, b.retries, b.request_timeout_s) == (700, 1, 5.0)

    async def main() -> SendStatus:
        async with b:
            return (await b.send(Message("opened", b"x"))).status

    assert run(main) is SendStatus.OK


def test_a_thousand_coroutines_share_one_connection_and_each_gets_its_own_answer(
    server: ServerProcess,
) -> None:
    n = 1000

    async def main() -> None:
        async with AsyncRemoteBroker.from_url(server.url) as b:
            await b.stats()
            link = await b.endpoints[0].link(b.check_open)

            async def one(i: int) -> None:
                r = await b.send(Message("many", b"x" * (i % 7), key=f"k{i}", delay_ms=60_000 + i))
                assert r.status is SendStatus.OK
                v = await b.query(r.msg_id)
                assert v is not None and (v.msg_id, v.key, v.body_size) == (
                    r.msg_id,
                    f"k{i}",
                    i % 7,
                )

            await asyncio.gather(*(one(i) for i in range(n)))
            assert await b.endpoints[0].link(b.check_open) is link  # one connection throughout
            views = await b.pending("many", limit=n)
            assert [v.key for v in views] == [f"k{i}" for i in range(n)]
            dups = await asyncio.gather(
                *(b.send(Message("many", b"", key=f"k{i}", delay_ms=5)) for i in range(0, n, 10))
            )
            assert {r.status for r in dups} == {SendStatus.DUPLICATE}
            assert [r.msg_id for r in dups] == [views[i].msg_id for i in range(0, n, 10)]

    run(main)


@pytest.mark.parametrize("token", [None, "wrong"], ids=["none", "wrong"])
def test_a_missing_or_wrong_token_is_refused(server: ServerProcess, token: str | None) -> None:
    url = f"chronoq://127.0.0.1:{server.port}" + (f"?token={token}" if token else "")

    async def main() -> None:
        async with AsyncRemoteBroker.from_url(url) as b:
            with pytest.raises(AuthenticationFailed):
                await b.send(Message("auth", b"x"))
            with pytest.raises(AuthenticationFailed):
                await b.stats()

    run(main)
    with sync_client(server) as sync:
        assert "auth" not in sync.stats().topics


def test_the_token_a_server_took_from_chronoq_token_lets_the_url_in(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "d", env={"CHRONOQ_TOKEN": "from-env"}).start()
    try:

        async def main() -> tuple[SendStatus, type[BaseException]]:
            async with AsyncRemoteBroker.from_url(proc.url + "?token=from-env") as good:
                status = (await good.send(Message("env", b"x"))).status
            async with AsyncRemoteBroker.from_url(proc.url) as bad:
                try:
                    await bad.stats()
                except AuthenticationFailed as e:
                    return status, type(e)
            raise AssertionError("no token was accepted")

        assert run(main) == (SendStatus.OK, AuthenticationFailed)
    finally:
        proc.kill()


def test_a_body_over_the_servers_limit_is_refused_before_sending(server: ServerProcess) -> None:
    """The server does not run while the big sends are refused: no request reached it."""

    async def main() -> None:
        async with AsyncRemoteBroker.from_url(server.url) as b:
            await b.stats()
            limit = (await b.endpoints[0].link(b.check_open)).max_body
            big = Message("big", b"x" * (limit + 1))
            with paused(server):
                with pytest.raises(MessageTooLarge) as info:
                    await asyncio.wait_for(b.send(big), 10)
                assert (info.value.size, info.value.limit) == (limit + 1, limit)
                with pytest.raises(MessageTooLarge):
                    await asyncio.wait_for(b.send_batch([Message("big", b"ok"), big]), 10)
            assert "big" not in (await b.stats()).topics

    run(main)


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


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    a = ServerProcess(tmp_path / "a", token=TOKEN).start()
    b = ServerProcess(tmp_path / "b", token=TOKEN).start()
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


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


def test_a_client_outliving_its_event_loop_connects_again_on_the_next(
    server: ServerProcess,
) -> None:
    b = AsyncRemoteBroker.from_url(server.url)
    first = run(lambda: b.send(Message("loops", b"1", delay_ms=60_000)))
    second = run(lambda: b.send(Message("loops", b"2", delay_ms=60_000)))
    assert run(b.stats).topics["loops"].pending == 2
    assert first.msg_id != second.msg_id
    run(b.close)
