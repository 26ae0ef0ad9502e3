"""Dead letters and pending counts, sentence by sentence (``dead_letters``,
``requeue_dead``, ``purge_dead`` and ``count_pending`` in
``broker_adapter/dead_letter_contract.py``, which ``BrokerAdapter`` inherits).

Runs against every adapter in ``conftest.ADAPTERS`` through the ``harness``
fixture. Messages die in three ways here: ``dead_letter()``, a nack on the last
attempt (``max_attempts=2``, nacked with ``delay_ms=0`` so no backoff is waited
for), and both in one group while another group on the topic acks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from broker_adapter.base import BrokerAdapter, Consumer
from broker_adapter.errors import BrokerClosed, InvalidArgument, InvalidTopic
from broker_adapter.message import Message
from broker_adapter.results import MAX_COUNT_EDGES, MessageState, MessageView
from tests.conformance.conftest import Harness
from tests.helpers import assert_nothing, eventually, pull_one, pull_until

pytestmark = pytest.mark.timeout(120)

T = "t"
G = "g"


def _kill(consumer: Consumer, broker: BrokerAdapter, reason: str, **message: object) -> str:
    """Send a message due now, pull it in ``consumer`` and dead-letter it; its id."""
    sent = broker.send(Message(T, message.pop("body", b"x"), **message))  # type: ignore[arg-type]
    got = pull_one(consumer)
    assert got.msg_id == sent.msg_id
    assert consumer.dead_letter(got, reason)
    return sent.msg_id


def _all_dead(broker: BrokerAdapter, group: str, limit: int = 100) -> list[MessageView]:
    """Every dead letter of ``group``, following cursors."""
    out: list[MessageView] = []
    cursor = None
    for _ in range(1000):
        page = broker.dead_letters(group, cursor=cursor, limit=limit)
        assert len(page.messages) <= limit
        out.extend(page.messages)
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("dead_letters never gave a last page")


def test_nacked_past_max_attempts_and_dead_lettered_both_listed(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T], max_attempts=2)
    sent = broker.send(Message(T, b"tired", key="order:1", tags="close"))
    first = pull_one(consumer)
    assert consumer.nack(first, delay_ms=0, reason="timeout 1")
    second = pull_one(consumer)
    assert (second.msg_id, second.attempts) == (sent.msg_id, 2)
    assert consumer.nack(second, delay_ms=0, reason="timeout 2")  # the last attempt
    harness.advance(10)
    killed = _kill(consumer, broker, "unknown job close_ordr", body=b"bad", tags="close_ordr")

    page = broker.dead_letters(G)
    assert page.cursor is None
    assert [v.msg_id for v in page.messages] == [sent.msg_id, killed]  # oldest death first
    tired, bad = page.messages
    assert (tired.state, tired.topic, tired.error, tired.attempts) == (
        MessageState.DEAD,
        T,
        "timeout 2",
        2,
    )
    assert (tired.key, tired.tags, tired.body, tired.body_size) == ("order:1", "close", None, 5)
    assert dict(tired.groups) == {G: MessageState.DEAD}
    assert (bad.state, bad.topic, bad.error, bad.attempts) == (
        MessageState.DEAD,
        T,
        "unknown job close_ordr",
        1,
    )
    assert bad.deliver_at_ms >= tired.deliver_at_ms  # when each died
    with_body = broker.dead_letters(G, with_body=True).messages
    assert [v.body for v in with_body] == [b"tired", b"bad"]
    assert_nothing(consumer, wait_ms=100)  # listing consumed nothing


def test_pages_return_each_dead_letter_once_in_death_order(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T])
    killed = []
    for i in range(7):
        killed.append(_kill(consumer, broker, f"r{i}"))
        harness.advance(1)
    listed = _all_dead(broker, G, limit=3)
    assert [v.msg_id for v in listed] == killed
    assert [v.error for v in listed] == [f"r{i}" for i in range(7)]


def test_unknown_group_has_no_dead_letters(harness: Harness) -> None:
    page = harness.broker.dead_letters("nobody")
    assert (page.messages, page.cursor) == ([], None)
    assert harness.broker.requeue_dead("nobody") == 0
    assert harness.broker.purge_dead("nobody", ["x"]) == 0


def test_requeue_runs_it_again_in_that_group_only(harness: Harness) -> None:
    broker = harness.broker
    mine = harness.consumer(G, [T])
    other = harness.consumer("h", [T])
    killed = _kill(mine, broker, "boom", key="order:9")
    assert other.ack(pull_one(other))
    pending = broker.send(Message(T, b"later", delay_ms=60_000)).msg_id

    assert broker.requeue_dead(G, [killed, pending, "no-such-id"]) == 1
    assert _all_dead(broker, G) == []
    again = pull_one(mine)
    assert (again.msg_id, again.attempts, again.key, again.topic) == (killed, 1, "order:9", T)
    assert mine.ack(again)
    view = broker.query(killed)
    assert view is not None and view.groups[G] is MessageState.DONE
    assert view.groups["h"] is MessageState.DONE
    assert_nothing(other, wait_ms=100)  # the other group is unaffected
    assert broker.requeue_dead(G, [killed]) == 0  # no longer a dead letter


def test_requeued_message_that_fails_again_is_a_dead_letter_again(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T])
    killed = _kill(consumer, broker, "first")
    assert broker.requeue_dead(G, [killed]) == 1
    got = pull_one(consumer)
    assert consumer.dead_letter(got, "second")
    listed = _all_dead(broker, G)
    assert [(v.msg_id, v.error, v.attempts) for v in listed] == [(killed, "second", 1)]


def test_requeue_all_is_bounded_per_call_until_zero(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T])
    killed = [_kill(consumer, broker, "x") for _ in range(5)]
    assert broker.stats().groups[G].dead == 5
    answers = [broker.requeue_dead(G, limit=2) for _ in range(4)]
    assert answers == [2, 2, 1, 0]
    assert broker.stats().groups[G].dead == 0
    got = pull_until(consumer, 5)
    assert sorted(m.msg_id for m in got) == sorted(killed)
    assert {m.attempts for m in got} == {1}


def test_purge_drops_them_and_the_group_state_is_done(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T])
    killed = [_kill(consumer, broker, f"r{i}") for i in range(3)]
    assert broker.purge_dead(G, [killed[1]]) == 1
    assert broker.stats().groups[G].dead == 2
    assert [v.msg_id for v in _all_dead(broker, G)] == [killed[0], killed[2]]
    view = broker.query(killed[1])
    assert view is not None and view.groups[G] is MessageState.DONE
    assert broker.purge_dead(G, [killed[1]]) == 0
    assert broker.requeue_dead(G, [killed[1]]) == 0  # purged is not dead
    assert broker.purge_dead(G) == 2
    assert broker.purge_dead(G) == 0
    assert _all_dead(broker, G) == []
    assert_nothing(consumer, wait_ms=100)


def test_bad_input_raises_typed_errors_and_changes_nothing(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T])
    killed = _kill(consumer, broker, "x")
    now = harness.now
    loose: Any = broker  # calls with wrong types on purpose
    calls: list[tuple[type[Exception], Callable[[], object]]] = [
        (InvalidTopic, lambda: broker.dead_letters("bad name")),
        (InvalidTopic, lambda: broker.dead_letters("%DLQ%g")),
        (InvalidArgument, lambda: broker.dead_letters(G, limit=0)),
        (InvalidArgument, lambda: broker.dead_letters(G, cursor="junk")),
        (InvalidArgument, lambda: broker.dead_letters(G, cursor="")),
        (InvalidTopic, lambda: broker.requeue_dead("bad name", [killed])),
        (InvalidArgument, lambda: loose.requeue_dead(G, killed)),  # a str, not a list
        (InvalidArgument, lambda: loose.requeue_dead(G, [killed, 7])),
        (InvalidArgument, lambda: broker.requeue_dead(G, limit=0)),
        (InvalidArgument, lambda: broker.requeue_dead(G, [killed, "b"], limit=1)),
        (InvalidArgument, lambda: loose.purge_dead(G, killed)),
        (InvalidArgument, lambda: loose.purge_dead(G, [None])),
        (InvalidArgument, lambda: broker.purge_dead(G, limit=-1)),
        (InvalidTopic, lambda: broker.purge_dead("", [killed])),
        (InvalidArgument, lambda: broker.count_pending([])),
        (InvalidArgument, lambda: broker.count_pending([now])),
        (InvalidArgument, lambda: broker.count_pending([now + 5, now])),
        (InvalidArgument, lambda: broker.count_pending([now, now])),
        (InvalidArgument, lambda: broker.count_pending([-1, now])),
        (InvalidArgument, lambda: broker.count_pending([now, 1 << 63])),
        (InvalidArgument, lambda: broker.count_pending([now, True])),
        (InvalidArgument, lambda: loose.count_pending([now, 1.5])),
        (InvalidArgument, lambda: loose.count_pending(range(MAX_COUNT_EDGES + 1))),
        (InvalidArgument, lambda: broker.count_pending(list(range(MAX_COUNT_EDGES + 1)))),
        (InvalidTopic, lambda: broker.count_pending([now, now + 1], topic="bad name")),
    ]
    for error, call in calls:
        with pytest.raises(error):
            call()
    assert [v.msg_id for v in _all_dead(broker, G)] == [killed]
    assert broker.count_pending(list(range(MAX_COUNT_EDGES))).counts == [0] * (MAX_COUNT_EDGES - 1)


def test_count_pending_equals_a_brute_force_count(harness: Harness) -> None:
    broker = harness.broker
    consumer = harness.consumer(G, [T])
    now = harness.now
    delays = [0, 0, 1, 500, 999, 1_000, 59_999, 60_000, 3_599_999, 3_600_000, 86_400_000]
    delays += [17 * i * i + 3 for i in range(120)]
    messages = [Message(T if i % 3 else "u", b"x", delay_ms=d) for i, d in enumerate(delays)]
    results = broker.send_batch(messages)
    aborted = [r for r, d in zip(results, delays, strict=True) if d > 2_000][:10]
    for r in aborted:
        assert broker.abort(r.msg_id).status.name == "ABORTED"
    gone = {r.msg_id for r in aborted}
    fired_now = [m for m, d in zip(messages, delays, strict=True) if d == 0 and m.topic == T]
    got = pull_until(consumer, len(fired_now))  # due now: fired (to T) or not for u
    retry_at = now + 30_000
    for m in got:
        assert consumer.nack(m, delay_ms=30_000)  # a retry waiting on the wheel
    pending = [
        (r.deliver_at_ms, m.topic)
        for r, m in zip(results, messages, strict=True)
        if r.msg_id not in gone and r.deliver_at_ms > now
    ]
    pending += [(retry_at, T)] * len(got)
    edges = [now, now + 1, now + 1_000, now + 60_000, now + 3_600_000, now + 86_400_001]

    def brute(topic: str | None) -> list[int]:
        return [
            sum(1 for due, t in pending if lo <= due < hi and topic in (None, t))
            for lo, hi in itertools.pairwise(edges)
        ]

    counts = broker.count_pending(edges)
    assert counts.exact
    assert counts.counts == brute(None)
    assert counts.total == sum(brute(None))
    by_topic = broker.count_pending(edges, topic=T)
    if by_topic.exact:
        assert by_topic.counts == brute(T)
    else:  # an estimate (documented per adapter): at most the counts of every topic
        assert all(0 <= a <= b for a, b in zip(by_topic.counts, counts.counts, strict=True))
    assert broker.count_pending(edges, topic="never-sent").counts == [0] * 5
    harness.advance(1_000)
    eventually(lambda: broker.count_pending(edges).counts[:2] == [0, 0], what="fired")


def test_dead_letters_and_requeue_survive_a_reopen(harness: Harness) -> None:
    if harness.adapter == "memory":
        pytest.skip("memory:// is not durable: a restart loses its data by design")
    consumer = harness.consumer(G, [T])
    killed = [_kill(consumer, harness.broker, f"r{i}") for i in range(3)]
    assert harness.broker.requeue_dead(G, [killed[0]]) == 1
    assert harness.broker.purge_dead(G, [killed[1]]) == 1
    broker = harness.reopen()
    listed = _all_dead(broker, G)
    assert [(v.msg_id, v.error) for v in listed] == [(killed[2], "r2")]
    assert broker.stats().groups[G].dead == 1
    consumer = harness.consumer(G, [T])
    got = pull_one(consumer)
    assert (got.msg_id, got.attempts) == (killed[0], 1)
    assert consumer.ack(got)
    assert broker.requeue_dead(G) == 1
    broker = harness.reopen()
    consumer = harness.consumer(G, [T])
    got = pull_one(consumer)
    assert (got.msg_id, got.attempts) == (killed[2], 1)
    assert _all_dead(broker, G) == []
    view = broker.query(killed[1])
    assert view is not None and view.groups[G] is MessageState.DONE


def test_calls_after_close_raise_broker_closed(harness: Harness) -> None:
    harness.broker.close()
    for call in (
        lambda: harness.broker.dead_letters(G),
        lambda: harness.broker.requeue_dead(G),
        lambda: harness.broker.purge_dead(G),
        lambda: harness.broker.count_pending([0, 1]),
    ):
        with pytest.raises(BrokerClosed):
            call()
