"""Dead letters and pending counts through a ``chronoq://`` client of two servers (real
processes): pages merged in one order of death over both servers' pages (ids tagged
with their node), requeue/purge by tagged id routed to the one server that has it,
"the oldest" worked through server after server, counts added up; the async client
answers the same; the server's metrics count what was settled."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import pytest

from broker_adapter.message import Message
from broker_adapter.results import MessageState, MessageView
from broker_adapter.server.async_client import AsyncRemoteBroker
from broker_adapter.server.client import RemoteBroker
from tests.helpers import pull_until
from tests.server.conftest import TOKEN
from tests.server.serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

T = "t"
G = "g"
HOUR = 3_600_000


def _all_dead(broker: RemoteBroker, limit: int) -> list[MessageView]:
    out: list[MessageView] = []
    cursor = None
    for _ in range(1000):
        page = broker.dead_letters(G, cursor=cursor, limit=limit)
        assert len(page.messages) <= limit
        out.extend(page.messages)
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("dead_letters never ended")


def test_dead_letters_over_two_servers(two_servers: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = two_servers
    url = f"chronoq://127.0.0.1:{a.port},127.0.0.1:{b.port}?token={TOKEN}"
    with RemoteBroker.from_url(url) as broker:
        consumer = broker.consumer(G, [T])
        sent = [broker.send(Message(T, b"%d" % i)) for i in range(20)]  # round robin
        assert {r.msg_id.partition(":")[0] for r in sent} == {a.node, b.node}
        got = pull_until(consumer, 20)
        for i, m in enumerate(sorted(got, key=lambda m: m.msg_id)):
            assert consumer.dead_letter(m, f"r{i}")
        ids = sorted(r.msg_id for r in sent)

        listed = _all_dead(broker, 3)
        assert sorted(v.msg_id for v in listed) == ids  # each once, node-tagged
        deaths = [v.deliver_at_ms for v in listed]
        assert deaths == sorted(deaths)
        assert all(v.state is MessageState.DEAD and v.error for v in listed)

        on_a = [i for i in ids if i.startswith(a.node + ":")][:2]
        on_b = [i for i in ids if i.startswith(b.node + ":")][:1]
        assert broker.purge_dead(G, [*on_a, *on_b]) == 3
        assert broker.purge_dead(G, on_a) == 0
        view = broker.query(on_b[0])
        assert view is not None and view.groups[G] is MessageState.DONE
        assert broker.requeue_dead(G, limit=10) == 10
        assert broker.requeue_dead(G, limit=10) == 7
        assert broker.requeue_dead(G) == 0
        again = pull_until(consumer, 17)
        assert sorted(m.msg_id for m in again) == sorted(set(ids) - {*on_a, *on_b})
        assert _all_dead(broker, 5) == []

        now = broker.query(ids[0]).born_ms  # type: ignore[union-attr]  # the servers' time
        broker.send_batch([Message(T, b"x", delay_ms=HOUR + i) for i in range(9)])
        edges = [now, now + HOUR // 2, now + 2 * HOUR]
        counts = broker.count_pending(edges)
        assert (counts.counts, counts.exact) == ([0, 9], True)

        async def from_async() -> tuple[object, object]:
            async with AsyncRemoteBroker.from_url(url) as client:
                page = await client.dead_letters(G)
                return page.messages, await client.count_pending(edges)

        messages, async_counts = asyncio.run(from_async())
        assert messages == [] and async_counts == counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_count_settled_dead_letters_and_the_gauge_follows(tmp_path: Path) -> None:
    port = _free_port()
    proc = ServerProcess(tmp_path / "d", extra=("--metrics-port", str(port))).start()
    try:
        with RemoteBroker.from_url(proc.url) as broker:
            consumer = broker.consumer(G, [T])
            sent = [broker.send(Message(T, b"x")).msg_id for _ in range(3)]
            for m in pull_until(consumer, 3):
                assert consumer.dead_letter(m, "x")
            assert broker.requeue_dead(G, [sent[0]]) == 1
            assert broker.purge_dead(G) == 2
            assert broker.purge_dead(G) == 0
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
            lines = set(text.read().decode().splitlines())
        assert 'chronoq_dead_letters_settled_total{action="requeue"} 1.0' in lines
        assert 'chronoq_dead_letters_settled_total{action="purge"} 2.0' in lines
        assert 'chronoq_dead{group="g"} 0.0' in lines
        assert 'chronoq_requests_total{op="purge_dead"} 2.0' in lines
    finally:
        proc.kill()
