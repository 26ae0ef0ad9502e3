"""AdapterBase and broker_adapter.checks: what the base owns for every adapter.

The conformance suite runs the real adapters through the base; these tests pin
the base's own rules with a recording adapter (a double, in addition to the
real ones): checks happen before any primitive runs, a closed broker refuses
everything, async and one-way sends are batched and flushed, close is once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from broker_adapter.adapter import AdapterBase, ConsumerLimits, check_messages
from broker_adapter.base import DEFAULT_MAX_BODY_BYTES, Consumer
from broker_adapter.checks import NewDue, check_int, is_int
from broker_adapter.errors import (
    BrokerClosed,
    InvalidArgument,
    InvalidDelay,
    InvalidTopic,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    DeadLetterPage,
    MessageView,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
    SendResult,
    SendStatus,
)


class RecordingAdapter(AdapterBase):
    """Stores sends in a list and records which primitive ran with what."""

    def __init__(self, max_body_bytes: int = 100) -> None:
        self.max_body_bytes = max_body_bytes
        self.calls: list[tuple[str, object]] = []
        self.stored: list[Message] = []
        self.lock = threading.Lock()

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        with self.lock:
            self.calls.append(("send", len(messages)))
            self.stored.extend(messages)
            return [SendResult(SendStatus.OK, str(i), 0) for i, _ in enumerate(messages)]

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        self.calls.append(("abort", (msg_id, key, topic)))
        return AbortResult(AbortStatus.NOT_FOUND, msg_id)

    def _query(self, msg_id: str) -> MessageView | None:
        self.calls.append(("query", msg_id))
        return None

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        self.calls.append(("pending", (topic, start_ms, end_ms, limit)))
        return []

    def _consumer(self, group: str, topics: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        self.calls.append(("consumer", (group, topics, limits)))
        raise NotImplementedError("not needed here")

    def _stats(self) -> BrokerStats:
        self.calls.append(("stats", None))
        return BrokerStats(topics={}, groups={})

    def _close(self) -> None:
        self.calls.append(("close", None))

    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        self.calls.append(("reschedule", (msg_id, key, topic, due, body)))
        return RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        self.calls.append(("abort_prefix", (topic, key_prefix)))
        return PrefixAbortResult(0)

    def _find_pending(
        self,
        topic: str | None,
        key_prefix: str | None,
        tag: str | None,
        start_ms: int | None,
        end_ms: int | None,
        limit: int,
        cursor: str | None,
        with_body: bool,
    ) -> PendingPage:
        args = (topic, key_prefix, tag, start_ms, end_ms, limit, cursor, with_body)
        self.calls.append(("find_pending", args))
        return PendingPage([], None)

    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        self.calls.append(("acquire_rate", (bucket, limit, period_ms)))
        return 0

    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        self.calls.append(("acquire_slot", (name, limit, holder, lease_ms)))
        return True

    def _release_slot(self, name: str, holder: str) -> bool:
        self.calls.append(("release_slot", (name, holder)))
        return True

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        self.calls.append(("dead_letters", (group, cursor, limit, with_body)))
        return DeadLetterPage([], None)

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        self.calls.append(("requeue_dead", (group, msg_ids, limit)))
        return 0

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        self.calls.append(("purge_dead", (group, msg_ids, limit)))
        return 0

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        self.calls.append(("count_pending", (edges, topic)))
        return PendingCounts([0] * (len(edges) - 1))


def test_is_int_refuses_bools_and_checks_bounds() -> None:
    assert is_int(0) and is_int(5, 1) and is_int(5, 1, 5)
    assert not is_int(True) and not is_int(False, 0)
    assert not is_int(1.0) and not is_int("1") and not is_int(None)
    assert not is_int(0, 1) and not is_int(6, 1, 5)


def test_check_int_names_the_argument_and_the_range() -> None:
    assert check_int("n", 3) == 3
    with pytest.raises(InvalidArgument, match=r"n must be an int >= 1, got 0"):
        check_int("n", 0)
    with pytest.raises(InvalidArgument, match=r"wait_ms must be an int >= 0, got True"):
        check_int("wait_ms", True, minimum=0)
    with pytest.raises(InvalidArgument, match=r"level must be an int from 1 to 18, got 19"):
        check_int("level", 19, 1, 18)


def test_an_adapter_without_a_primitive_cannot_be_made() -> None:
    class Partial(AdapterBase):
        def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
            return []

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]


def test_checks_run_before_any_primitive() -> None:
    broker = RecordingAdapter(max_body_bytes=10)
    with pytest.raises(InvalidArgument, match="Message objects"):
        broker.send_batch([Message("t", b"ok"), b"not a message"])  # type: ignore[list-item]
    with pytest.raises(MessageTooLarge):
        broker.send_batch([Message("t", b"ok"), Message("t", b"x" * 11)])
    with pytest.raises(MessageTooLarge):  # properties weigh too
        broker.send(Message("t", b"12345", properties={"k": "v"}))
    with pytest.raises(InvalidArgument, match="abort takes"):
        broker.abort("id", key="k", topic="t")
    with pytest.raises(InvalidArgument, match="limit"):
        broker.pending(limit=0)
    with pytest.raises(InvalidArgument, match="max_inflight"):
        broker.consumer("g", ["t"], max_inflight=0)
    with pytest.raises(InvalidTopic):
        broker.consumer("bad group!", ["t"])
    with pytest.raises(InvalidArgument, match="at least one topic"):
        broker.consumer("g", [])
    assert broker.calls == [] and broker.stored == []


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda b: b.reschedule("id"), InvalidArgument),  # no timing
        (lambda b: b.reschedule("id", delay_ms=1, deliver_at_ms=1), InvalidArgument),
        (lambda b: b.reschedule(key="k", delay_ms=1), InvalidArgument),  # key without topic
        (lambda b: b.reschedule("id", key="k", topic="t", delay_ms=1), InvalidArgument),
        (lambda b: b.reschedule("id", delay_ms=-1), InvalidDelay),
        (lambda b: b.reschedule("id", delay_ms=True), InvalidDelay),
        (lambda b: b.reschedule("id", delay_ms=1, body="text"), InvalidArgument),
        (lambda b: b.reschedule("id", delay_ms=1, body=b"x" * 11), MessageTooLarge),
        (lambda b: b.reschedule(key="k", topic="bad topic", delay_ms=1), InvalidTopic),
        (lambda b: b.abort_prefix("t", ""), InvalidArgument),
        (lambda b: b.abort_prefix("t", None), InvalidArgument),
        (lambda b: b.abort_prefix("%DLQ%g", "a"), InvalidTopic),
        (lambda b: b.find_pending(key_prefix="a"), InvalidArgument),
        (lambda b: b.find_pending("t", limit=0), InvalidArgument),
        (lambda b: b.find_pending("t", tag=""), InvalidArgument),
        (lambda b: b.find_pending("t", start_ms=-1), InvalidArgument),
        (lambda b: b.find_pending("t", cursor=""), InvalidArgument),
        (lambda b: b.acquire_rate("", 1, 1), InvalidArgument),
        (lambda b: b.acquire_rate("b", 0, 1), InvalidArgument),
        (lambda b: b.acquire_slot("s", 1, "", 1), InvalidArgument),
        (lambda b: b.acquire_slot("s", 1, "h", 0), InvalidArgument),
        (lambda b: b.release_slot("s", "x" * 513), InvalidArgument),
    ],
)
def test_runtime_calls_are_checked_before_any_primitive(call: object, error: type) -> None:
    broker = RecordingAdapter(max_body_bytes=10)
    with pytest.raises(error):
        call(broker)  # type: ignore[operator]
    assert broker.calls == []


def test_runtime_primitives_get_checked_arguments() -> None:
    broker = RecordingAdapter()
    broker.reschedule(key="k", topic="t", deliver_at_ms=5, body=b"b")
    broker.abort_prefix("t", "order:")
    broker.find_pending("t", key_prefix="o", with_body=1)  # type: ignore[arg-type]
    broker.acquire_rate("b", 2, 1_000)
    broker.acquire_slot("s", 1, "h", 500)
    broker.release_slot("s", "h")
    assert broker.calls == [
        ("reschedule", (None, "k", "t", NewDue(None, 5), b"b")),
        ("abort_prefix", ("t", "order:")),
        ("find_pending", ("t", "o", None, None, None, 100, None, True)),
        ("acquire_rate", ("b", 2, 1_000)),
        ("acquire_slot", ("s", 1, "h", 500)),
        ("release_slot", ("s", "h")),
    ]


def test_primitives_get_checked_arguments() -> None:
    broker = RecordingAdapter()
    assert broker.send_batch([]) == []
    broker.send(Message("t", b"a"))
    broker.abort(key="k", topic="t")
    broker.pending(topic="t", limit=5)
    with pytest.raises(NotImplementedError):
        broker.consumer("g", ["t", "u", "t"], invisible_ms=5_000)
    assert broker.calls == [
        ("send", 1),
        ("abort", (None, "k", "t")),
        ("pending", ("t", None, None, 5)),
        ("consumer", ("g", ("t", "u"), ConsumerLimits(invisible_ms=5_000))),
    ]


def test_async_and_oneway_sends_are_batched_and_flushed() -> None:
    broker = RecordingAdapter()
    results: list[SendResult | None] = []
    done = threading.Event()

    def callback(result: SendResult | None, error: BaseException | None) -> None:
        assert error is None
        results.append(result)
        if len(results) == 50:
            done.set()

    for i in range(50):
        broker.send_async(Message("t", b"%d" % i), callback)
        broker.send_oneway(Message("t", b"one-way %d" % i))
    broker.flush(10)
    assert done.wait(10)
    assert len(broker.stored) == 100
    assert sum(n for op, n in broker.calls if op == "send") == 100  # type: ignore[misc]


def test_oneway_refusals_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    broker = RecordingAdapter(max_body_bytes=4)
    with caplog.at_level(logging.WARNING, "chronoq.broker_adapter.AdapterBase"):
        broker.send_oneway(Message("t", b"too large"))
        broker.send_oneway("not a message")  # type: ignore[arg-type]
    assert len([r for r in caplog.records if "one-way send refused" in r.message]) == 2
    with pytest.raises(MessageTooLarge):  # an async send says so at once
        broker.send_async(Message("t", b"too large"), lambda r, e: None)
    broker.flush(1)
    assert broker.stored == []


def test_close_completes_queued_sends_then_refuses_everything() -> None:
    broker = RecordingAdapter()
    for i in range(20):
        broker.send_oneway(Message("t", b"%d" % i))
    broker.close()
    broker.close()  # twice is harmless
    assert len(broker.stored) == 20
    assert [op for op, _ in broker.calls].count("close") == 1
    assert broker.closed
    for call in (
        lambda: broker.send(Message("t", b"x")),
        lambda: broker.send_batch([]),
        lambda: broker.send_async(Message("t", b"x"), lambda r, e: None),
        lambda: broker.send_oneway(Message("t", b"x")),
        lambda: broker.flush(),
        lambda: broker.abort("id"),
        lambda: broker.query("id"),
        lambda: broker.pending(),
        lambda: broker.consumer("g", ["t"]),
        lambda: broker.stats(),
    ):
        with pytest.raises(BrokerClosed, match="RecordingAdapter is closed"):
            call()


def test_check_messages_uses_the_shared_default_limit() -> None:
    check_messages([Message("t", b"x" * DEFAULT_MAX_BODY_BYTES)], DEFAULT_MAX_BODY_BYTES)
    with pytest.raises(MessageTooLarge):
        check_messages([Message("t", b"x" * (DEFAULT_MAX_BODY_BYTES + 1))], DEFAULT_MAX_BODY_BYTES)
    check_messages([Message("t", b"x" * (DEFAULT_MAX_BODY_BYTES + 1))], None)  # adapter checks


def test_dead_letter_and_count_calls_are_checked_before_any_primitive() -> None:
    broker = RecordingAdapter()
    loose: Any = broker  # calls with wrong types on purpose
    bad: list[Callable[[], object]] = [
        lambda: broker.dead_letters("bad name"),
        lambda: broker.dead_letters("g", limit=0),
        lambda: broker.dead_letters("g", cursor=""),
        lambda: loose.requeue_dead("g", "one-id"),
        lambda: loose.requeue_dead("g", [1]),
        lambda: broker.purge_dead("g", ["a", "b"], limit=1),
        lambda: broker.count_pending([5, 5]),
        lambda: broker.count_pending([1]),
        lambda: broker.count_pending([0, 1], topic="%DLQ%g"),
    ]
    for call in bad:
        with pytest.raises((InvalidArgument, InvalidTopic)):
            call()
    assert broker.calls == []
    loose.dead_letters("g", cursor="c", limit=5, with_body=1)
    broker.requeue_dead("g", ["a", "a", "b"])
    broker.purge_dead("g", limit=3)
    broker.count_pending([0, 10, 20], topic="t")
    assert broker.calls == [
        ("dead_letters", ("g", "c", 5, True)),
        ("requeue_dead", ("g", ("a", "b"), 1000)),
        ("purge_dead", ("g", None, 3)),
        ("count_pending", ((0, 10, 20), "t")),
    ]
