"""The runtime calls of the ``BrokerAdapter`` contract (``broker_adapter/base.py``):
``reschedule``, ``abort_prefix``, ``find_pending``, ``acquire_rate``,
``acquire_slot`` and ``release_slot``, one test per sentence, plus a stateful test
against a model and a test racing reschedules against the fire time.

Runs against every adapter in ``conftest.ADAPTERS`` through the ``harness``
fixture, using only the contract and the harness. Time is a ``ManualClock``.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from broker_adapter.base import RESCHEDULE_PAST_TOLERANCE_MS
from broker_adapter.errors import (
    BrokerClosed,
    InvalidArgument,
    InvalidDelay,
    InvalidTopic,
    MessageTooLarge,
    UnknownTopic,
)
from broker_adapter.message import Message
from broker_adapter.results import (
    MAX_REPORTED_KEYS,
    AbortResult,
    AbortStatus,
    MessageState,
    MessageView,
    RescheduleResult,
    RescheduleStatus,
    SendStatus,
    TopicStats,
)
from tests.conformance.conftest import Harness
from tests.helpers import assert_nothing, eventually, pull_one, pull_until

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024
DEFAULT_MAX_BODY = 4 * MiB
YEAR_MS = 365 * 24 * 3600 * 1000
T = "t"
_RESCHEDULED = RescheduleStatus.RESCHEDULED
_DELIVERED = RescheduleStatus.ALREADY_DELIVERED
_NOT_FOUND = RescheduleStatus.NOT_FOUND


def state_of(h: Harness, msg_id: str) -> MessageState | None:
    view = h.broker.query(msg_id)
    return None if view is None else view.state


def wait_fired(h: Harness, *msg_ids: str) -> None:
    """Wait until each message has fired (its state is no longer PENDING)."""
    for msg_id in msg_ids:
        eventually(
            lambda m=msg_id: state_of(h, m) not in (MessageState.PENDING, None),  # type: ignore[misc]
            what=f"{msg_id} fired",
        )


def due_of(h: Harness, msg_id: str) -> int | None:
    view = h.broker.query(msg_id)
    return None if view is None else view.deliver_at_ms


def all_pages(h: Harness, limit: int = 100, **filters: Any) -> list[MessageView]:
    """Every page of ``find_pending(**filters)`` until the cursor is ``None``."""
    views: list[MessageView] = []
    cursor = None
    for _ in range(100_000):
        page = h.broker.find_pending(limit=limit, cursor=cursor, **filters)
        assert len(page.messages) <= limit
        views.extend(page.messages)
        cursor = page.cursor
        if cursor is None:
            return views
    raise AssertionError("find_pending never ended")


def topic_stats(h: Harness, topic: str = T) -> TopicStats:
    return h.broker.stats().topics.get(topic, TopicStats())


# =========================================================================== reschedule


def test_reschedule_by_id_moves_a_pending_message_to_the_new_time(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    born = harness.now
    sent = harness.broker.send(Message(T, b"x", key="k", tags="job", delay_ms=5_000))
    result = harness.broker.reschedule(sent.msg_id, delay_ms=20_000)
    assert result == RescheduleResult(_RESCHEDULED, sent.msg_id, born + 20_000)
    harness.advance(5_000)
    assert_nothing(c)  # not at the old time
    harness.advance(14_999)
    assert_nothing(c)
    harness.advance(1)
    got = pull_one(c)
    assert (got.msg_id, got.deliver_at_ms) == (sent.msg_id, born + 20_000)


def test_reschedule_by_key_and_topic_moves_the_message(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", key="order:42:close", delay_ms=30 * 60_000))
    at = harness.now + 50 * 60_000
    result = harness.broker.reschedule(key="order:42:close", topic=T, deliver_at_ms=at)
    assert result == RescheduleResult(_RESCHEDULED, sent.msg_id, at)
    harness.advance(30 * 60_000)
    assert_nothing(c)
    harness.advance(20 * 60_000)
    assert pull_one(c).msg_id == sent.msg_id


def test_reschedule_earlier_delivers_earlier(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", delay_ms=60_000))
    assert harness.broker.reschedule(sent.msg_id, delay_ms=1_000).status is _RESCHEDULED
    harness.advance(1_000)
    got = pull_one(c)
    assert got.msg_id == sent.msg_id
    c.ack(got)
    harness.advance(60_000)
    assert_nothing(c)  # once, not again at the old time


def test_reschedule_keeps_id_key_tags_properties_and_attempts(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    born = harness.now
    msg = Message(T, b"body", key="k", tags="close", properties={"a": "1"}, delay_ms=5_000)
    sent = harness.broker.send(msg)
    harness.broker.reschedule(sent.msg_id, delay_ms=7_000)
    harness.advance(7_000)
    got = pull_one(c)
    assert (got.msg_id, got.topic, got.body, got.key, got.tags) == (
        sent.msg_id,
        T,
        b"body",
        "k",
        "close",
    )
    assert dict(got.properties) == {"a": "1"}
    assert (got.born_ms, got.attempts) == (born, 1)


def test_reschedule_with_a_body_delivers_the_new_body(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"old", key="k", delay_ms=5_000))
    harness.broker.reschedule(key="k", topic=T, delay_ms=6_000, body=b"new body")
    view = harness.broker.query(sent.msg_id)
    assert view is not None and view.body_size == len(b"new body")
    harness.advance(6_000)
    assert pull_one(c).body == b"new body"


def test_reschedule_with_delay_zero_runs_it_now(harness: Harness) -> None:
    """Run now is a reschedule to now."""
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", delay_ms=YEAR_MS))
    result = harness.broker.reschedule(sent.msg_id, delay_ms=0)
    assert result == RescheduleResult(_RESCHEDULED, sent.msg_id, harness.now)
    assert pull_one(c).msg_id == sent.msg_id


def test_reschedule_to_a_time_a_little_in_the_past_means_now(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", delay_ms=60_000))
    at = harness.now - RESCHEDULE_PAST_TOLERANCE_MS + 1_000
    result = harness.broker.reschedule(sent.msg_id, deliver_at_ms=at)
    assert result == RescheduleResult(_RESCHEDULED, sent.msg_id, harness.now)
    assert pull_one(c).msg_id == sent.msg_id


@pytest.mark.parametrize("stage", ["ready", "inflight", "done"])
def test_reschedule_after_fire_is_already_delivered_and_changes_nothing(
    harness: Harness, stage: str
) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", key="k", delay_ms=1_000))
    harness.advance(1_000)
    wait_fired(harness, sent.msg_id)
    if stage != "ready":
        m = pull_one(c)
        if stage == "done":
            assert c.ack(m)
    for result in (
        harness.broker.reschedule(sent.msg_id, delay_ms=10_000, body=b"late"),
        harness.broker.reschedule(key="k", topic=T, delay_ms=10_000),
    ):
        assert result == RescheduleResult(_DELIVERED, sent.msg_id, sent.deliver_at_ms)
    if stage == "ready":
        got = pull_one(c)
        assert (got.body, got.deliver_at_ms) == (b"x", sent.deliver_at_ms)
        c.ack(got)
    harness.advance(10_000)
    assert_nothing(c)


def test_reschedule_of_a_message_waiting_for_a_retry_is_already_delivered(
    harness: Harness,
) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", delay_ms=1_000))
    harness.advance(1_000)
    assert c.nack(pull_one(c), delay_ms=60_000)
    result = harness.broker.reschedule(sent.msg_id, delay_ms=0)
    assert (result.status, result.msg_id) == (_DELIVERED, sent.msg_id)
    assert_nothing(c)  # the retry is not run now
    harness.advance(60_000)
    assert pull_one(c).attempts == 2


@pytest.mark.parametrize("msg_id", ["no-such-id", "x" * 2_000, "\x00\x01\xff", "0", "ü"])
def test_reschedule_of_an_unknown_or_malformed_id_is_not_found(
    harness: Harness, msg_id: str
) -> None:
    harness.broker.send(Message(T, b"x", delay_ms=10_000))  # the store is not empty
    result = harness.broker.reschedule(msg_id, delay_ms=1)
    assert result == RescheduleResult(_NOT_FOUND, msg_id, None)


def test_reschedule_of_an_unknown_key_is_not_found(harness: Harness) -> None:
    harness.broker.send(Message("other", b"x", key="k", delay_ms=10_000))
    for key, topic in (("nope", T), ("k", T), ("k", "never-used-topic")):
        result = harness.broker.reschedule(key=key, topic=topic, delay_ms=1)
        assert (result.status, result.deliver_at_ms) == (_NOT_FOUND, None)
    assert harness.broker.pending()[0].deliver_at_ms == harness.now + 10_000


def test_reschedule_of_an_aborted_message_is_not_found(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", key="k", delay_ms=5_000))
    harness.broker.abort(sent.msg_id)
    assert harness.broker.reschedule(sent.msg_id, delay_ms=0).status is _NOT_FOUND
    assert harness.broker.reschedule(key="k", topic=T, delay_ms=0).status is _NOT_FOUND
    assert state_of(harness, sent.msg_id) is MessageState.ABORTED
    harness.advance(5_000)
    assert_nothing(c)


def test_an_aborted_rescheduled_message_is_never_delivered(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", key="k", delay_ms=5_000))
    harness.broker.reschedule(sent.msg_id, delay_ms=8_000)
    assert harness.broker.abort(key="k", topic=T) == AbortResult(AbortStatus.ABORTED, sent.msg_id)
    assert harness.broker.abort(sent.msg_id) == AbortResult(AbortStatus.ABORTED, sent.msg_id)
    assert state_of(harness, sent.msg_id) is MessageState.ABORTED
    harness.advance(8_000)
    assert_nothing(c)


def test_reschedule_by_key_names_the_last_message_sent_with_it(harness: Harness) -> None:
    old = harness.broker.send(Message(T, b"old", key="k", delay_ms=1_000))
    harness.advance(1_000)
    wait_fired(harness, old.msg_id)
    new = harness.broker.send(Message(T, b"new", key="k", delay_ms=1_000))
    assert new.status is SendStatus.OK
    result = harness.broker.reschedule(key="k", topic=T, delay_ms=9_000)
    assert result == RescheduleResult(_RESCHEDULED, new.msg_id, harness.now + 9_000)
    assert due_of(harness, old.msg_id) == old.deliver_at_ms


def test_a_rescheduled_key_still_makes_resending_its_occurrence_a_duplicate(
    harness: Harness,
) -> None:
    """The key keeps the due time its first send asked for (a cron occurrence
    ``cron:<name>:<fire_ms>`` moved by hand is not fired twice)."""
    c = harness.consumer("g", [T])
    asked = harness.now + 5_000
    sent = harness.broker.send(Message(T, b"x", key="cron:n:1", deliver_at_ms=asked))
    moved = harness.now + 8_000
    harness.broker.reschedule(key="cron:n:1", topic=T, deliver_at_ms=moved)
    again = harness.broker.send(Message(T, b"x", key="cron:n:1", deliver_at_ms=asked))
    assert (again.status, again.msg_id, again.deliver_at_ms) == (
        SendStatus.DUPLICATE,
        sent.msg_id,
        moved,
    )
    harness.advance(8_000)
    c.ack(pull_one(c))
    after = harness.broker.send(Message(T, b"x", key="cron:n:1", deliver_at_ms=asked))
    assert (after.status, after.msg_id) == (SendStatus.DUPLICATE, sent.msg_id)
    harness.advance(60_000)
    assert_nothing(c)
    other = harness.broker.send(Message(T, b"x", key="cron:n:1", deliver_at_ms=moved))
    assert other.status is SendStatus.OK  # another occurrence: stored


def test_query_and_pending_show_the_new_due_time(harness: Harness) -> None:
    a = harness.broker.send(Message(T, b"a", delay_ms=1_000))
    b = harness.broker.send(Message(T, b"b", delay_ms=2_000))
    harness.broker.reschedule(a.msg_id, delay_ms=3_000)
    view = harness.broker.query(a.msg_id)
    assert view is not None
    assert (view.state, view.deliver_at_ms) == (MessageState.PENDING, harness.now + 3_000)
    assert [v.msg_id for v in harness.broker.pending()] == [b.msg_id, a.msg_id]
    assert [v.msg_id for v in all_pages(harness)] == [b.msg_id, a.msg_id]


def test_pending_and_stats_stay_right_after_reschedules(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    ids = [harness.broker.send(Message(T, b"%d" % i, delay_ms=10_000)).msg_id for i in range(10)]
    for n, msg_id in enumerate(ids):
        harness.broker.reschedule(msg_id, delay_ms=20_000 + n)
    assert topic_stats(harness).pending == 10
    assert len(harness.broker.pending()) == 10
    harness.broker.reschedule(ids[0], delay_ms=0)
    got = pull_one(c)
    assert got.msg_id == ids[0]
    stats = topic_stats(harness)
    assert (stats.pending, stats.fired_total) == (9, 1)
    harness.advance(30_000)
    assert len(pull_until(c, 9)) == 9
    stats = topic_stats(harness)
    assert (stats.pending, stats.fired_total) == (0, 10)


def test_reschedule_is_durable_across_reopen(harness: Harness) -> None:
    sent = harness.broker.send(Message(T, b"old", key="k", delay_ms=5_000))
    harness.broker.reschedule(sent.msg_id, delay_ms=9_000, body=b"new")
    harness.reopen()
    assert due_of(harness, sent.msg_id) == harness.now + 9_000
    c = harness.consumer("g", [T])
    harness.advance(5_000)
    assert_nothing(c)
    harness.advance(4_000)
    got = pull_one(c)
    assert (got.msg_id, got.body) == (sent.msg_id, b"new")
    again = harness.broker.reschedule(key="k", topic=T, delay_ms=1)
    assert again.status is _DELIVERED


# -- bad input: a typed error, and nothing changes


def _unchanged(h: Harness, msg_id: str, due: int, body: bytes) -> None:
    view = h.broker.query(msg_id)
    assert view is not None
    assert (view.state, view.deliver_at_ms, view.body_size) == (
        MessageState.PENDING,
        due,
        len(body),
    )
    found = h.broker.find_pending(T, with_body=True).messages
    assert [(v.msg_id, v.body) for v in found] == [(msg_id, body)]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"delay_ms": 1}),
        (("ID",), {"key": "k", "topic": T, "delay_ms": 1}),
        ((), {"key": "k", "delay_ms": 1}),
        ((), {"topic": T, "delay_ms": 1}),
        (("ID",), {}),
        (("ID",), {"delay_ms": 1, "deliver_at_ms": 1}),
        (("ID",), {"delay_ms": 1, "body": "text"}),
    ],
    ids=[
        "no-target",
        "id-and-key",
        "key-without-topic",
        "topic-without-key",
        "no-timing",
        "both-timings",
        "body-not-bytes",
    ],
)
def test_reschedule_with_bad_arguments_is_invalid_and_changes_nothing(
    harness: Harness, args: tuple[str, ...], kwargs: dict[str, Any]
) -> None:
    sent = harness.broker.send(Message(T, b"x", key="k", delay_ms=5_000))
    args = tuple(sent.msg_id if a == "ID" else a for a in args)
    with pytest.raises(InvalidArgument):
        harness.broker.reschedule(*args, **kwargs)
    _unchanged(harness, sent.msg_id, sent.deliver_at_ms, b"x")


@pytest.mark.parametrize(
    "timing",
    ["negative", "past-beyond-tolerance", "past-max-delay", "not-an-int"],
)
def test_reschedule_with_a_bad_time_is_invalid_delay_and_changes_nothing(
    harness: Harness, timing: str
) -> None:
    sent = harness.broker.send(Message(T, b"x", key="k", delay_ms=5_000))
    kwargs: dict[str, Any] = {
        "negative": {"delay_ms": -1},
        "past-beyond-tolerance": {
            "deliver_at_ms": harness.now - RESCHEDULE_PAST_TOLERANCE_MS - 1_000
        },
        "past-max-delay": {"delay_ms": 11 * YEAR_MS},
        "not-an-int": {"delay_ms": 1.5},
    }[timing]
    for target in ({"msg_id": sent.msg_id}, {"key": "k", "topic": T}):
        with pytest.raises(InvalidDelay):
            harness.broker.reschedule(**target, **kwargs)
    _unchanged(harness, sent.msg_id, sent.deliver_at_ms, b"x")


def test_reschedule_with_a_body_over_the_max_size_raises_and_changes_nothing(
    harness: Harness,
) -> None:
    sent = harness.broker.send(Message(T, b"x", key="k", delay_ms=5_000))
    with pytest.raises(MessageTooLarge):
        harness.broker.reschedule(sent.msg_id, delay_ms=1, body=b"\0" * (DEFAULT_MAX_BODY + 1))
    _unchanged(harness, sent.msg_id, sent.deliver_at_ms, b"x")


def test_reschedule_counts_the_properties_with_the_body(harness: Harness) -> None:
    props = {"p": "v" * 100}
    sent = harness.broker.send(Message(T, b"x", key="k", properties=props, delay_ms=5_000))
    with pytest.raises(MessageTooLarge):
        harness.broker.reschedule(sent.msg_id, delay_ms=1, body=b"\0" * DEFAULT_MAX_BODY)
    _unchanged(harness, sent.msg_id, sent.deliver_at_ms, b"x")


def test_reschedule_to_a_bad_topic_name_is_invalid_topic(harness: Harness) -> None:
    with pytest.raises(InvalidTopic):
        harness.broker.reschedule(key="k", topic="bad topic!", delay_ms=1)


# -- the race with the fire time


def _race_round(h: Harness, c: Any, n: int, new_delays: list[int]) -> Counter[str]:
    """Send ``n`` messages due in 100 ms; reschedule each (to one of ``new_delays``)
    on one thread while this one moves time onto their fire time once the first ten
    are answered; each is delivered exactly once, at the time its answer says.
    Returns how often each answer came."""
    due = h.now + 100
    sent = h.broker.send_batch([Message(T, b"%d" % i, deliver_at_ms=due) for i in range(n)])
    ids = [r.msg_id for r in sent]
    answers: dict[str, RescheduleResult] = {}
    started = threading.Event()
    errors: list[BaseException] = []

    def reschedule_all() -> None:
        try:
            for i, msg_id in enumerate(ids):
                if i == 10:
                    started.set()
                delay = new_delays[i % len(new_delays)]
                answers[msg_id] = h.broker.reschedule(msg_id, delay_ms=delay)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)
        started.set()

    t = threading.Thread(target=reschedule_all, daemon=True)
    t.start()
    assert started.wait(30)
    h.advance(100)  # the fire time arrives while the reschedules are under way
    t.join(60)
    assert not t.is_alive() and not errors
    assert {a.status for a in answers.values()} <= {_RESCHEDULED, _DELIVERED}
    h.advance(max(new_delays) + 1)
    got = pull_until(c, n, timeout=30, max_messages=100)
    for m in got:
        c.ack(m)
    assert Counter(m.msg_id for m in got) == Counter(ids)  # each exactly once
    for m in got:
        answer = answers[m.msg_id]
        expected = due if answer.status is _DELIVERED else answer.deliver_at_ms
        assert m.deliver_at_ms == expected
    assert_nothing(c, wait_ms=100)
    return Counter(a.status.name for a in answers.values())


def test_reschedule_racing_the_fire_time_delivers_each_message_exactly_once(
    harness: Harness,
) -> None:
    c = harness.consumer("g", [T])
    seen: Counter[str] = Counter()
    for _ in range(20):
        seen += _race_round(harness, c, 50, [0, 1, 50, 500])
    assert seen["RESCHEDULED"] >= 200  # at least the first ten of each round


def test_reschedule_to_now_racing_the_fire_time_delivers_once(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    seen: Counter[str] = Counter()
    for _ in range(20):
        seen += _race_round(harness, c, 50, [0])
    assert seen["RESCHEDULED"] >= 200


# =========================================================================== abort_prefix


def test_abort_prefix_aborts_the_pending_and_names_the_fired(harness: Harness) -> None:
    """The order workflow: paid, so every pending timer of ``order:42:`` goes."""
    c = harness.consumer("g", [T])
    remind = harness.broker.send(Message(T, b"r", key="order:42:remind", delay_ms=1_000))
    close = harness.broker.send(Message(T, b"c", key="order:42:close", delay_ms=60_000))
    other = harness.broker.send(Message(T, b"o", key="order:43:close", delay_ms=60_000))
    elsewhere = harness.broker.send(Message("u", b"u", key="order:42:x", delay_ms=60_000))
    harness.advance(1_000)
    got = pull_one(c)
    assert got.msg_id == remind.msg_id
    c.ack(got)
    result = harness.broker.abort_prefix(T, "order:42:")
    assert (result.aborted, result.already_delivered, result.already_delivered_count) == (
        1,
        ("order:42:remind",),
        1,
    )
    assert state_of(harness, close.msg_id) is MessageState.ABORTED
    assert state_of(harness, other.msg_id) is MessageState.PENDING
    assert state_of(harness, elsewhere.msg_id) is MessageState.PENDING
    harness.advance(60_000)
    assert pull_one(c).msg_id == other.msg_id
    assert_nothing(c)


def test_messages_aborted_by_prefix_answer_as_aborted(harness: Harness) -> None:
    sent = harness.broker.send(Message(T, b"x", key="p:1", delay_ms=5_000))
    harness.broker.abort_prefix(T, "p:")
    assert harness.broker.abort(sent.msg_id) == AbortResult(AbortStatus.ABORTED, sent.msg_id)
    assert harness.broker.reschedule(sent.msg_id, delay_ms=0).status is _NOT_FOUND
    assert harness.broker.find_pending(T).messages == []


def test_abort_prefix_twice_aborts_nothing_the_second_time(harness: Harness) -> None:
    for i in range(5):
        harness.broker.send(Message(T, b"x", key=f"p:{i}", delay_ms=5_000))
    assert harness.broker.abort_prefix(T, "p:").aborted == 5
    again = harness.broker.abort_prefix(T, "p:")
    assert (again.aborted, again.already_delivered, again.already_delivered_count) == (0, (), 0)


def test_abort_prefix_frees_the_keys(harness: Harness) -> None:
    harness.broker.send(Message(T, b"x", key="p:1", delay_ms=5_000))
    harness.broker.abort_prefix(T, "p:")
    assert harness.broker.send(Message(T, b"y", key="p:1", delay_ms=5_000)).status is SendStatus.OK


def test_abort_prefix_matches_by_prefix_only(harness: Harness) -> None:
    keys = ["a", "a:", "a:1", "a:1:x", "a:2", "ab", "b:a:1", "A:1"]
    for k in keys:
        harness.broker.send(Message(T, b"x", key=k, delay_ms=5_000))
    assert harness.broker.abort_prefix(T, "a:").aborted == 4
    assert sorted(v.key or "" for v in harness.broker.pending()) == ["A:1", "a", "ab", "b:a:1"]


def test_abort_prefix_aborts_rescheduled_messages_too(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    sent = harness.broker.send(Message(T, b"x", key="p:1", delay_ms=5_000))
    harness.broker.reschedule(sent.msg_id, delay_ms=1_000)
    assert harness.broker.abort_prefix(T, "p:").aborted == 1
    harness.advance(5_000)
    assert_nothing(c)


def test_abort_prefix_of_many_keys_aborts_them_all(harness: Harness) -> None:
    n = 2_500
    harness.broker.send_batch(
        [Message(T, b"x", key=f"tenant:7:{i:05d}", delay_ms=10_000 + i) for i in range(n)]
    )
    keep = harness.broker.send(Message(T, b"x", key="tenant:8:0", delay_ms=10_000))
    result = harness.broker.abort_prefix(T, "tenant:7:")
    assert (result.aborted, result.already_delivered_count) == (n, 0)
    assert topic_stats(harness).pending == 1
    assert [v.msg_id for v in harness.broker.pending()] == [keep.msg_id]


def test_abort_prefix_lists_the_first_fired_keys_in_key_order_and_counts_all(
    harness: Harness,
) -> None:
    n = MAX_REPORTED_KEYS + 20
    keys = [f"k:{i:05d}" for i in range(n)]
    random.Random(7).shuffle(keys)
    harness.broker.send_batch([Message(T, b"x", key=k, delay_ms=1_000) for k in keys])
    harness.broker.send(Message(T, b"x", key="k:pending", delay_ms=60_000))
    harness.advance(1_000)
    eventually(lambda: topic_stats(harness).pending == 1, what="the fired ones fired")
    result = harness.broker.abort_prefix(T, "k:")
    assert result.aborted == 1
    assert result.already_delivered_count == n
    assert result.already_delivered == tuple(sorted(keys)[:MAX_REPORTED_KEYS])


def test_abort_prefix_keeps_pending_and_stats_right(harness: Harness) -> None:
    for i in range(10):
        harness.broker.send(Message(T, b"x", key=f"p:{i}", delay_ms=5_000))
        harness.broker.send(Message(T, b"x", key=f"q:{i}", delay_ms=5_000))
    harness.broker.abort_prefix(T, "p:")
    assert topic_stats(harness).pending == 10
    assert {(v.key or "")[:2] for v in harness.broker.pending()} == {"q:"}
    c = harness.consumer("g", [T])
    harness.advance(5_000)
    assert len(pull_until(c, 10)) == 10
    assert_nothing(c)
    stats = topic_stats(harness)
    assert (stats.pending, stats.fired_total) == (0, 10)


@pytest.mark.parametrize("prefix", ["", None, 7])
def test_abort_prefix_with_a_bad_prefix_is_invalid_and_changes_nothing(
    harness: Harness, prefix: Any
) -> None:
    harness.broker.send(Message(T, b"x", key="p:1", delay_ms=5_000))
    with pytest.raises(InvalidArgument):
        harness.broker.abort_prefix(T, prefix)
    assert len(harness.broker.pending()) == 1


def test_abort_prefix_on_a_topic_never_used_is_unknown_topic(harness: Harness) -> None:
    harness.broker.send(Message(T, b"x", key="p:1", delay_ms=5_000))
    with pytest.raises(UnknownTopic):
        harness.broker.abort_prefix("never-used-topic", "p:")
    with pytest.raises(InvalidTopic):
        harness.broker.abort_prefix("bad topic!", "p:")
    assert len(harness.broker.pending()) == 1


def test_a_topic_only_subscribed_to_is_unknown_until_a_message_is_sent(
    harness: Harness,
) -> None:
    harness.consumer("g", ["subscribed"])
    with pytest.raises(UnknownTopic):
        harness.broker.abort_prefix("subscribed", "p:")
    with pytest.raises(UnknownTopic):
        harness.broker.find_pending("subscribed")
    sent = harness.broker.send(Message("subscribed", b"x", key="p:1", delay_ms=1_000))
    harness.broker.abort(sent.msg_id)  # a topic that had a message stays known
    assert harness.broker.find_pending("subscribed").messages == []
    assert harness.broker.abort_prefix("subscribed", "p:").aborted == 0


# =========================================================================== find_pending


def test_find_pending_lists_pending_messages_in_due_order(harness: Harness) -> None:
    ids = {}
    for delay in (3_000, 1_000, 2_000):
        ids[delay] = harness.broker.send(Message(T, b"x", delay_ms=delay)).msg_id
    page = harness.broker.find_pending()
    assert [v.msg_id for v in page.messages] == [ids[1_000], ids[2_000], ids[3_000]]
    assert page.cursor is None
    first = page.messages[0]
    assert (first.state, first.topic, first.deliver_at_ms) == (
        MessageState.PENDING,
        T,
        harness.now + 1_000,
    )


def test_find_pending_leaves_out_fired_aborted_and_retrying_messages(harness: Harness) -> None:
    """Only messages that never fired (what reschedule can still move) are pending."""
    c = harness.consumer("g", [T])
    retried = harness.broker.send(Message(T, b"r", delay_ms=1_000))
    fired = harness.broker.send(Message(T, b"f", delay_ms=1_000))
    aborted = harness.broker.send(Message(T, b"a", delay_ms=5_000))
    pending = harness.broker.send(Message(T, b"p", delay_ms=5_000))
    harness.broker.abort(aborted.msg_id)
    harness.advance(1_000)
    for m in pull_until(c, 2):
        assert c.nack(m, delay_ms=60_000) if m.msg_id == retried.msg_id else c.ack(m)
    assert [v.msg_id for v in all_pages(harness)] == [pending.msg_id]
    assert [v.msg_id for v in all_pages(harness, topic=T)] == [pending.msg_id]
    assert fired.msg_id not in {v.msg_id for v in all_pages(harness)}


def test_find_pending_filters_by_topic_key_prefix_tag_and_time(harness: Harness) -> None:
    now = harness.now
    msgs = [
        Message(T, b"1", key="order:42:remind", tags="remind", deliver_at_ms=now + 1_000),
        Message(T, b"2", key="order:42:close", tags="close", deliver_at_ms=now + 2_000),
        Message(T, b"3", key="order:43:close", tags="close", deliver_at_ms=now + 3_000),
        Message(T, b"4", tags="close", deliver_at_ms=now + 4_000),
        Message("u", b"5", key="order:42:close", tags="close", deliver_at_ms=now + 5_000),
    ]
    ids = [r.msg_id for r in harness.broker.send_batch(msgs)]

    def found(**filters: Any) -> list[str]:
        return [v.msg_id for v in all_pages(harness, **filters)]

    assert found(topic=T) == ids[:4]
    assert found(topic="u") == ids[4:]
    assert found(topic=T, key_prefix="order:42:") == ids[:2]
    assert found(topic=T, key_prefix="order:") == ids[:3]
    assert found(tag="close") == ids[1:]
    assert found(topic=T, tag="close", key_prefix="order:4") == ids[1:3]
    assert found(tag="clos") == []  # the exact tag
    assert found(start_ms=now + 2_000, end_ms=now + 4_000) == ids[1:3]  # [start, end)
    assert found(start_ms=now + 4_000) == ids[3:]
    assert found(end_ms=now + 1_000) == []
    assert found(topic=T, key_prefix="order:42:", start_ms=now + 1_001) == ids[1:2]


def test_find_pending_pages_through_many_messages_in_due_order(harness: Harness) -> None:
    now = harness.now
    n = 2_500
    rng = random.Random(15)
    msgs = [
        Message(
            T,
            b"%d" % i,
            key=f"k:{i}",
            tags=f"job{i % 3}",
            deliver_at_ms=now + 1 + rng.randrange(20_000),
        )
        for i in range(n)
    ]
    sent = harness.broker.send_batch(msgs)
    views = all_pages(harness, limit=100, topic=T)
    ids = [v.msg_id for v in views]
    assert len(ids) == len(set(ids)) == n  # all, no duplicates
    assert set(ids) == {r.msg_id for r in sent}
    dues = [v.deliver_at_ms for v in views]
    assert dues == sorted(dues)
    tagged = all_pages(harness, limit=100, tag="job1")
    assert [v.msg_id for v in tagged] == [v.msg_id for v in views if v.tags == "job1"]


def test_find_pending_by_a_narrow_key_prefix_among_many(harness: Harness) -> None:
    now = harness.now
    harness.broker.send_batch(
        [
            Message(T, b"x", key=f"order:{i}:close", deliver_at_ms=now + 1_000 + i)
            for i in range(3_000)
        ]
    )
    mine = [
        harness.broker.send(Message(T, b"m", key=f"order:42:{n}", delay_ms=d)).msg_id
        for n, d in (("remind", 900), ("close", 1_800))
    ]
    assert [v.msg_id for v in all_pages(harness, topic=T, key_prefix="order:42:")] == mine


def test_find_pending_pages_hold_at_most_limit(harness: Harness) -> None:
    harness.broker.send_batch([Message(T, b"x", delay_ms=1_000 + i) for i in range(25)])
    page = harness.broker.find_pending(T, limit=10)
    assert len(page.messages) <= 10 and page.cursor is not None
    assert len(all_pages(harness, limit=10, topic=T)) == 25


def test_find_pending_with_body_adds_the_bodies(harness: Harness) -> None:
    harness.broker.send(Message(T, b"body-1", key="k", delay_ms=1_000))
    (plain,) = harness.broker.find_pending(T).messages
    (full,) = harness.broker.find_pending(T, with_body=True).messages
    assert plain.body is None
    assert full.body == b"body-1"
    assert (full.msg_id, full.key, full.body_size) == (plain.msg_id, "k", 6)


def test_find_pending_shows_a_rescheduled_message_once_at_its_new_time(
    harness: Harness,
) -> None:
    a = harness.broker.send(Message(T, b"new", delay_ms=1_000))
    b = harness.broker.send(Message(T, b"b", delay_ms=2_000))
    harness.broker.reschedule(a.msg_id, delay_ms=3_000, body=b"moved")
    views = harness.broker.find_pending(T, with_body=True).messages
    assert [(v.msg_id, v.deliver_at_ms, v.body) for v in views] == [
        (b.msg_id, harness.now + 2_000, b"b"),
        (a.msg_id, harness.now + 3_000, b"moved"),
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": -1},
        {"key_prefix": "p:"},  # a prefix needs a topic
        {"topic": T, "key_prefix": ""},
        {"tag": ""},
        {"start_ms": -1},
        {"end_ms": "soon"},
        {"cursor": "not a cursor"},
        {"cursor": ""},
        {"cursor": "e1AAAA"},
        {"cursor": "m1AAAA"},
    ],
)
def test_find_pending_with_bad_arguments_is_invalid(
    harness: Harness, kwargs: dict[str, Any]
) -> None:
    harness.broker.send(Message(T, b"x", key="p:1", delay_ms=1_000))
    with pytest.raises(InvalidArgument):
        harness.broker.find_pending(**kwargs)


def test_find_pending_on_a_topic_never_used_is_unknown_topic(harness: Harness) -> None:
    harness.broker.send(Message(T, b"x", delay_ms=1_000))
    with pytest.raises(UnknownTopic):
        harness.broker.find_pending("never-used-topic")
    with pytest.raises(UnknownTopic):
        harness.broker.find_pending("never-used-topic", key_prefix="p:")
    with pytest.raises(InvalidTopic):
        harness.broker.find_pending("bad topic!")


# =========================================================================== rate limits


def test_acquire_rate_allows_a_burst_of_limit_then_says_how_long_to_wait(
    harness: Harness,
) -> None:
    b = harness.broker
    assert [b.acquire_rate("jobs:send", 3, 3_000) for _ in range(3)] == [0, 0, 0]
    wait = b.acquire_rate("jobs:send", 3, 3_000)
    assert 0 < wait <= 1_000
    assert b.acquire_rate("jobs:send", 3, 3_000) > 0  # a refusal takes nothing
    harness.advance(wait)
    assert b.acquire_rate("jobs:send", 3, 3_000) == 0
    assert b.acquire_rate("jobs:send", 3, 3_000) > 0


def test_acquire_rate_keeps_the_rate_over_time(harness: Harness) -> None:
    granted = 0
    for _ in range(100):  # 10 s in steps of 100 ms, asking until refused each time
        while harness.broker.acquire_rate("r", 5, 1_000) == 0:
            granted += 1
        harness.advance(100)
    assert 50 <= granted <= 5 + 50  # a burst of 5, then 5 per second


def test_acquire_rate_buckets_are_independent(harness: Harness) -> None:
    assert harness.broker.acquire_rate("a", 1, 60_000) == 0
    assert harness.broker.acquire_rate("a", 1, 60_000) > 0
    assert harness.broker.acquire_rate("b", 1, 60_000) == 0


@pytest.mark.parametrize(
    ("bucket", "limit", "period"),
    [("", 1, 1_000), ("b", 0, 1_000), ("b", 1, 0), ("b", -1, 1_000), (None, 1, 1_000)],
)
def test_acquire_rate_with_bad_arguments_is_invalid(
    harness: Harness, bucket: Any, limit: Any, period: Any
) -> None:
    with pytest.raises(InvalidArgument):
        harness.broker.acquire_rate(bucket, limit, period)


# =========================================================================== semaphores


def test_acquire_slot_admits_limit_holders(harness: Harness) -> None:
    b = harness.broker
    assert b.acquire_slot("job:sync", 2, "run-1", 60_000)
    assert b.acquire_slot("job:sync", 2, "run-2", 60_000)
    assert not b.acquire_slot("job:sync", 2, "run-3", 60_000)
    assert b.acquire_slot("job:other", 2, "run-3", 60_000)


def test_acquire_slot_by_a_holder_renews_its_lease(harness: Harness) -> None:
    b = harness.broker
    assert b.acquire_slot("s", 1, "run-1", 1_000)
    harness.advance(900)
    assert b.acquire_slot("s", 1, "run-1", 1_000)  # renewed: held until +1,900
    harness.advance(900)
    assert not b.acquire_slot("s", 1, "run-2", 1_000)
    harness.advance(100)
    assert b.acquire_slot("s", 1, "run-2", 1_000)


def test_an_expired_lease_frees_its_slot(harness: Harness) -> None:
    b = harness.broker
    assert b.acquire_slot("s", 1, "dead-run", 1_000)
    assert not b.acquire_slot("s", 1, "run-2", 1_000)
    harness.advance(1_000)
    assert b.acquire_slot("s", 1, "run-2", 1_000)
    assert not b.release_slot("s", "dead-run")


def test_release_slot_frees_the_slot_once(harness: Harness) -> None:
    b = harness.broker
    assert b.acquire_slot("s", 1, "run-1", 60_000)
    assert b.release_slot("s", "run-1")
    assert not b.release_slot("s", "run-1")
    assert not b.release_slot("never", "run-1")
    assert b.acquire_slot("s", 1, "run-2", 60_000)


def test_release_slot_of_another_holder_changes_nothing(harness: Harness) -> None:
    b = harness.broker
    assert b.acquire_slot("s", 1, "run-1", 60_000)
    assert not b.release_slot("s", "run-2")
    assert not b.acquire_slot("s", 1, "run-2", 60_000)


def test_slots_held_from_many_threads_never_exceed_the_limit(harness: Harness) -> None:
    held: set[str] = set()
    most = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(me: str) -> None:
        nonlocal most
        try:
            for _ in range(40):
                if harness.broker.acquire_slot("s", 3, me, 60_000):
                    with lock:
                        held.add(me)
                        most = max(most, len(held))
                    with lock:
                        held.discard(me)
                    assert harness.broker.release_slot("s", me)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(f"run-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert 1 <= most <= 3


@pytest.mark.parametrize(
    ("name", "limit", "holder", "lease"),
    [("", 1, "h", 1_000), ("s", 0, "h", 1_000), ("s", 1, "", 1_000), ("s", 1, "h", 0)],
)
def test_acquire_slot_with_bad_arguments_is_invalid(
    harness: Harness, name: str, limit: int, holder: str, lease: int
) -> None:
    with pytest.raises(InvalidArgument):
        harness.broker.acquire_slot(name, limit, holder, lease)


@pytest.mark.parametrize(("name", "holder"), [("", "h"), ("s", "")])
def test_release_slot_with_bad_arguments_is_invalid(
    harness: Harness, name: str, holder: str
) -> None:
    with pytest.raises(InvalidArgument):
        harness.broker.release_slot(name, holder)


# =========================================================================== closed


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.reschedule("id", delay_ms=1),
        lambda b: b.abort_prefix(T, "p:"),
        lambda b: b.find_pending(),
        lambda b: b.acquire_rate("b", 1, 1_000),
        lambda b: b.acquire_slot("s", 1, "h", 1_000),
        lambda b: b.release_slot("s", "h"),
    ],
    ids=[
        "reschedule",
        "abort_prefix",
        "find_pending",
        "acquire_rate",
        "acquire_slot",
        "release_slot",
    ],
)
def test_runtime_calls_after_close_raise_broker_closed(harness: Harness, call: Any) -> None:
    harness.broker.send(Message(T, b"x", delay_ms=1_000))
    harness.broker.close()
    with pytest.raises(BrokerClosed):
        call(harness.broker)


# =========================================================================== a model


class _Model:
    """What the contract says the broker holds: each message's state, due time and
    body, and the last message of each key."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}  # msg_id -> pending | fired | aborted
        self.due: dict[str, int] = {}
        self.body: dict[str, bytes] = {}
        self.asked: dict[str, int] = {}
        self.key_of: dict[str, str] = {}
        self.last: dict[str, str] = {}  # key -> msg_id of the last message sent with it
        self.delivered: Counter[str] = Counter()
        self.used = False  # a message was sent to the topic

    def duplicate_of(self, key: str, asked: int) -> str | None:
        """The message a keyed send with due time ``asked`` duplicates, if any."""
        msg_id = self.last.get(key)
        if msg_id is None or self.state[msg_id] == "aborted":
            return None
        if self.state[msg_id] == "pending" or self.asked[msg_id] == asked:
            return msg_id
        return None


