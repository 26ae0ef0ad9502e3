"""The dead-letter calls of the async contract: ``dead_letters``, ``requeue_dead``,
``purge_dead`` and ``count_pending`` awaited keep every sentence of
``broker_adapter/dead_letter_contract.py`` (the sync forms are checked sentence by
sentence in ``test_dead_letters_contract.py``; here each async call is checked
against the sync broker of the same harness, the witness).

Runs against every adapter of ``conftest.ADAPTERS`` through ``async_harness``.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_adapter.errors import ChronoqError, InvalidArgument, InvalidTopic
from broker_adapter.message import Message
from broker_adapter.results import MessageState
from tests.conformance.conftest import AsyncHarness
from tests.helpers import pull_one, pull_until

pytestmark = pytest.mark.timeout(120)

T = "t"
G = "g"


def _kill_many(ah: AsyncHarness, n: int) -> tuple[Any, list[str]]:
    """``n`` dead letters of group ``G`` (reasons ``r0``...), oldest first; the consumer."""
    consumer = ah.sync.consumer(G, [T])
    killed = []
    for i in range(n):
        sent = ah.sync.broker.send(Message(T, f"b{i}".encode(), key=f"k{i}"))
        got = pull_one(consumer)
        assert got.msg_id == sent.msg_id and consumer.dead_letter(got, f"r{i}")
        killed.append(sent.msg_id)
        ah.sync.advance(1)
    return consumer, killed


def test_dead_letters_page_through_in_death_order(async_harness: AsyncHarness) -> None:
    ah = async_harness
    _consumer, killed = _kill_many(ah, 5)

    async def body() -> list[Any]:
        views: list[Any] = []
        cursor = None
        while True:
            page = await ah.broker.dead_letters(G, cursor=cursor, limit=2, with_body=True)
            assert len(page.messages) <= 2
            views.extend(page.messages)
            cursor = page.cursor
            if cursor is None:
                return views

    views = ah.run(body)
    assert [v.msg_id for v in views] == killed
    assert [(v.state, v.topic, v.error, v.body) for v in views] == [
        (MessageState.DEAD, T, f"r{i}", f"b{i}".encode()) for i in range(5)
    ]


def test_requeue_and_purge_settle_them_for_that_group(async_harness: AsyncHarness) -> None:
    ah = async_harness
    consumer, killed = _kill_many(ah, 4)

    async def body() -> list[int]:
        return [
            await ah.broker.requeue_dead(G, [killed[0], "no-such-id"]),
            await ah.broker.purge_dead(G, [killed[1]]),
            await ah.broker.requeue_dead(G, limit=1),  # the oldest left: killed[2]
            await ah.broker.purge_dead(G),
            await ah.broker.requeue_dead(G),
        ]

    assert ah.run(body) == [1, 1, 1, 1, 0]
    got = pull_until(consumer, 2)
    assert sorted((m.msg_id, m.attempts) for m in got) == sorted([(killed[0], 1), (killed[2], 1)])
    for purged in (killed[1], killed[3]):
        view = ah.sync.broker.query(purged)
        assert view is not None and view.groups[G] is MessageState.DONE
    assert ah.sync.broker.dead_letters(G).messages == []


def test_count_pending_matches_the_sync_answer(async_harness: AsyncHarness) -> None:
    ah = async_harness
    now = ah.sync.now
    ah.sync.broker.send_batch([Message(T, b"x", delay_ms=d) for d in (10, 20, 1_500, 90_000)])
    edges = [now, now + 1_000, now + 60_000, now + 3_600_000]

    async def body() -> Any:
        return await ah.broker.count_pending(edges), await ah.broker.count_pending(edges, topic=T)

    counts, by_topic = ah.run(body)
    assert (counts.counts, counts.exact) == ([2, 1, 1], True)
    assert by_topic.counts == [2, 1, 1]  # one topic pending: exact everywhere
    assert by_topic == ah.sync.broker.count_pending(edges, topic=T)


def test_bad_input_raises_the_sync_errors_and_changes_nothing(async_harness: AsyncHarness) -> None:
    ah = async_harness
    _consumer, killed = _kill_many(ah, 1)
    loose: Any = ah.broker

    async def body() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        calls: list[Any] = [
            lambda: loose.dead_letters("bad name"),
            lambda: loose.dead_letters(G, limit=0),
            lambda: loose.dead_letters(G, cursor="junk"),
            lambda: loose.requeue_dead(G, killed[0]),
            lambda: loose.purge_dead(G, [killed[0], 3]),
            lambda: loose.purge_dead(G, limit=0),
            lambda: loose.count_pending([5, 4]),
            lambda: loose.count_pending([0, 1], topic="%RETRY%g"),
        ]
        for call in calls:
            try:
                await call()
            except ChronoqError as e:
                raised.append(type(e))
        return raised

    raised = ah.run(body)
    assert raised == [InvalidTopic] + [InvalidArgument] * 6 + [InvalidTopic]
    assert [v.msg_id for v in ah.sync.broker.dead_letters(G).messages] == killed
