"""The runtime calls of a ``chronoq://`` client of several servers: reschedules routed
by id and key, prefix aborts summed, ``find_pending`` walked in one due order over
every server's pages, buckets kept by one server. Two real server processes; and
the page merge against a model of servers whose pages come short at random."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter.errors import InvalidArgument, UnknownTopic
from broker_adapter.message import Message
from broker_adapter.results import MessageState, MessageView, PendingPage, RescheduleStatus
from broker_adapter.server import find_merge
from broker_adapter.server.client import RemoteBroker
from tests.server.conftest import TOKEN
from tests.server.serverproc import ServerProcess

HOUR = 3_600_000


def _url(a: ServerProcess, b: ServerProcess) -> str:
    return f"chronoq://127.0.0.1:{a.port},127.0.0.1:{b.port}?token={TOKEN}"


def _walk(broker: RemoteBroker, limit: int, **filters: object) -> list[MessageView]:
    out: list[MessageView] = []
    cursor = None
    for _ in range(1000):
        page = broker.find_pending(limit=limit, cursor=cursor, **filters)  # type: ignore[arg-type]
        assert len(page.messages) <= limit
        out.extend(page.messages)
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("find_pending never ended")


def test_runtime_calls_over_two_servers(two_servers: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = two_servers
    rng = random.Random(7)
    dues = [HOUR + rng.randrange(0, 30) * 1000 for _ in range(60)]  # ties on purpose
    with RemoteBroker.from_url(_url(a, b)) as broker, RemoteBroker.from_url(_url(a, b)) as peer:
        sent = {}
        for i, due in enumerate(dues):
            m = Message("orders", b"b%d" % i, key=f"order:{i}:close", tags="close", delay_ms=due)
            sent[m.key] = broker.send(m)
        assert {r.msg_id.partition(":")[0] for r in sent.values()} == {a.node, b.node}
        broker.send(Message("orders", b"x", key="cart:1", tags="cart", delay_ms=HOUR))

        # one due order over both servers' pages, each message once, with its body
        views = _walk(broker, 7, topic="orders", key_prefix="order:", with_body=True)
        assert sorted(v.msg_id for v in views) == sorted(r.msg_id for r in sent.values())
        assert [v.deliver_at_ms for v in views] == sorted(v.deliver_at_ms for v in views)
        assert all(v.body == b"b" + (v.key or "").split(":")[1].encode() for v in views)
        assert {v.msg_id for v in _walk(peer, 5, tag="close")} == {r.msg_id for r in sent.values()}

        # reschedules by key and by (node-tagged) id reach the one server that has it
        moved = broker.reschedule(key="order:3:close", topic="orders", delay_ms=2 * HOUR)
        assert (moved.status, moved.msg_id) == (
            RescheduleStatus.RESCHEDULED,
            sent["order:3:close"].msg_id,
        )
        by_id = peer.reschedule(sent["order:4:close"].msg_id, delay_ms=3 * HOUR, body=b"new")
        assert by_id.status is RescheduleStatus.RESCHEDULED
        view = broker.query(sent["order:4:close"].msg_id)
        assert view is not None and view.deliver_at_ms == by_id.deliver_at_ms
        last = _walk(broker, 10, topic="orders", key_prefix="order:", with_body=True)[-1]
        assert (last.key, last.body) == ("order:4:close", b"new")

        # a prefix abort asks both servers and sums their answers
        done = broker.abort_prefix("orders", "order:")
        assert (done.aborted, done.already_delivered_count) == (60, 0)
        state = broker.query(sent["order:5:close"].msg_id)
        assert state is not None and state.state is MessageState.ABORTED
        assert [v.key for v in _walk(peer, 3, topic="orders")] == ["cart:1"]

        # a topic one server knows is not unknown; one neither knows is
        broker.send(Message("solo", b"s", key="only", delay_ms=HOUR))
        assert [v.key for v in broker.find_pending("solo", key_prefix="on").messages] == ["only"]
        assert broker.abort_prefix("solo", "on").aborted == 1
        with pytest.raises(UnknownTopic):
            broker.find_pending("never", key_prefix="x")
        with pytest.raises(UnknownTopic):
            broker.abort_prefix("never", "x")
        with pytest.raises(InvalidArgument, match="cursor"):
            broker.find_pending("orders", cursor="x1garbage")

        # one bucket for every client, kept by the server its name hashes to
        taken = [c.acquire_rate("exports", 3, 600_000) == 0 for c in (broker, peer) * 3]
        assert taken.count(True) == 3
        assert broker.acquire_slot("nightly", 1, "run-1", 60_000)
        assert not peer.acquire_slot("nightly", 1, "run-2", 60_000)


# -- the page merge against a model --------------------------------------------------------


class ModelServer:
    """A server's pending messages in due order, paged as a real one may: a page holds
    at most ``limit`` and, at random, fewer (even none) before the last."""

    def __init__(self, name: str, dues: list[int], rng: random.Random) -> None:
        self.views = sorted(
            (
                MessageView(f"{name}{i}", "t", MessageState.PENDING, d, 0)
                for i, d in enumerate(dues)
            ),
            key=lambda v: (v.deliver_at_ms, v.msg_id),
        )
        self.rng = rng

    def page(self, cursor: str | None, limit: int) -> PendingPage:
        pos = int(cursor) if cursor is not None else 0
        size = min(limit, self.rng.randrange(0, limit + 1))
        end = min(pos + size, len(self.views))
        return PendingPage(self.views[pos:end], None if end == len(self.views) else str(end))


@settings(max_examples=200, deadline=None)
@given(
    servers=st.lists(st.lists(st.integers(0, 20), max_size=25), min_size=1, max_size=3),
    limit=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_merged_pages_hand_out_every_message_once_in_due_order(
    servers: list[list[int]], limit: int, seed: int
) -> None:
    rng = random.Random(seed)
    models = [ModelServer(f"s{i}-", dues, rng) for i, dues in enumerate(servers)]
    out: list[MessageView] = []
    cursor = None
    for _ in range(10_000):
        walks = find_merge.decode_cursor(cursor, len(models))
        pages: dict[int, PendingPage | None] = {
            i: models[i].page(w.cursor, limit) for i, w in enumerate(walks) if not w.done
        }
        takes = find_merge.plan(pages, limit)
        fetched = {}
        for i, take in takes.items():
            cut = pages[i]
            if cut is not None and 0 < take < len(cut.messages):  # may come back shorter
                fetched[i] = models[i].page(walks[i].cursor, take)
        views, walks = find_merge.finish(walks, pages, takes, fetched, ["" for _ in models])
        assert len(views) <= limit
        out.extend(views)
        cursor = find_merge.encode_cursor(walks)
        if cursor is None:
            break
    assert cursor is None, "the walk never ended"
    assert sorted(v.msg_id for v in out) == sorted(v.msg_id for m in models for v in m.views)
    assert [v.deliver_at_ms for v in out] == sorted(v.deliver_at_ms for v in out)
