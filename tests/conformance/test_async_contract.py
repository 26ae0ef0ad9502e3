"""The client half of the broker contract, awaitable
(:class:`~broker_adapter.async_base.AsyncBrokerAdapter`): send, send_batch, abort,
query, pending, stats and close keep every sentence of ``broker_adapter/base.py``.

Runs against every adapter of ``conftest.ADAPTERS`` through ``async_harness``
(ids ``embedded``, ``memory``, ``remote``, ``redis``): the client is opened as an
app opens it (``conftest.open_async_of``), so a native adapter registered in
``ASYNC_ADAPTERS`` (``chronoq://``, ``redis://``) is what runs here, and the
threaded fallback where there is none. The sync broker of the same harness is
the witness: consumers, the clock and the check of what a call stored.

Coroutines are driven with plain ``asyncio.run`` (``AsyncHarness.run``), one loop
per test, no pytest-asyncio: an async adapter belongs to the loop it is used on,
and the harness closes it on that loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker_adapter.errors import (
    BrokerClosed,
    InvalidArgument,
    InvalidDelay,
    InvalidMessage,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import AbortStatus, MessageState, SendStatus, TopicStats
from tests.conformance.conftest import AsyncHarness
from tests.helpers import eventually, pull_one

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
DEFAULT_MAX_BODY = 4 * MiB
TOO_FAR_MS = 11 * 365 * 24 * 3600 * 1000  # past the default max delay of 10 years
T = "t"


def nothing_stored(ah: AsyncHarness) -> bool:
    stats = ah.sync.broker.stats()
    return ah.sync.broker.pending() == [] and stats.pending == 0 and stats.fired_total == 0


# --------------------------------------------------------------------------- send


@pytest.mark.parametrize(
    ("timing", "delay"),
    [
        ({}, 0),
        ({"delay_ms": 5_000}, 5_000),
        ({"delay_sec": 1.5}, 1_500),
        ({"delay_level": 3}, 10_000),
        ({"delay_level": 99}, 7_200_000),
    ],
)
def test_send_answers_ok_with_an_id_and_the_due_time(
    async_harness: AsyncHarness, timing: dict[str, Any], delay: int
) -> None:
    ah = async_harness
    r = ah.run(lambda: ah.broker.send(Message(T, b"a", **timing)))
    assert r.status is SendStatus.OK and isinstance(r.msg_id, str) and r.msg_id
    assert r.deliver_at_ms == ah.sync.now + delay
    view = ah.sync.broker.query(r.msg_id)
    assert view is not None and view.deliver_at_ms == r.deliver_at_ms


def test_send_keeps_an_absolute_time(async_harness: AsyncHarness) -> None:
    ah = async_harness
    at = ah.sync.now + 12_345
    assert ah.run(lambda: ah.broker.send(Message(T, b"x", deliver_at_ms=at))).deliver_at_ms == at


def test_sent_message_is_delivered_with_its_fields(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer = ah.sync.consumer("g", [T])
    r = ah.run(lambda: ah.broker.send(Message(T, b"body", key="k", tags="tg", delay_ms=1_000)))
    ah.sync.advance(1_000)
    got = pull_one(consumer)
    assert (got.msg_id, got.body, got.key, got.tags) == (r.msg_id, b"body", "k", "tg")


def test_keyed_send_while_pending_is_a_duplicate_of_the_first(async_harness: AsyncHarness) -> None:
    ah = async_harness

    async def body() -> tuple[Any, Any, Any]:
        first = await ah.broker.send(Message(T, b"1", key="a", delay_ms=5_000))
        again = await ah.broker.send(Message(T, b"2", key="a", delay_ms=9_000))
        other_topic = await ah.broker.send(Message("u", b"3", key="a", delay_ms=9_000))
        return first, again, other_topic

    first, again, other_topic = ah.run(body)
    assert again.status is SendStatus.DUPLICATE
    assert (again.msg_id, again.deliver_at_ms) == (first.msg_id, first.deliver_at_ms)
    assert other_topic.status is SendStatus.OK
    assert len(ah.sync.broker.pending(topic=T)) == 1


def test_send_batch_answers_in_input_order_with_duplicates(async_harness: AsyncHarness) -> None:
    ah = async_harness
    now = ah.sync.now
    delays = [30_000, 10_000, 20_000]

    async def body() -> tuple[Any, Any]:
        batch = [Message(T, b"%d" % i, key=f"k{i}", delay_ms=d) for i, d in enumerate(delays)]
        results = await ah.broker.send_batch([*batch, Message(T, b"x", key="k0")])
        return results, await ah.broker.send_batch([])

    results, empty = ah.run(body)
    assert [r.status for r in results] == [SendStatus.OK] * 3 + [SendStatus.DUPLICATE]
    assert [r.deliver_at_ms for r in results[:3]] == [now + d for d in delays]
    assert results[3].msg_id == results[0].msg_id
    assert empty == []
    assert [v.msg_id for v in ah.sync.broker.pending()] == [results[i].msg_id for i in (1, 2, 0)]


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (Message(T, b"x" * (DEFAULT_MAX_BODY + 1)), MessageTooLarge),
        (Message(T, b"x", delay_ms=TOO_FAR_MS), InvalidDelay),
        ({"topic": T, "body": b"x"}, (InvalidArgument, InvalidMessage)),
    ],
    ids=["too-large", "too-far", "not-a-message"],
)
@pytest.mark.parametrize("call", ["send", "send_batch"])
def test_bad_sends_raise_the_sync_errors_and_store_nothing(
    async_harness: AsyncHarness, bad: Any, error: Any, call: str
) -> None:
    ah = async_harness

    async def body() -> None:
        if call == "send":
            await ah.broker.send(bad)
        else:
            await ah.broker.send_batch([Message(T, b"ok", key="k", delay_ms=1_000), bad])

    with pytest.raises(error):
        ah.run(body)
    assert nothing_stored(ah)
    # the same error as the sync adapter gives
    with pytest.raises(error):
        ah.sync.broker.send(bad) if call == "send" else ah.sync.broker.send_batch([bad])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"msg_id": "m", "key": "k", "topic": T}, {"key": "k"}, {"msg_id": "m", "topic": T}],
    ids=["nothing", "id-and-key", "key-without-topic", "id-with-topic"],
)
def test_abort_needs_exactly_an_id_or_a_key_and_topic(
    async_harness: AsyncHarness, kwargs: dict[str, str]
) -> None:
    ah = async_harness
    with pytest.raises(InvalidArgument):
        ah.run(lambda: ah.broker.abort(**kwargs))


@pytest.mark.parametrize("limit", [0, -1])
def test_pending_limit_below_one_is_invalid(async_harness: AsyncHarness, limit: int) -> None:
    ah = async_harness
    with pytest.raises(InvalidArgument):
        ah.run(lambda: ah.broker.pending(limit=limit))


# ---------------------------------------------------------------------- abort


def test_abort_by_id_and_by_key_cancel_pending_messages(async_harness: AsyncHarness) -> None:
    ah = async_harness

    async def body() -> list[Any]:
        a = await ah.broker.send(Message(T, b"a", delay_ms=5_000))
        b = await ah.broker.send(Message(T, b"b", key="order:1", delay_ms=5_000))
        by_id = await ah.broker.abort(a.msg_id)
        by_key = await ah.broker.abort(key="order:1", topic=T)
        twice = await ah.broker.abort(a.msg_id)
        return [a, b, by_id, by_key, twice]

    a, b, by_id, by_key, twice = ah.run(body)
    assert (by_id.status, by_id.msg_id) == (AbortStatus.ABORTED, a.msg_id)
    assert (by_key.status, by_key.msg_id) == (AbortStatus.ABORTED, b.msg_id)
    assert twice.status is AbortStatus.ABORTED
    assert ah.sync.broker.pending() == []
    assert ah.sync.broker.send(Message(T, b"", key="order:1", delay_ms=1)).status is SendStatus.OK


def test_abort_after_fire_is_already_delivered(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer = ah.sync.consumer("g", [T])
    sent = ah.sync.broker.send(Message(T, b"x", key="order:2", delay_ms=1_000))
    ah.sync.advance(1_000)
    assert pull_one(consumer).msg_id == sent.msg_id

    async def body() -> list[Any]:
        return [await ah.broker.abort(sent.msg_id), await ah.broker.abort(key="order:2", topic=T)]

    assert [r.status for r in ah.run(body)] == [AbortStatus.ALREADY_DELIVERED] * 2


@pytest.mark.parametrize("msg_id", ["no-such-id", "", "x" * 300])
def test_abort_of_unknown_ids_and_keys_is_not_found(
    async_harness: AsyncHarness, msg_id: str
) -> None:
    ah = async_harness

    async def body() -> list[Any]:
        return [await ah.broker.abort(msg_id), await ah.broker.abort(key="nope", topic=T)]

    assert [r.status for r in ah.run(body)] == [AbortStatus.NOT_FOUND] * 2


# ---------------------------------------------------------------------- query


def test_query_follows_the_states(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer = ah.sync.consumer("g", [T])
    pending = ah.sync.broker.send(Message(T, b"p", delay_ms=60_000))
    aborted = ah.sync.broker.send(Message(T, b"a", delay_ms=60_000))
    ah.sync.broker.abort(aborted.msg_id)
    inflight = ah.sync.broker.send(Message(T, b"i"))
    got = pull_one(consumer)
    assert got.msg_id == inflight.msg_id
    ready = ah.sync.broker.send(Message(T, b"r"))
    eventually(lambda: (v := ah.sync.broker.query(ready.msg_id)) and v.state is MessageState.READY)

    async def states() -> dict[str, MessageState | None]:
        views = {
            name: await ah.broker.query(r.msg_id)
            for name, r in [("pending", pending), ("aborted", aborted), ("inflight", inflight)]
        }
        views["ready"] = await ah.broker.query(ready.msg_id)
        views["unknown"] = await ah.broker.query("no-such-id")
        return {name: None if v is None else v.state for name, v in views.items()}

    assert ah.run(states) == {
        "pending": MessageState.PENDING,
        "aborted": MessageState.ABORTED,
        "inflight": MessageState.INFLIGHT,
        "ready": MessageState.READY,
        "unknown": None,
    }
    consumer.ack(got)
    eventually(lambda: ah.sync.broker.query(inflight.msg_id).state is MessageState.DONE)  # type: ignore[union-attr]


def test_query_view_matches_the_sync_one(async_harness: AsyncHarness) -> None:
    ah = async_harness
    sent = ah.sync.broker.send(Message(T, b"body", key="k", tags="tg", delay_ms=7_000))

    async def body() -> Any:
        return await ah.broker.query(sent.msg_id)

    assert ah.run(body) == ah.sync.broker.query(sent.msg_id)


# ---------------------------------------------------------------------- pending


def test_pending_is_in_due_order_filtered_and_bounded(async_harness: AsyncHarness) -> None:
    ah = async_harness
    now = ah.sync.now
    for d in (30_000, 10_000, 20_000, 40_000):
        ah.sync.broker.send(Message(T, b"%d" % d, delay_ms=d))
    ah.sync.broker.send(Message("u", b"other", delay_ms=15_000))

    async def body() -> list[list[int]]:
        calls = [
            ah.broker.pending(),
            ah.broker.pending(topic=T),
            ah.broker.pending(topic=T, start_ms=now + 20_000, end_ms=now + 40_000),
            ah.broker.pending(topic=T, limit=2),
        ]
        return [[v.deliver_at_ms - now for v in await c] for c in calls]

    assert ah.run(body) == [
        [10_000, 15_000, 20_000, 30_000, 40_000],
        [10_000, 20_000, 30_000, 40_000],
        [20_000, 30_000],  # start inclusive, end exclusive
        [10_000, 20_000],
    ]


# ---------------------------------------------------------------------- stats


def test_stats_count_what_the_async_calls_did(async_harness: AsyncHarness) -> None:
    ah = async_harness

    async def body() -> Any:
        await ah.broker.send_batch([Message(T, b"%d" % i, delay_ms=60_000) for i in range(5)])
        r = await ah.broker.send(Message(T, b"x", delay_ms=60_000))
        await ah.broker.abort(r.msg_id)
        return await ah.broker.stats()

    stats = ah.run(body)
    assert stats.pending == 5
    assert stats.topics.get(T, TopicStats()).pending == 5
    assert stats == ah.sync.broker.stats()


# ---------------------------------------------------------------------- concurrency


def test_many_coroutines_at_once_all_get_the_right_answers(async_harness: AsyncHarness) -> None:
    ah = async_harness
    now = ah.sync.now
    n = 300

    async def body() -> tuple[list[Any], list[Any], list[Any]]:
        sends = await asyncio.gather(
            *(
                ah.broker.send(Message(T, b"%d" % i, key=f"k{i}", delay_ms=1_000 + i))
                for i in range(n)
            )
        )
        dupes = await asyncio.gather(
            *(ah.broker.send(Message(T, b"again", key=f"k{i}", delay_ms=5)) for i in range(n))
        )
        aborts = await asyncio.gather(
            *(ah.broker.abort(key=f"k{i}", topic=T) for i in range(0, n, 2)),
            *(ah.broker.query(sends[i].msg_id) for i in range(1, n, 2)),
        )
        return sends, dupes, aborts

    sends, dupes, mixed = ah.run(body)
    assert [r.deliver_at_ms - now for r in sends] == [1_000 + i for i in range(n)]
    assert len({r.msg_id for r in sends}) == n
    assert all(d.status is SendStatus.DUPLICATE for d in dupes)
    assert [d.msg_id for d in dupes] == [s.msg_id for s in sends]
    aborts, views = mixed[: n // 2], mixed[n // 2 :]
    assert [a.msg_id for a in aborts] == [sends[i].msg_id for i in range(0, n, 2)]
    assert all(a.status is AbortStatus.ABORTED for a in aborts)
    assert [v.msg_id for v in views] == [sends[i].msg_id for i in range(1, n, 2)]
    assert {v.key for v in ah.sync.broker.pending(limit=n)} == {f"k{i}" for i in range(1, n, 2)}


# ---------------------------------------------------------------------- close


@pytest.mark.parametrize("call", ["send", "send_batch", "abort", "query", "pending", "stats"])
def test_calls_after_close_raise_broker_closed(async_harness: AsyncHarness, call: str) -> None:
    ah = async_harness
    calls = {
        "send": lambda: ah.broker.send(Message(T, b"x")),
        "send_batch": lambda: ah.broker.send_batch([Message(T, b"x")]),
        "abort": lambda: ah.broker.abort("some-id"),
        "query": lambda: ah.broker.query("some-id"),
        "pending": lambda: ah.broker.pending(),
        "stats": lambda: ah.broker.stats(),
    }

    async def body() -> None:
        await ah.broker.send(Message(T, b"before", delay_ms=60_000))
        await ah.broker.close()
        await ah.broker.close()  # twice is harmless
        await calls[call]()

    with pytest.raises(BrokerClosed):
        ah.run(body)
    assert len(ah.sync.broker.pending()) == 1  # nothing after the close arrived


def test_async_context_manager_closes(async_harness: AsyncHarness) -> None:
    ah = async_harness

    async def body() -> None:
        async with ah.broker as b:
            await b.send(Message(T, b"x", delay_ms=1_000))
        await ah.broker.query("x")

    with pytest.raises(BrokerClosed):
        ah.run(body)