def test_runtime_calls_against_a_model(harness: Harness) -> None:
    """Sends (keyed or not), reschedules, aborts, prefix aborts, clock advances and
    pull+ack in any order: every message is delivered exactly once or aborted (never
    both, never twice), each answer is the model's, and a delivery carries the
    latest body at the latest due time."""
    h = harness
    examples = iter(range(10_000))
    keys = st.sampled_from(["a:1", "a:2", "b:1", "b:2"])
    delays = st.sampled_from([0, 1, 500, 1_000, 2_500])

    class Machine(RuleBasedStateMachine):
        ids = Bundle("ids")

        def __init__(self) -> None:
            super().__init__()
            n = next(examples)
            self.topic = f"model{n}"
            self.consumer = h.consumer(f"model{n}", [self.topic])
            self.model = _Model()

        # -- helpers

        def settle(self) -> None:
            """Wait until what is due has fired, so answers are determined."""
            now = h.now
            for msg_id, state in self.model.state.items():
                if state == "pending" and self.model.due[msg_id] <= now:
                    wait_fired(h, msg_id)
                    self.model.state[msg_id] = "fired"

        # -- rules

        @rule(target=ids, key=st.none() | keys, delay=delays)
        def send(self, key: str | None, delay: int) -> str:
            asked = h.now + delay
            r = h.broker.send(Message(self.topic, b"s%d" % asked, key=key, deliver_at_ms=asked))
            self.model.used = True
            dup = None if key is None else self.model.duplicate_of(key, asked)
            if dup is not None:
                assert (r.status, r.msg_id) == (SendStatus.DUPLICATE, dup)
                assert r.deliver_at_ms == self.model.due[dup]
            else:
                assert r.status is SendStatus.OK and r.msg_id not in self.model.state
                m = self.model
                m.state[r.msg_id], m.due[r.msg_id] = "pending", asked
                m.body[r.msg_id], m.asked[r.msg_id] = b"s%d" % asked, asked
                if key is not None:
                    m.key_of[r.msg_id] = key
                    m.last[key] = r.msg_id
            self.settle()
            return r.msg_id

        @rule(msg_id=ids, delay=delays, new_body=st.booleans())
        def reschedule_by_id(self, msg_id: str, delay: int, new_body: bool) -> None:
            body = b"r%d" % (h.now + delay) if new_body else None
            r = h.broker.reschedule(msg_id, delay_ms=delay, body=body)
            self.check_reschedule(msg_id, r, delay, body)

        @rule(key=keys, delay=delays)
        def reschedule_by_key(self, key: str, delay: int) -> None:
            r = h.broker.reschedule(key=key, topic=self.topic, delay_ms=delay)
            msg_id = self.model.last.get(key)
            if msg_id is None:
                assert r.status is _NOT_FOUND
                return
            self.check_reschedule(msg_id, r, delay, None)

        def check_reschedule(
            self, msg_id: str, r: RescheduleResult, delay: int, body: bytes | None
        ) -> None:
            state = self.model.state[msg_id]
            expected = {"pending": _RESCHEDULED, "fired": _DELIVERED, "aborted": _NOT_FOUND}
            assert r.status is expected[state]
            if state == "pending":
                assert (r.msg_id, r.deliver_at_ms) == (msg_id, h.now + delay)
                self.model.due[msg_id] = h.now + delay
                if body is not None:
                    self.model.body[msg_id] = body
            elif state == "fired":
                assert (r.msg_id, r.deliver_at_ms) == (msg_id, self.model.due[msg_id])
            self.settle()

        @rule(msg_id=ids)
        def abort_by_id(self, msg_id: str) -> None:
            self.check_abort(msg_id, h.broker.abort(msg_id))

        @rule(key=keys)
        def abort_by_key(self, key: str) -> None:
            r = h.broker.abort(key=key, topic=self.topic)
            msg_id = self.model.last.get(key)
            if msg_id is None:
                assert r.status is AbortStatus.NOT_FOUND
                return
            self.check_abort(msg_id, r)

        def check_abort(self, msg_id: str, r: AbortResult) -> None:
            state = self.model.state[msg_id]
            assert r.msg_id == msg_id
            if state == "fired":
                assert r.status is AbortStatus.ALREADY_DELIVERED
            else:
                assert r.status is AbortStatus.ABORTED
                self.model.state[msg_id] = "aborted"

        @rule(prefix=st.sampled_from(["a:", "b:", "a:1"]))
        def abort_prefix(self, prefix: str) -> None:
            if not self.model.used:
                with pytest.raises(UnknownTopic):
                    h.broker.abort_prefix(self.topic, prefix)
                return
            r = h.broker.abort_prefix(self.topic, prefix)
            m = self.model
            under = {k: i for k, i in m.last.items() if k.startswith(prefix)}
            pending = [i for i in under.values() if m.state[i] == "pending"]
            fired = sorted(k for k, i in under.items() if m.state[i] == "fired")
            assert r.aborted == len(pending)
            assert (r.already_delivered, r.already_delivered_count) == (tuple(fired), len(fired))
            for msg_id in pending:
                m.state[msg_id] = "aborted"

        @rule(ms=st.sampled_from([1, 499, 500, 1_000, 3_000]))
        def advance(self, ms: int) -> None:
            h.advance(ms)
            self.settle()

        @rule()
        def pull_and_ack(self) -> None:
            for got in self.consumer.pull(max_messages=32, wait_ms=0):
                assert self.model.state.get(got.msg_id) == "fired", got.msg_id
                assert got.body == self.model.body[got.msg_id]
                assert got.deliver_at_ms == self.model.due[got.msg_id]
                self.model.delivered[got.msg_id] += 1
                assert self.consumer.ack(got)

        @invariant()
        def delivered_at_most_once(self) -> None:
            assert all(n == 1 for n in self.model.delivered.values())

        def teardown(self) -> None:
            m = self.model
            h.advance(10_000)
            self.settle()
            expected = sum(1 for s in m.state.values() if s == "fired")
            while sum(m.delivered.values()) < expected:
                got = pull_until(self.consumer, expected - sum(m.delivered.values()))
                assert got, "a fired message was never delivered"
                for g in got:
                    assert m.state[g.msg_id] == "fired" and g.body == m.body[g.msg_id]
                    m.delivered[g.msg_id] += 1
                    self.consumer.ack(g)
            assert_nothing(self.consumer, wait_ms=50)
            assert dict(m.delivered) == {i: 1 for i, s in m.state.items() if s == "fired"}
            if m.used:
                assert h.broker.find_pending(self.topic).messages == []
            else:
                with pytest.raises(UnknownTopic):
                    h.broker.find_pending(self.topic)
            self.consumer.close()

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=20,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
