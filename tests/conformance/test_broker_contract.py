"""The ``BrokerAdapter`` contract (``broker_adapter/base.py``), one test per sentence.

Runs against every adapter in ``conftest.ADAPTERS`` through the ``harness``
fixture. Time is a ``ManualClock``: tests advance it instead of sleeping, and
wait for asynchronous effects with ``eventually``/long polls, never with
timing assertions.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from broker_adapter.base import (
    Consumer,
    dead_letter_topic,
    retry_backoff_ms,
)
from broker_adapter.errors import (
    BrokerClosed,
    InvalidArgument,
    InvalidDelay,
    InvalidMessage,
    InvalidTopic,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    GroupStats,
    MessageState,
    ReceivedMessage,
    SendResult,
    SendStatus,
    TopicStats,
)
from tests.conformance.conftest import Harness
from tests.helpers import assert_nothing, eventually, pull_one, pull_until

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
DEFAULT_MAX_BODY = 4 * MiB
YEAR_MS = 365 * 24 * 3600 * 1000
TOO_FAR_MS = 11 * YEAR_MS  # past the default max delay of 10 years
T = "t"  # the default topic of these tests


def state_of(h: Harness, msg_id: str) -> MessageState | None:
    view = h.broker.query(msg_id)
    return None if view is None else view.state


def wait_state(h: Harness, msg_id: str, state: MessageState) -> None:
    eventually(lambda: state_of(h, msg_id) is state, what=f"{msg_id} is {state.name}")


def topic_stats(h: Harness, topic: str = T) -> TopicStats:
    return h.broker.stats().topics.get(topic, TopicStats())


def group_stats(h: Harness, group: str) -> GroupStats:
    return h.broker.stats().groups.get(group, GroupStats())


def pull_greedy(c: Consumer, at_least: int, timeout: float = 10.0) -> list[ReceivedMessage]:
    """Pull with a large ``max_messages`` until ``at_least`` arrived, then drain what
    else comes at once; flow-control tests assert the total stays within the limits."""
    got = pull_until(c, at_least, timeout=timeout, max_messages=50)
    while more := c.pull(max_messages=50, wait_ms=300):
        got.extend(more)
    return got


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` on a daemon thread; the list receives its result (or exception)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except Exception as e:  # noqa: BLE001 - handed to the test to assert on
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


# --------------------------------------------------------------------------- send


def test_send_returns_ok_with_id_and_due_time(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"a", delay_ms=5_000))
    assert r.status is SendStatus.OK
    assert isinstance(r.msg_id, str) and r.msg_id
    assert r.deliver_at_ms == harness.now + 5_000


def test_send_gives_every_message_its_own_id(harness: Harness) -> None:
    ids = {harness.broker.send(Message(T, b"%d" % i, delay_ms=1_000)).msg_id for i in range(50)}
    assert len(ids) == 50


@pytest.mark.parametrize(
    ("timing", "delay"),
    [
        ({}, 0),
        ({"delay_ms": 0}, 0),
        ({"delay_ms": 1}, 1),
        ({"delay_sec": 1.5}, 1_500),
        ({"delay_level": 0}, 0),
        ({"delay_level": 3}, 10_000),
        ({"delay_level": 99}, 7_200_000),
    ],
)
def test_send_due_time_follows_the_timing_field(
    harness: Harness, timing: dict[str, Any], delay: int
) -> None:
    r = harness.broker.send(Message(T, b"x", **timing))
    assert r.deliver_at_ms == harness.now + delay


def test_send_keeps_an_absolute_future_time(harness: Harness) -> None:
    at = harness.now + 12_345
    assert harness.broker.send(Message(T, b"x", deliver_at_ms=at)).deliver_at_ms == at


def test_send_with_due_time_in_the_past_is_due_now_and_delivered(harness: Harness) -> None:
    """A past ``deliver_at_ms`` means now: answered as now and delivered without advancing."""
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"past", deliver_at_ms=harness.now - 60_000))
    assert r.deliver_at_ms == harness.now
    assert pull_one(c).msg_id == r.msg_id


def test_message_is_delivered_at_its_time_with_all_its_fields(harness: Harness) -> None:
    c = harness.consumer("g", ["orders"])
    born = harness.now
    msg = Message(
        "orders",
        b'{"id": 42}',
        key="order:42",
        tags="close",
        properties={"a": "1"},
        delay_ms=30_000,
    )
    r = harness.broker.send(msg)
    harness.advance(29_999)
    assert_nothing(c)
    harness.advance(1)
    got = pull_one(c)
    assert (got.msg_id, got.topic, got.body) == (r.msg_id, "orders", b'{"id": 42}')
    assert (got.key, got.tags, dict(got.properties)) == ("order:42", "close", {"a": "1"})
    assert got.deliver_at_ms == r.deliver_at_ms == born + 30_000
    assert got.born_ms == born
    assert got.attempts == 1
    assert isinstance(got.receipt, bytes)


def test_sent_messages_are_durable_across_reopen(harness: Harness) -> None:
    """Once ``send`` returned, a pending and a fired message both survive a restart."""
    later = harness.broker.send(Message(T, b"later", key="k", delay_ms=10_000))
    now = harness.broker.send(Message(T, b"now"))
    wait_state(harness, now.msg_id, MessageState.READY)

    harness.reopen()

    view = harness.broker.query(later.msg_id)
    assert view is not None
    assert (view.state, view.deliver_at_ms, view.key) == (
        MessageState.PENDING,
        later.deliver_at_ms,
        "k",
    )
    assert state_of(harness, now.msg_id) is MessageState.READY
    dup = harness.broker.send(Message(T, b"again", key="k"))
    assert (dup.status, dup.msg_id) == (SendStatus.DUPLICATE, later.msg_id)

    c = harness.consumer("g", [T])
    harness.advance(10_000)
    got = pull_until(c, 2)
    assert sorted((m.body, m.msg_id) for m in got) == sorted(
        [(b"later", later.msg_id), (b"now", now.msg_id)]
    )


def test_inflight_message_is_delivered_again_after_reopen(harness: Harness) -> None:
    """At least once: an un-acked delivery survives a restart, same id, attempts + 1."""
    r = harness.broker.send(Message(T, b"x"))
    first = pull_one(harness.consumer("g", [T], invisible_ms=5_000))
    assert first.attempts == 1
    harness.reopen()
    c = harness.consumer("g", [T], invisible_ms=5_000)
    harness.advance(5_001)
    again = pull_one(c)
    assert (again.msg_id, again.attempts, again.body) == (r.msg_id, 2, b"x")


# ------------------------------------------------------------------ keys / DUPLICATE


def test_send_with_a_pending_key_is_a_duplicate_of_the_first(harness: Harness) -> None:
    first = harness.broker.send(Message(T, b"1", key="order:1", delay_ms=60_000))
    second = harness.broker.send(Message(T, b"2", key="order:1", delay_ms=5_000))
    assert first.status is SendStatus.OK
    assert second == SendResult(SendStatus.DUPLICATE, first.msg_id, first.deliver_at_ms)


def test_duplicate_send_stores_nothing(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    first = harness.broker.send(Message(T, b"1", key="k", delay_ms=10_000))
    harness.broker.send(Message(T, b"2", key="k", delay_ms=10_000))
    assert [v.msg_id for v in harness.broker.pending(topic=T)] == [first.msg_id]
    assert topic_stats(harness).pending == 1
    harness.advance(10_000)
    assert [m.body for m in pull_until(c, 1)] == [b"1"]
    assert_nothing(c)


def test_same_key_on_another_topic_is_not_a_duplicate(harness: Harness) -> None:
    a = harness.broker.send(Message("a", b"", key="k", delay_ms=1_000))
    b = harness.broker.send(Message("b", b"", key="k", delay_ms=1_000))
    assert (a.status, b.status) == (SendStatus.OK, SendStatus.OK)
    assert a.msg_id != b.msg_id


def test_key_is_free_again_after_abort(harness: Harness) -> None:
    first = harness.broker.send(Message(T, b"1", key="k", delay_ms=10_000))
    assert harness.broker.abort(first.msg_id).status is AbortStatus.ABORTED
    second = harness.broker.send(Message(T, b"2", key="k", delay_ms=10_000))
    assert second.status is SendStatus.OK
    assert second.msg_id != first.msg_id


def test_key_is_free_again_after_the_message_fired(harness: Harness) -> None:
    first = harness.broker.send(Message(T, b"1", key="k", delay_ms=1_000))
    harness.advance(1_000)
    wait_state(harness, first.msg_id, MessageState.READY)
    second = harness.broker.send(Message(T, b"2", key="k", delay_ms=1_000))
    assert second.status is SendStatus.OK
    assert second.msg_id != first.msg_id


def test_resending_a_fired_occurrence_at_the_same_ms_is_a_duplicate(harness: Harness) -> None:
    """A cron occurrence re-sent after it fired (slow second scheduler, restart) never fires twice."""
    c = harness.consumer("g", [T])
    due = harness.now + 1_000
    first = harness.broker.send(Message(T, b"1", key="cron:job:1", deliver_at_ms=due))
    harness.advance(1_000)
    assert pull_one(c).msg_id == first.msg_id
    again = harness.broker.send(Message(T, b"1", key="cron:job:1", deliver_at_ms=due))
    assert again == SendResult(SendStatus.DUPLICATE, first.msg_id, due)
    assert harness.broker.pending() == []
    assert_nothing(c)


def test_resending_a_fired_occurrence_whose_time_has_passed_is_a_duplicate(
    harness: Harness,
) -> None:
    """The asked-for time counts, not the clamped one: a late re-send is still recognised."""
    c = harness.consumer("g", [T])
    due = harness.now + 1_000
    first = harness.broker.send(Message(T, b"1", key="cron:job:2", deliver_at_ms=due))
    harness.advance(5_000)
    assert pull_one(c).msg_id == first.msg_id
    again = harness.broker.send(Message(T, b"1", key="cron:job:2", deliver_at_ms=due))
    assert again.status is SendStatus.DUPLICATE and again.msg_id == first.msg_id
    assert_nothing(c)


def test_resending_an_aborted_message_at_the_same_ms_is_stored(harness: Harness) -> None:
    due = harness.now + 5_000
    first = harness.broker.send(Message(T, b"1", key="k", deliver_at_ms=due))
    harness.broker.abort(first.msg_id)
    again = harness.broker.send(Message(T, b"1", key="k", deliver_at_ms=due))
    assert again.status is SendStatus.OK and again.msg_id != first.msg_id


def test_concurrent_sends_of_one_key_store_exactly_one(harness: Harness) -> None:
    """Methods are thread safe: 8 threads racing on one key get one OK, 7 DUPLICATEs of it."""
    barrier = threading.Barrier(8)
    results: list[SendResult] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        barrier.wait()
        r = harness.broker.send(Message(T, b"%d" % i, key="race", delay_ms=10_000))
        with lock:
            results.append(r)

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8
    ok = [r for r in results if r.status is SendStatus.OK]
    assert len(ok) == 1
    assert {r.msg_id for r in results} == {ok[0].msg_id}
    assert len(harness.broker.pending(topic=T)) == 1


def test_concurrent_sends_from_many_threads_all_arrive(harness: Harness) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def send(t: int) -> None:
        for i in range(25):
            r = harness.broker.send(Message(T, b"", key=f"{t}:{i}", delay_ms=10_000 + i))
            with lock:
                ids.append(r.msg_id)

    threads = [threading.Thread(target=send, args=(t,), daemon=True) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(set(ids)) == 200
    assert topic_stats(harness).pending == 200


# ---------------------------------------------------------------------- bad sends


def test_send_of_an_oversized_body_raises_and_stores_nothing(harness: Harness) -> None:
    with pytest.raises(MessageTooLarge):
        harness.broker.send(Message(T, b"x" * (DEFAULT_MAX_BODY + 1), key="k", delay_ms=1_000))
    assert harness.broker.pending() == []
    assert harness.broker.stats().pending == 0
    assert harness.broker.send(Message(T, b"", key="k", delay_ms=1_000)).status is SendStatus.OK


@pytest.mark.parametrize("field", ["delay_ms", "delay_sec", "deliver_at_ms"])
def test_send_past_the_max_delay_raises_and_stores_nothing(harness: Harness, field: str) -> None:
    value = {
        "delay_ms": TOO_FAR_MS,
        "delay_sec": TOO_FAR_MS / 1000,
        "deliver_at_ms": harness.now + TOO_FAR_MS,
    }[field]
    with pytest.raises(InvalidDelay):
        harness.broker.send(Message(T, b"x", key="k", **{field: value}))
    assert harness.broker.pending() == []
    assert harness.broker.stats().pending == 0
    assert harness.broker.send(Message(T, b"", key="k", delay_ms=1_000)).status is SendStatus.OK


@pytest.mark.parametrize("call", ["send", "send_batch", "send_async"])
def test_sending_something_that_is_not_a_message_is_a_value_error(
    harness: Harness, call: str
) -> None:
    """A dict instead of a ``Message`` is refused at once with a chronoq ``ValueError``."""
    not_a_message: Any = {"topic": T, "body": b"x"}
    with pytest.raises((InvalidArgument, InvalidMessage)):
        if call == "send":
            harness.broker.send(not_a_message)
        elif call == "send_batch":
            harness.broker.send_batch([Message(T, b"ok"), not_a_message])
        else:
            harness.broker.send_async(not_a_message, lambda r, e: None)
    harness.broker.flush()
    assert harness.broker.stats().fired_total == 0 and harness.broker.stats().pending == 0


# ---------------------------------------------------------------------- send_batch


def test_send_batch_answers_in_input_order(harness: Harness) -> None:
    delays = [30_000, 10_000, 20_000, 0]
    now = harness.now
    results = harness.broker.send_batch(
        [Message(T, b"%d" % i, delay_ms=d) for i, d in enumerate(delays)]
    )
    assert [r.status for r in results] == [SendStatus.OK] * 4
    assert [r.deliver_at_ms for r in results] == [now + d for d in delays]
    assert len({r.msg_id for r in results}) == 4
    for r, d in zip(results, delays, strict=True):
        view = harness.broker.query(r.msg_id)
        assert view is not None and view.deliver_at_ms == now + d


def test_send_batch_repeated_key_is_a_duplicate_of_the_first(harness: Harness) -> None:
    results = harness.broker.send_batch(
        [
            Message(T, b"1", key="a", delay_ms=5_000),
            Message(T, b"2", key="b", delay_ms=6_000),
            Message(T, b"3", key="a", delay_ms=9_000),
        ]
    )
    assert [r.status for r in results] == [SendStatus.OK, SendStatus.OK, SendStatus.DUPLICATE]
    assert (results[2].msg_id, results[2].deliver_at_ms) == (
        results[0].msg_id,
        results[0].deliver_at_ms,
    )
    assert len(harness.broker.pending(topic=T)) == 2


def test_send_batch_key_already_pending_is_a_duplicate(harness: Harness) -> None:
    first = harness.broker.send(Message(T, b"1", key="a", delay_ms=5_000))
    results = harness.broker.send_batch(
        [Message(T, b"2", key="b", delay_ms=5_000), Message(T, b"3", key="a", delay_ms=5_000)]
    )
    assert [r.status for r in results] == [SendStatus.OK, SendStatus.DUPLICATE]
    assert results[1].msg_id == first.msg_id


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (Message(T, b"x" * (DEFAULT_MAX_BODY + 1)), MessageTooLarge),
        (Message(T, b"x", delay_ms=TOO_FAR_MS), InvalidDelay),
    ],
    ids=["too-large", "too-far"],
)
def test_send_batch_with_an_invalid_member_stores_nothing(
    harness: Harness, bad: Message, error: type[Exception]
) -> None:
    good = [Message(T, b"1", key="k1", delay_ms=1_000), Message(T, b"2", delay_ms=0)]
    with pytest.raises(error):
        harness.broker.send_batch([good[0], bad, good[1]])
    assert harness.broker.pending() == []
    stats = harness.broker.stats()
    assert (stats.pending, stats.fired_total) == (0, 0)
    assert harness.broker.send(Message(T, b"", key="k1", delay_ms=1_000)).status is SendStatus.OK


# ---------------------------------------------------------------------- send_async


def test_send_async_calls_back_exactly_once_on_another_thread(harness: Harness) -> None:
    calls: list[tuple[SendResult | None, BaseException | None, int]] = []
    done = threading.Event()

    def callback(result: SendResult | None, error: BaseException | None) -> None:
        calls.append((result, error, threading.get_ident()))
        done.set()

    harness.broker.send_async(Message(T, b"a", delay_ms=1_000), callback)
    assert done.wait(10)
    harness.broker.flush()
    result, error, thread_id = calls[0]
    assert error is None
    assert result is not None and result.status is SendStatus.OK
    assert result.deliver_at_ms == harness.now + 1_000
    assert thread_id != threading.get_ident()
    assert state_of(harness, result.msg_id) is MessageState.PENDING
    harness.broker.close()  # no callback may come later either
    assert len(calls) == 1


def test_send_async_many_each_called_back_once(harness: Harness) -> None:
    calls: dict[int, list[tuple[SendResult | None, BaseException | None]]] = {
        i: [] for i in range(50)
    }

    def make(i: int) -> Callable[[SendResult | None, BaseException | None], None]:
        return lambda result, error: calls[i].append((result, error))

    for i in range(50):
        harness.broker.send_async(Message(T, b"%d" % i, delay_ms=1_000), make(i))
    harness.broker.flush()
    eventually(lambda: all(calls.values()), what="every callback called")
    harness.broker.close()
    assert all(len(v) == 1 for v in calls.values())
    assert all(v[0][1] is None for v in calls.values())
    ids = {v[0][0].msg_id for v in calls.values() if v[0][0] is not None}
    assert len(ids) == 50


def test_send_async_error_reaches_the_callback_once(harness: Harness) -> None:
    """A broker-side failure (body over the max) is ``callback(None, error)``, or raised at once."""
    calls: list[tuple[SendResult | None, BaseException | None]] = []
    big = Message(T, b"x" * (DEFAULT_MAX_BODY + 1))
    try:
        harness.broker.send_async(big, lambda r, e: calls.append((r, e)))
    except MessageTooLarge:
        raised_at_once = True
    else:
        raised_at_once = False
        eventually(lambda: calls, what="callback called")
    harness.broker.flush()
    assert harness.broker.stats().pending == 0 and harness.broker.stats().fired_total == 0
    harness.broker.close()
    if raised_at_once:
        assert calls == []
    else:
        assert len(calls) == 1
        result, error = calls[0]
        assert result is None
        assert isinstance(error, MessageTooLarge)


# ------------------------------------------------------------------- send_oneway


def test_send_oneway_then_flush_stores_every_message(harness: Harness) -> None:
    for i in range(20):
        harness.broker.send_oneway(Message(T, b"%d" % i, delay_ms=1_000 + i))
    harness.broker.flush()
    views = harness.broker.pending(topic=T)
    assert sorted(v.deliver_at_ms - harness.now for v in views) == [1_000 + i for i in range(20)]
    assert topic_stats(harness).pending == 20


def test_send_oneway_logs_errors_instead_of_raising(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        harness.broker.send_oneway(Message(T, b"x" * (DEFAULT_MAX_BODY + 1)))
        harness.broker.flush()
        eventually(
            lambda: any(r.levelno >= logging.WARNING for r in caplog.records),
            what="the failed one-way send is logged",
        )
    assert harness.broker.stats().pending == 0
    assert harness.broker.pending() == []


# --------------------------------------------------------------------------- abort


def test_abort_by_id_cancels_a_pending_message(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x", delay_ms=10_000))
    assert harness.broker.abort(r.msg_id) == AbortResult(AbortStatus.ABORTED, r.msg_id)
    assert harness.broker.pending() == []
    assert topic_stats(harness).pending == 0
    harness.advance(10_000)
    assert_nothing(c)
    assert state_of(harness, r.msg_id) is MessageState.ABORTED


def test_abort_by_key_and_topic_cancels_a_pending_message(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x", key="order:7", delay_ms=10_000))
    other = harness.broker.send(Message("other", b"y", key="order:7", delay_ms=10_000))
    assert harness.broker.abort(key="order:7", topic=T) == AbortResult(
        AbortStatus.ABORTED, r.msg_id
    )
    harness.advance(10_000)
    assert_nothing(c)
    assert state_of(harness, other.msg_id) is MessageState.READY  # only that topic's key


def test_abort_twice_by_id_answers_aborted_twice(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"x", delay_ms=10_000))
    first = harness.broker.abort(r.msg_id)
    second = harness.broker.abort(r.msg_id)
    assert first == second == AbortResult(AbortStatus.ABORTED, r.msg_id)


def test_abort_twice_by_key_answers_aborted_twice(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"x", key="k", delay_ms=10_000))
    first = harness.broker.abort(key="k", topic=T)
    second = harness.broker.abort(key="k", topic=T)
    assert first == second == AbortResult(AbortStatus.ABORTED, r.msg_id)


def test_abort_is_durable_across_reopen(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"x", key="k", delay_ms=10_000))
    assert harness.broker.abort(r.msg_id).status is AbortStatus.ABORTED
    harness.reopen()
    assert state_of(harness, r.msg_id) is MessageState.ABORTED
    c = harness.consumer("g", [T])
    harness.advance(10_000)
    assert_nothing(c)


@pytest.mark.parametrize("stage", ["ready", "inflight", "done"])
def test_abort_after_fire_is_already_delivered(harness: Harness, stage: str) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x", delay_ms=1_000))
    harness.advance(1_000)
    wait_state(harness, r.msg_id, MessageState.READY)
    if stage != "ready":
        m = pull_one(c)
        if stage == "done":
            assert c.ack(m)
    assert harness.broker.abort(r.msg_id) == AbortResult(AbortStatus.ALREADY_DELIVERED, r.msg_id)
    assert state_of(harness, r.msg_id) is not MessageState.ABORTED


def test_abort_by_key_after_fire_is_already_delivered(harness: Harness) -> None:
    """``cancel(key=...)`` of a job that already fired says "too late", not "no such job"."""
    r = harness.broker.send(Message(T, b"x", key="order:9", delay_ms=1_000))
    harness.advance(1_000)
    wait_state(harness, r.msg_id, MessageState.READY)
    assert harness.broker.abort(key="order:9", topic=T) == AbortResult(
        AbortStatus.ALREADY_DELIVERED, r.msg_id
    )


def test_abort_by_key_targets_the_pending_message_after_key_reuse(harness: Harness) -> None:
    old = harness.broker.send(Message(T, b"old", key="k", delay_ms=1_000))
    harness.advance(1_000)
    wait_state(harness, old.msg_id, MessageState.READY)
    new = harness.broker.send(Message(T, b"new", key="k", delay_ms=1_000))
    assert harness.broker.abort(key="k", topic=T) == AbortResult(AbortStatus.ABORTED, new.msg_id)
    assert state_of(harness, old.msg_id) is MessageState.READY


@pytest.mark.parametrize("msg_id", ["no-such-id", "x" * 2_000, "\x00\x01\xff", "0", "ü"])
def test_abort_of_an_unknown_or_malformed_id_is_not_found(harness: Harness, msg_id: str) -> None:
    harness.broker.send(Message(T, b"x", delay_ms=10_000))  # the store is not empty
    assert harness.broker.abort(msg_id) == AbortResult(AbortStatus.NOT_FOUND, msg_id)


def test_abort_of_an_unknown_key_is_not_found_without_id(harness: Harness) -> None:
    harness.broker.send(Message("other", b"x", key="k", delay_ms=10_000))
    assert harness.broker.abort(key="nope", topic=T) == AbortResult(AbortStatus.NOT_FOUND, None)
    assert harness.broker.abort(key="k", topic=T) == AbortResult(AbortStatus.NOT_FOUND, None)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        (("id",), {"key": "k", "topic": T}),
        ((), {"key": "k"}),
        ((), {"topic": T}),
        (("id",), {"key": "k"}),
    ],
    ids=["neither", "both", "key-without-topic", "topic-without-key", "id-and-key"],
)
def test_abort_needs_exactly_an_id_or_a_key_and_topic(
    harness: Harness, args: tuple[str, ...], kwargs: dict[str, str]
) -> None:
    r = harness.broker.send(Message(T, b"x", key="k", delay_ms=10_000))
    with pytest.raises(InvalidArgument):
        harness.broker.abort(*args, **kwargs)
    assert state_of(harness, r.msg_id) is MessageState.PENDING


def _abort_all(
    h: Harness, ids: list[str], answers: dict[str, AbortStatus], started: threading.Event
) -> None:
    for n, mid in enumerate(ids):
        if n == 50:
            started.set()
        answers[mid] = h.broker.abort(mid).status


def test_aborted_messages_are_never_delivered_when_racing_the_fire_time(
    harness: Harness,
) -> None:
    """Abort half of 1,000 same-millisecond messages on another thread while time reaches
    them: every ``ABORTED`` one is never pulled, every other one is.

    (At this size the fire lands in the middle of the aborts: both answers occur.)"""
    c = harness.consumer("g", ["race"])
    for rnd in range(3):
        due = harness.now + 1_000
        results = harness.broker.send_batch(
            [Message("race", b"%d:%d" % (rnd, i), deliver_at_ms=due) for i in range(1_000)]
        )
        ids = [r.msg_id for r in results]
        to_abort = ids[::2]
        answers: dict[str, AbortStatus] = {}
        started = threading.Event()
        t = threading.Thread(
            target=_abort_all, args=(harness, to_abort, answers, started), daemon=True
        )
        t.start()
        assert started.wait(10)
        harness.advance(1_000)  # the fire time arrives while aborts are under way
        t.join(30)
        assert not t.is_alive()

        assert set(answers.values()) <= {AbortStatus.ABORTED, AbortStatus.ALREADY_DELIVERED}
        aborted = {mid for mid, s in answers.items() if s is AbortStatus.ABORTED}
        assert aborted  # at least the first 50 were aborted before the fire time
        expected = set(ids) - aborted
        got = pull_until(c, len(expected), timeout=30, max_messages=100)
        for m in got:
            c.ack(m)
        got_ids = [m.msg_id for m in got]
        assert not set(got_ids) & aborted
        assert sorted(got_ids) == sorted(expected)
        assert_nothing(c)
        assert {state_of(harness, mid) for mid in aborted} == {MessageState.ABORTED}


# --------------------------------------------------------------------------- query


def test_query_pending(harness: Harness) -> None:
    born = harness.now
    r = harness.broker.send(Message(T, b"12345", key="k", tags="t1", delay_ms=10_000))
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert (view.msg_id, view.topic, view.state) == (r.msg_id, T, MessageState.PENDING)
    assert (view.deliver_at_ms, view.born_ms, view.attempts) == (born + 10_000, born, 0)
    assert (view.key, view.tags, view.body_size) == ("k", "t1", 5)


def test_query_ready(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"x", delay_ms=1_000))
    harness.advance(1_000)
    wait_state(harness, r.msg_id, MessageState.READY)


def test_query_inflight(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    pull_one(c)
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert view.state is MessageState.INFLIGHT
    assert view.groups.get("g") is MessageState.INFLIGHT
    assert view.attempts == 1


def test_query_done(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert c.ack(pull_one(c))
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert (view.state, view.groups.get("g")) == (MessageState.DONE, MessageState.DONE)


def test_query_aborted(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"x", delay_ms=1_000))
    harness.broker.abort(r.msg_id)
    view = harness.broker.query(r.msg_id)
    assert view is not None and view.state is MessageState.ABORTED


def test_query_dead_shows_the_reason(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert c.dead_letter(pull_one(c), "unknown job 'nope'")
    wait_state(harness, r.msg_id, MessageState.DEAD)
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert (view.state, view.groups.get("g")) == (MessageState.DEAD, MessageState.DEAD)
    assert view.error is not None and "unknown job 'nope'" in view.error


def test_query_state_is_the_least_finished_group_state(harness: Harness) -> None:
    """``MessageView.state`` summarises ``groups``: INFLIGHT beats DONE, DEAD beats DONE."""
    a, b = harness.consumer("a", [T]), harness.consumer("b", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert a.ack(pull_one(a))
    mb = pull_one(b)
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert view.state is MessageState.INFLIGHT
    assert dict(view.groups) == {"a": MessageState.DONE, "b": MessageState.INFLIGHT}
    assert b.dead_letter(mb, "bad")
    wait_state(harness, r.msg_id, MessageState.DEAD)
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert view.state is MessageState.DEAD
    assert dict(view.groups) == {"a": MessageState.DONE, "b": MessageState.DEAD}


@pytest.mark.parametrize("msg_id", ["", "no-such-id", "x" * 5_000, "\x00\xff", "0", "-1"])
def test_query_of_an_unknown_or_malformed_id_is_none(harness: Harness, msg_id: str) -> None:
    harness.broker.send(Message(T, b"x", delay_ms=10_000))
    assert harness.broker.query(msg_id) is None


# ------------------------------------------------------------------------- pending


def _send_spread(h: Harness) -> dict[str, str]:
    """Pending messages on topics a/b at +30 s, +10 s, +20 s, +40 s; returns name -> id."""
    plan = [("a30", "a", 30_000), ("b10", "b", 10_000), ("a20", "a", 20_000), ("b40", "b", 40_000)]
    return {name: h.broker.send(Message(topic, b"", delay_ms=d)).msg_id for name, topic, d in plan}


def test_pending_lists_messages_not_yet_due_in_due_time_order(harness: Harness) -> None:
    ids = _send_spread(harness)
    due_now = harness.broker.send(Message("a", b"now")).msg_id
    wait_state(harness, due_now, MessageState.READY)
    views = harness.broker.pending()
    assert [v.msg_id for v in views] == [ids["b10"], ids["a20"], ids["a30"], ids["b40"]]
    assert {v.state for v in views} == {MessageState.PENDING}
    assert [v.deliver_at_ms for v in views] == sorted(v.deliver_at_ms for v in views)


def test_pending_filters_by_topic(harness: Harness) -> None:
    ids = _send_spread(harness)
    assert [v.msg_id for v in harness.broker.pending(topic="a")] == [ids["a20"], ids["a30"]]
    assert [v.msg_id for v in harness.broker.pending(topic="b")] == [ids["b10"], ids["b40"]]
    assert harness.broker.pending(topic="c") == []


def test_pending_time_range_is_start_inclusive_end_exclusive(harness: Harness) -> None:
    ids = _send_spread(harness)
    now = harness.now
    got = harness.broker.pending(start_ms=now + 20_000, end_ms=now + 40_000)
    assert [v.msg_id for v in got] == [ids["a20"], ids["a30"]]
    assert [v.msg_id for v in harness.broker.pending(start_ms=now + 20_001)] == [
        ids["a30"],
        ids["b40"],
    ]
    assert [v.msg_id for v in harness.broker.pending(end_ms=now + 20_000)] == [ids["b10"]]
    assert [v.msg_id for v in harness.broker.pending(topic="b", start_ms=now + 10_001)] == [
        ids["b40"]
    ]


def test_pending_returns_at_most_limit(harness: Harness) -> None:
    ids = _send_spread(harness)
    assert [v.msg_id for v in harness.broker.pending(limit=2)] == [ids["b10"], ids["a20"]]
    assert [v.msg_id for v in harness.broker.pending(limit=1)] == [ids["b10"]]


@pytest.mark.parametrize("limit", [0, -1])
def test_pending_limit_below_one_is_invalid(harness: Harness, limit: int) -> None:
    with pytest.raises(InvalidArgument):
        harness.broker.pending(limit=limit)


def test_pending_drops_fired_and_aborted_messages(harness: Harness) -> None:
    ids = _send_spread(harness)
    harness.broker.abort(ids["a30"])
    harness.advance(10_000)
    wait_state(harness, ids["b10"], MessageState.READY)
    assert [v.msg_id for v in harness.broker.pending()] == [ids["a20"], ids["b40"]]


# ------------------------------------------------------------------------- consumer


def test_pull_returns_empty_after_waiting_when_nothing_is_due(harness: Harness) -> None:
    harness.broker.send(Message(T, b"x", delay_ms=60_000))
    c = harness.consumer("g", [T])
    t, box = in_thread(lambda: c.pull(max_messages=10, wait_ms=100))
    t.join(30)
    assert box == [[]]


def test_pull_with_zero_wait_returns_at_once(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    t, box = in_thread(lambda: c.pull(max_messages=10, wait_ms=0))
    t.join(30)
    assert box == [[]]


def test_pull_returns_as_soon_as_a_message_fires(harness: Harness) -> None:
    """A long poll of 60 s ends when the message fires, well before its wait is over."""
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x", delay_ms=5_000))
    t, box = in_thread(lambda: c.pull(max_messages=10, wait_ms=60_000))
    harness.advance(5_000)
    t.join(30)
    assert not t.is_alive(), "pull(wait_ms=60_000) did not return when the message fired"
    assert [m.msg_id for m in box[0]] == [r.msg_id]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_messages": 0}, {"max_messages": -1}, {"wait_ms": -1}],
    ids=["max0", "max-neg", "wait-neg"],
)
def test_pull_rejects_bad_arguments(harness: Harness, kwargs: dict[str, int]) -> None:
    c = harness.consumer("g", [T])
    with pytest.raises(InvalidArgument):
        c.pull(**kwargs)


def test_pull_takes_at_most_max_messages(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    ids = {r.msg_id for r in harness.broker.send_batch([Message(T, b"") for _ in range(5)])}
    for r in ids:
        wait_state(harness, r, MessageState.READY)
    first = c.pull(max_messages=2, wait_ms=5_000)
    assert 1 <= len(first) <= 2
    rest = pull_until(c, 5 - len(first))
    assert {m.msg_id for m in first + rest} == ids


def test_messages_of_a_topic_come_in_fire_order(harness: Harness) -> None:
    c = harness.consumer("g", [T, "other"])
    delays = list(range(1, 21))
    random.Random(7).shuffle(delays)
    by_delay = {
        d: harness.broker.send(Message(T, b"%d" % d, delay_ms=d * 1_000)).msg_id for d in delays
    }
    noise = [harness.broker.send(Message("other", b"", delay_ms=d * 1_000)) for d in delays]
    assert len(noise) == 20
    for d in range(1, 21):  # fire one second at a time so fire order is unambiguous
        harness.advance(1_000)
        wait_state(harness, by_delay[d], MessageState.READY)
    got = pull_until(c, 40, max_messages=7)
    assert [m.msg_id for m in got if m.topic == T] == [by_delay[d] for d in range(1, 21)]


def test_invisible_time_expiry_redelivers_with_same_id_and_attempts_plus_one(
    harness: Harness,
) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    r = harness.broker.send(Message(T, b"x"))
    first = pull_one(c)
    assert (first.msg_id, first.attempts) == (r.msg_id, 1)
    assert_nothing(c)  # invisible while in flight
    harness.advance(4_000)
    assert_nothing(c)
    harness.advance(1_001)
    second = pull_one(c)
    assert (second.msg_id, second.attempts, second.body) == (r.msg_id, 2, b"x")


def test_ack_returns_true_then_false(harness: Harness) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    r = harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    assert c.ack(m) is True
    assert c.ack(m) is False
    assert state_of(harness, r.msg_id) is MessageState.DONE
    harness.advance(60_000)
    assert_nothing(c)  # acked: never delivered again


def test_ack_batch_answers_per_message_like_ack(harness: Harness) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    ids = [harness.broker.send(Message(T, b"%d" % i)).msg_id for i in range(5)]
    got = pull_until(c, 5)
    assert sorted(m.msg_id for m in got) == sorted(ids)
    assert c.ack(got[0]) is True
    assert c.ack_batch([got[0], got[1], got[2]]) == [False, True, True]
    assert c.ack_batch([]) == []
    assert c.ack_batch([got[3], got[3], got[4]]) == [True, False, True]
    for msg_id in ids:
        wait_state(harness, msg_id, MessageState.DONE)
    harness.advance(60_000)
    assert_nothing(c)


def test_ack_batch_of_stale_deliveries_is_false(harness: Harness) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    harness.broker.send(Message(T, b"x"))
    old = pull_one(c)
    harness.advance(5_001)
    new = pull_one(c)
    assert c.ack_batch([old, new]) == [False, True]


def test_ack_of_a_delivery_whose_invisible_time_passed_is_false(harness: Harness) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    harness.broker.send(Message(T, b"x"))
    old = pull_one(c)
    harness.advance(5_001)
    new = pull_one(c)
    assert new.attempts == 2
    assert c.ack(old) is False
    assert c.ack(new) is True


def test_ack_nack_and_dead_letter_after_the_message_left_are_false(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    assert c.nack(m, delay_ms=60_000) is True
    assert c.ack(m) is False
    assert c.nack(m) is False
    assert c.dead_letter(m, "late") is False
    wait_state(harness, r.msg_id, MessageState.PENDING)


def test_nack_and_dead_letter_of_an_acked_message_are_false(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    assert c.ack(m)
    assert c.nack(m) is False
    assert c.dead_letter(m, "late") is False
    assert state_of(harness, r.msg_id) is MessageState.DONE


def test_nack_default_backoff_is_10s_then_30s(harness: Harness) -> None:
    assert (retry_backoff_ms(1), retry_backoff_ms(2)) == (10_000, 30_000)
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    first = pull_one(c)
    assert c.nack(first) is True
    wait_state(harness, r.msg_id, MessageState.PENDING)
    harness.advance(9_999)
    assert_nothing(c)
    harness.advance(1)
    second = pull_one(c)
    assert (second.msg_id, second.attempts) == (r.msg_id, 2)
    assert c.nack(second) is True
    harness.advance(29_999)
    assert_nothing(c)
    harness.advance(1)
    third = pull_one(c)
    assert (third.msg_id, third.attempts) == (r.msg_id, 3)


def test_nack_with_explicit_delay(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert c.nack(pull_one(c), delay_ms=5_000)
    harness.advance(4_999)
    assert_nothing(c)
    harness.advance(1)
    again = pull_one(c)
    assert (again.msg_id, again.attempts) == (r.msg_id, 2)


def test_nack_with_zero_delay_redelivers_now(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert c.nack(pull_one(c), delay_ms=0)
    again = pull_one(c)
    assert (again.msg_id, again.attempts) == (r.msg_id, 2)


def test_nack_with_negative_delay_is_invalid_and_changes_nothing(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    with pytest.raises(InvalidArgument):
        c.nack(m, delay_ms=-1)
    assert c.ack(m) is True  # still in flight here


def test_nack_retries_only_for_that_group(harness: Harness) -> None:
    a, b = harness.consumer("a", [T]), harness.consumer("b", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert a.ack(pull_one(a))
    assert b.nack(pull_one(b), delay_ms=1_000)
    harness.advance(1_000)
    again = pull_one(b)
    assert (again.msg_id, again.attempts) == (r.msg_id, 2)
    assert_nothing(a)


def test_nack_on_the_last_attempt_makes_the_message_dead(harness: Harness) -> None:
    c = harness.consumer("g", [T], max_attempts=3)
    r = harness.broker.send(Message(T, b"x"))
    for attempt in (1, 2, 3):
        m = pull_one(c)
        assert (m.msg_id, m.attempts) == (r.msg_id, attempt)
        assert c.nack(m, delay_ms=0, reason=f"boom {attempt}") is True
    wait_state(harness, r.msg_id, MessageState.DEAD)
    view = harness.broker.query(r.msg_id)
    assert view is not None
    assert (view.state, view.groups.get("g")) == (MessageState.DEAD, MessageState.DEAD)
    assert view.error is not None and "boom 3" in view.error
    eventually(lambda: group_stats(harness, "g").dead == 1, what="one dead in stats")
    harness.advance(3 * 3_600_000)
    assert_nothing(c)


def test_extend_keeps_a_message_invisible_from_now_and_its_receipt_valid(
    harness: Harness,
) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    r = harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    harness.advance(4_000)
    assert c.extend(m, 10_000) is True  # now invisible until 14 s after the pull
    harness.advance(9_999)
    assert_nothing(c)
    assert state_of(harness, r.msg_id) is MessageState.INFLIGHT
    assert c.ack(m) is True
    harness.advance(60_000)
    assert_nothing(c)
    assert state_of(harness, r.msg_id) is MessageState.DONE


def test_an_extended_message_comes_back_when_the_extension_passes(harness: Harness) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    r = harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    assert c.extend(m, 20_000) is True
    harness.advance(19_999)
    assert_nothing(c)
    harness.advance(2)
    again = pull_one(c)
    assert (again.msg_id, again.attempts) == (r.msg_id, 2)
    assert c.ack(m) is False


def test_extend_of_a_message_not_in_flight_is_false(harness: Harness) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    harness.broker.send(Message(T, b"x"))
    harness.broker.send(Message(T, b"y", delay_ms=1_000))
    acked = pull_one(c)
    assert c.ack(acked)
    assert c.extend(acked, 10_000) is False
    harness.advance(1_000)
    expired = pull_one(c)
    harness.advance(5_001)
    again = pull_one(c)  # its invisible time passed: it went back and came again
    assert again.attempts == 2
    assert c.extend(expired, 10_000) is False
    assert c.extend(again, 10_000) is True


@pytest.mark.parametrize("bad", [0, -1, 1.5, None, True])
def test_extend_with_a_bad_time_is_invalid_and_changes_nothing(harness: Harness, bad: Any) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    with pytest.raises(InvalidArgument):
        c.extend(m, bad)
    harness.advance(5_001)
    assert pull_one(c).attempts == 2  # the original invisible time still applied


def test_release_redelivers_with_the_same_attempts(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    assert c.release(m) is True
    assert c.ack(m) is False
    again = pull_one(c)  # default delay 0: back at once
    assert (again.msg_id, again.attempts, again.body) == (r.msg_id, 1, b"x")
    assert c.release(again, delay_ms=5_000) is True
    wait_state(harness, r.msg_id, MessageState.PENDING)
    harness.advance(4_999)
    assert_nothing(c)
    harness.advance(1)
    third = pull_one(c)
    assert (third.msg_id, third.attempts) == (r.msg_id, 1)
    assert c.ack(third) is True


def test_a_receipt_from_before_a_release_does_not_settle_the_next_delivery(
    harness: Harness,
) -> None:
    # Each delivery has its own receipt, also when a release counted no attempt: a late
    # ack, nack, extend or release with the old one must not touch the new delivery
    # (whoever holds it might still fail it, and an ack would lose that retry).
    c = harness.consumer("g", [T], invisible_ms=5_000)
    r = harness.broker.send(Message(T, b"x"))
    old = pull_one(c)
    assert c.release(old) is True
    again = pull_one(c)
    assert (again.msg_id, again.attempts) == (r.msg_id, 1)
    assert again.receipt != old.receipt
    assert c.ack(old) is False
    assert c.nack(old, delay_ms=0) is False
    assert c.extend(old, 60_000) is False
    assert c.release(old) is False
    wait_state(harness, r.msg_id, MessageState.INFLIGHT)
    harness.advance(5_001)  # the old extend did not stretch the new delivery
    redelivered = pull_one(c)
    assert (redelivered.msg_id, redelivered.attempts) == (r.msg_id, 2)
    assert c.ack(redelivered) is True


def test_release_never_dead_letters(harness: Harness) -> None:
    c = harness.consumer("g", [T], max_attempts=1)
    r = harness.broker.send(Message(T, b"x"))
    for _ in range(3):
        assert c.release(pull_one(c)) is True
    last = pull_one(c)
    assert (last.msg_id, last.attempts) == (r.msg_id, 1)
    assert c.nack(last, delay_ms=0) is True  # a real failure on the last attempt
    wait_state(harness, r.msg_id, MessageState.DEAD)


def test_release_of_a_message_not_in_flight_is_false(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    assert c.ack(m)
    assert c.release(m) is False


@pytest.mark.parametrize("bad", [-1, 1.5, None, True])
def test_release_with_a_bad_delay_is_invalid_and_changes_nothing(
    harness: Harness, bad: Any
) -> None:
    c = harness.consumer("g", [T], invisible_ms=5_000)
    harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    with pytest.raises(InvalidArgument):
        c.release(m, bad)
    assert c.ack(m) is True


def test_dead_letter_moves_the_message_at_once(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert c.dead_letter(pull_one(c), "unknown job") is True
    wait_state(harness, r.msg_id, MessageState.DEAD)
    harness.advance(3 * 3_600_000)
    assert_nothing(c)


def test_dead_letter_topic_can_be_consumed_by_another_group(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"payload", key="k"))
    assert c.dead_letter(pull_one(c), "bad payload")
    dlq = harness.consumer("dlq-reader", [dead_letter_topic("g")])
    got = pull_one(dlq)
    assert (got.msg_id, got.body, got.key) == (r.msg_id, b"payload", "k")
    assert dlq.ack(got) is True


def test_two_groups_on_one_topic_each_get_every_message(harness: Harness) -> None:
    a, b = harness.consumer("a", [T]), harness.consumer("b", [T])
    ids = {r.msg_id for r in harness.broker.send_batch([Message(T, b"") for _ in range(5)])}
    got_a, got_b = pull_until(a, 5), pull_until(b, 5)
    assert [m.msg_id for m in got_a] == [m.msg_id for m in got_b]
    assert {m.msg_id for m in got_a} == ids
    assert_nothing(a)
    assert_nothing(b)


def test_members_of_one_group_share_messages_without_overlap(harness: Harness) -> None:
    c1, c2 = harness.consumer("g", [T]), harness.consumer("g", [T])
    ids = {r.msg_id for r in harness.broker.send_batch([Message(T, b"") for _ in range(20)])}
    got: dict[Consumer, list[str]] = {c1: [], c2: []}
    for _ in range(100):
        if len(got[c1]) + len(got[c2]) >= 20:
            break
        for c in (c1, c2):
            got[c].extend(m.msg_id for m in c.pull(max_messages=3, wait_ms=100))
    assert not set(got[c1]) & set(got[c2])
    assert sorted(got[c1] + got[c2]) == sorted(ids)
    assert_nothing(c1)
    assert_nothing(c2)


def test_group_created_after_messages_fired_still_gets_them(harness: Harness) -> None:
    ids = [r.msg_id for r in harness.broker.send_batch([Message(T, b"") for _ in range(3)])]
    for mid in ids:
        wait_state(harness, mid, MessageState.READY)
    eventually(lambda: topic_stats(harness).fired_total == 3, what="3 fired")
    c = harness.consumer("late", [T])
    assert sorted(m.msg_id for m in pull_until(c, 3)) == sorted(ids)


def test_flow_control_by_max_inflight(harness: Harness) -> None:
    c = harness.consumer("g", [T], max_inflight=2)
    harness.broker.send_batch([Message(T, b"%d" % i) for i in range(5)])
    held = pull_greedy(c, 2)
    assert len(held) == 2
    assert c.ack(held[0])
    more = pull_greedy(c, 1)
    assert len(more) == 1


def test_pull_waits_for_room_under_flow_control(harness: Harness) -> None:
    c = harness.consumer("g", [T], max_inflight=1)
    harness.broker.send_batch([Message(T, b"1"), Message(T, b"2")])
    held = pull_one(c)
    t, box = in_thread(lambda: c.pull(max_messages=10, wait_ms=60_000))
    assert c.ack(held)
    t.join(30)
    assert not t.is_alive(), "pull did not return when room was made"
    assert [m.body for m in box[0]] == [b"2" if held.body == b"1" else b"1"]


def test_flow_control_by_max_inflight_bytes(harness: Harness) -> None:
    c = harness.consumer("g", [T], max_inflight_bytes=150)
    harness.broker.send_batch([Message(T, bytes(100)) for _ in range(5)])
    held = pull_greedy(c, 1)
    # 150 bytes of 100-byte bodies: one, or two if the limit admits the crossing one.
    assert 1 <= len(held) <= 2
    for m in held:
        assert c.ack(m)
    assert 1 <= len(pull_greedy(c, 1)) <= 2


def test_consumer_close_releases_inflight_messages_at_once(harness: Harness) -> None:
    c1 = harness.consumer("g", [T])
    r = harness.broker.send(Message(T, b"x"))
    assert pull_one(c1).attempts == 1
    c1.close()
    c2 = harness.consumer("g", [T])
    again = pull_one(c2)  # no clock advance: released at once, not after invisible time
    assert (again.msg_id, again.attempts) == (r.msg_id, 2)


def test_consumer_is_a_context_manager(harness: Harness) -> None:
    r = harness.broker.send(Message(T, b"x"))
    with harness.broker.consumer("g", [T]) as c:
        assert pull_one(c).msg_id == r.msg_id
    with pytest.raises(BrokerClosed):
        c.pull(wait_ms=0)
    again = pull_one(harness.consumer("g", [T]))
    assert (again.msg_id, again.attempts) == (r.msg_id, 2)


def test_consumer_close_twice_is_harmless_and_calls_after_raise(harness: Harness) -> None:
    c = harness.consumer("g", [T])
    harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    c.close()
    c.close()
    for call in (
        lambda: c.pull(wait_ms=0),
        lambda: c.ack(m),
        lambda: c.nack(m),
        lambda: c.dead_letter(m, "x"),
        lambda: c.extend(m, 1_000),
        lambda: c.release(m),
        lambda: c.ack_batch([m]),
    ):
        with pytest.raises(BrokerClosed):
            call()


@pytest.mark.parametrize(
    ("group", "topics"),
    [("", [T]), ("%g", [T]), ("bad group", [T]), ("g", [""]), ("g", ["a/b"]), ("g", ["%x"])],
)
def test_consumer_rejects_bad_group_or_topic(
    harness: Harness, group: str, topics: list[str]
) -> None:
    with pytest.raises(InvalidTopic):
        harness.broker.consumer(group, topics)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"invisible_ms": 0},
        {"invisible_ms": -1},
        {"max_attempts": 0},
        {"max_inflight": 0},
        {"max_inflight_bytes": 0},
        {"max_inflight": -5},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_consumer_rejects_non_positive_limits(harness: Harness, kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidArgument):
        harness.broker.consumer("g", [T], **kwargs)


# --------------------------------------------------------------------------- stats


def test_stats_counts_pending_fired_ready_inflight_dead_acked(harness: Harness) -> None:
    c = harness.consumer("g", ["s"])
    harness.broker.send_batch(
        [Message("s", b"", delay_ms=60_000) for _ in range(2)]
        + [Message("s", b"%d" % i) for i in range(4)]
    )
    eventually(lambda: topic_stats(harness, "s").fired_total == 4, what="4 fired")
    stats = harness.broker.stats()
    assert (stats.topics["s"].pending, stats.pending, stats.fired_total) == (2, 2, 4)

    first = c.pull(max_messages=1, wait_ms=5_000)
    assert len(first) == 1
    g = group_stats(harness, "g")
    assert (g.ready, g.inflight, g.dead, g.acked_total) == (3, 1, 0, 0)
    t = topic_stats(harness, "s")
    assert (t.pending, t.ready, t.inflight) == (2, 3, 1)  # per topic too

    assert c.ack(first[0])
    two = pull_until(c, 2, max_messages=2)
    assert c.dead_letter(two[0], "bad")
    assert c.nack(two[1])  # back on the wheel for 10 s: pending again (retries included)
    eventually(lambda: harness.broker.stats().dead == 1, what="one dead")
    g = group_stats(harness, "g")
    assert (g.ready, g.inflight, g.dead, g.acked_total) == (1, 0, 1, 1)
    assert harness.broker.stats().pending == 3


# --------------------------------------------------------------------------- close


CLOSED_CALLS: dict[str, Callable[[Any, Consumer, ReceivedMessage], object]] = {
    "send": lambda b, c, m: b.send(Message(T, b"")),
    "send_batch": lambda b, c, m: b.send_batch([Message(T, b"")]),
    "send_async": lambda b, c, m: b.send_async(Message(T, b""), lambda r, e: None),
    "send_oneway": lambda b, c, m: b.send_oneway(Message(T, b"")),
    "flush": lambda b, c, m: b.flush(),
    "abort": lambda b, c, m: b.abort(m.msg_id),
    "abort_key": lambda b, c, m: b.abort(key="k", topic=T),
    "query": lambda b, c, m: b.query(m.msg_id),
    "pending": lambda b, c, m: b.pending(),
    "consumer": lambda b, c, m: b.consumer("g2", [T]),
    "stats": lambda b, c, m: b.stats(),
    "consumer.pull": lambda b, c, m: c.pull(wait_ms=0),
    "consumer.ack": lambda b, c, m: c.ack(m),
    "consumer.nack": lambda b, c, m: c.nack(m),
    "consumer.dead_letter": lambda b, c, m: c.dead_letter(m, "x"),
}


@pytest.mark.parametrize("call", list(CLOSED_CALLS))
def test_calls_after_close_raise_broker_closed(harness: Harness, call: str) -> None:
    c = harness.consumer("g", [T])
    harness.broker.send(Message(T, b"x"))
    m = pull_one(c)
    harness.broker.close()
    with pytest.raises(BrokerClosed):
        CLOSED_CALLS[call](harness.broker, c, m)


def test_close_twice_is_harmless(harness: Harness) -> None:
    harness.broker.close()
    harness.broker.close()
    with pytest.raises(BrokerClosed):
        harness.broker.stats()


def test_broker_is_a_context_manager(harness: Harness) -> None:
    with harness.broker as b:
        r = b.send(Message(T, b"x", delay_ms=1_000))
    with pytest.raises(BrokerClosed):
        b.query(r.msg_id)
    harness.reopen()
    assert state_of(harness, r.msg_id) is MessageState.PENDING


def test_close_flushes_one_way_sends(harness: Harness) -> None:
    for i in range(20):
        harness.broker.send_oneway(Message(T, b"%d" % i, delay_ms=1_000))
    harness.reopen()  # close() first, then open the same data again
    assert len(harness.broker.pending(topic=T)) == 20
