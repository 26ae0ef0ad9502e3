"""The runtime calls of the async contract: ``reschedule``, ``abort_prefix`` and
``find_pending`` awaited keep every sentence of ``broker_adapter/base.py`` (the sync
forms are checked sentence by sentence in ``test_runtime_contract.py``; here each
async call is checked against the sync broker of the same harness, the witness).

Runs against every adapter of ``conftest.ADAPTERS`` through ``async_harness``.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_adapter.base import RESCHEDULE_PAST_TOLERANCE_MS
from broker_adapter.errors import InvalidArgument, InvalidDelay, UnknownTopic
from broker_adapter.message import Message
from broker_adapter.results import MessageState, RescheduleStatus
from tests.conformance.conftest import AsyncHarness
from tests.helpers import pull_one

pytestmark = pytest.mark.timeout(120)

T = "t"


def test_reschedule_moves_a_pending_message_and_its_body(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer = ah.sync.consumer("g", [T])
    sent = ah.sync.broker.send(Message(T, b"old", key="order:1:close", delay_ms=5_000))
    new_due = ah.sync.now + 20_000

    async def body() -> list[Any]:
        by_key = await ah.broker.reschedule(
            key="order:1:close", topic=T, deliver_at_ms=new_due, body=b"new"
        )
        unknown = await ah.broker.reschedule("no-such-id", delay_ms=1)
        return [by_key, unknown]

    by_key, unknown = ah.run(body)
    assert (by_key.status, by_key.msg_id, by_key.deliver_at_ms) == (
        RescheduleStatus.RESCHEDULED,
        sent.msg_id,
        new_due,
    )
    assert unknown.status is RescheduleStatus.NOT_FOUND
    view = ah.sync.broker.query(sent.msg_id)
    assert view is not None and view.deliver_at_ms == new_due
    assert view.state is MessageState.PENDING
    ah.sync.advance(5_000)
    assert consumer.pull(wait_ms=0) == []  # not at the old time
    ah.sync.advance(15_000)
    got = pull_one(consumer)
    assert (got.msg_id, got.body, got.key) == (sent.msg_id, b"new", "order:1:close")


def test_reschedule_after_fire_is_already_delivered(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer = ah.sync.consumer("g", [T])
    sent = ah.sync.broker.send(Message(T, b"x", delay_ms=1_000))
    ah.sync.advance(1_000)
    assert pull_one(consumer).msg_id == sent.msg_id

    result = ah.run(lambda: ah.broker.reschedule(sent.msg_id, delay_ms=0))
    assert (result.status, result.msg_id) == (RescheduleStatus.ALREADY_DELIVERED, sent.msg_id)


def test_bad_reschedules_raise_the_sync_errors_and_change_nothing(
    async_harness: AsyncHarness,
) -> None:
    ah = async_harness
    sent = ah.sync.broker.send(Message(T, b"x", key="k", delay_ms=5_000))
    too_old = ah.sync.now - RESCHEDULE_PAST_TOLERANCE_MS - 1_000

    async def body() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        calls: list[Any] = [
            lambda: ah.broker.reschedule(sent.msg_id),  # no timing
            lambda: ah.broker.reschedule(sent.msg_id, delay_ms=1, deliver_at_ms=1),
            lambda: ah.broker.reschedule(key="k", delay_ms=1),  # key without topic
            lambda: ah.broker.reschedule(sent.msg_id, delay_ms=-1),
            lambda: ah.broker.reschedule(sent.msg_id, deliver_at_ms=too_old),
            lambda: ah.broker.reschedule(sent.msg_id, delay_ms=1, body="text"),
        ]
        for call in calls:
            try:
                await call()
            except (InvalidArgument, InvalidDelay) as e:
                raised.append(type(e))
        return raised

    raised = ah.run(body)
    assert len(raised) == 6
    view = ah.sync.broker.query(sent.msg_id)
    assert view is not None and view.deliver_at_ms == sent.deliver_at_ms


def test_abort_prefix_aborts_the_pending_and_names_the_fired(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer = ah.sync.consumer("g", [T])
    ah.sync.broker.send(Message(T, b"r", key="order:42:remind", delay_ms=1_000))
    ah.sync.broker.send(Message(T, b"c", key="order:42:close", delay_ms=60_000))
    ah.sync.broker.send(Message(T, b"o", key="order:43:close", delay_ms=60_000))
    ah.sync.advance(1_000)
    assert pull_one(consumer).key == "order:42:remind"

    async def body() -> Any:
        result = await ah.broker.abort_prefix(T, "order:42:")
        again = await ah.broker.abort_prefix(T, "order:42:")
        return result, again

    result, again = ah.run(body)
    assert result.aborted == 1
    assert result.already_delivered == ("order:42:remind",)
    assert result.already_delivered_count == 1
    assert again.aborted == 0
    assert [v.key for v in ah.sync.broker.pending()] == ["order:43:close"]


def test_abort_prefix_refuses_bad_input(async_harness: AsyncHarness) -> None:
    ah = async_harness
    ah.sync.broker.send(Message(T, b"x", key="a:1", delay_ms=5_000))

    async def body() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        for topic, prefix in ((T, ""), ("never-used-topic", "a:")):
            try:
                await ah.broker.abort_prefix(topic, prefix)
            except InvalidArgument as e:
                raised.append(type(e))
        return raised

    assert ah.run(body) == [InvalidArgument, UnknownTopic]
    assert len(ah.sync.broker.pending()) == 1


def test_find_pending_pages_through_everything_in_due_order(async_harness: AsyncHarness) -> None:
    ah = async_harness
    now = ah.sync.now
    msgs = [
        Message(
            T,
            f"b{i}".encode(),
            key=f"user:{i % 3}:{i}",
            tags=f"job{i % 2}",
            deliver_at_ms=now + 1_000 + (i * 7919) % 250,
        )
        for i in range(250)
    ]
    ah.sync.broker.send_batch(msgs)

    async def all_pages(**filters: Any) -> list[Any]:
        views: list[Any] = []
        cursor = None
        while True:
            page = await ah.broker.find_pending(limit=40, cursor=cursor, **filters)
            assert len(page.messages) <= 40
            views.extend(page.messages)
            cursor = page.cursor
            if cursor is None:
                return views

    async def body() -> list[list[Any]]:
        return [
            await all_pages(topic=T),
            await all_pages(topic=T, key_prefix="user:1:", with_body=True),
            await all_pages(tag="job0"),
        ]

    everything, prefixed, tagged = ah.run(body)
    assert len(everything) == 250 and len({v.msg_id for v in everything}) == 250
    dues = [v.deliver_at_ms for v in everything]
    assert dues == sorted(dues)
    assert {v.key for v in prefixed} == {m.key for m in msgs if m.key.startswith("user:1:")}
    assert all(
        v.body is not None and v.body == b"b" + v.key.split(":")[2].encode() for v in prefixed
    )
    assert {v.msg_id for v in tagged} == {v.msg_id for v in everything if v.tags == "job0"}
    assert all(v.body is None for v in everything)


def test_find_pending_refuses_bad_input(async_harness: AsyncHarness) -> None:
    ah = async_harness
    ah.sync.broker.send(Message(T, b"x", delay_ms=5_000))

    async def body() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        calls: list[Any] = [
            lambda: ah.broker.find_pending(key_prefix="a"),  # prefix without topic
            lambda: ah.broker.find_pending(T, key_prefix=""),
            lambda: ah.broker.find_pending(T, limit=0),
            lambda: ah.broker.find_pending(T, cursor="not a cursor"),
            lambda: ah.broker.find_pending("never-used-topic"),
        ]
        for call in calls:
            try:
                await call()
            except InvalidArgument as e:
                raised.append(type(e))
        return raised

    raised = ah.run(body)
    assert len(raised) == 5 and raised[-1] is UnknownTopic
