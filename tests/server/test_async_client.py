"""AsyncRemoteBroker against real server subprocesses on 127.0.0.1: every call and
its answers (cross-checked with the sync client), arguments refused before any I/O,
the URL, 1,000 coroutines on one connection, tokens, the server's body limit, a Unix
socket endpoint, a client used on two loops. Faults: ``test_async_client_faults.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker_adapter.errors import AuthenticationFailed, InvalidArgument, MessageTooLarge
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, MessageState, SendStatus
from broker_adapter.server.async_client import AsyncRemoteBroker
from broker_adapter.server.server import BrokerServer
from broker_adapter.urls import open_async_broker
from tests.server.aio import paused, run, sync_client
from tests.server.conftest import TOKEN
from tests.server.serverproc import ServerProcess


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
            while (fired := await b.query(now.msg_id)) and fired.state is MessageState.PENDING:
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


def test_a_client_outliving_its_event_loop_connects_again_on_the_next(
    server: ServerProcess,
) -> None:
    b = AsyncRemoteBroker.from_url(server.url)
    first = run(lambda: b.send(Message("loops", b"1", delay_ms=60_000)))
    second = run(lambda: b.send(Message("loops", b"2", delay_ms=60_000)))
    assert run(b.stats).topics["loops"].pending == 2
    assert first.msg_id != second.msg_id
    run(b.close)


def test_a_unix_socket_endpoint(tmp_path: Path) -> None:
    """``(path, None)`` reaches a server listening on a Unix socket (a data directory's
    owner serves one)."""
    sock = tmp_path / "chronoq.sock"
    server = BrokerServer(tmp_path / "data", unix_path=sock)
    server.start()
    try:

        async def main() -> tuple[str, str | None, str]:
            async with AsyncRemoteBroker([(str(sock), None)]) as b:
                r = await b.send(Message("unix", b"x", key="u:1", delay_ms=60_000))
                view = await b.query(r.msg_id)
                return r.msg_id, None if view is None else view.key, b.endpoints[0].node

        msg_id, key, node = run(main)
        assert (key, node) == ("u:1", server.node)
        assert server.broker.query(msg_id) is not None
    finally:
        server.shutdown()
