"""AdapterBase and broker_adapter.checks: what the base owns for every adapter.

The conformance suite runs the real adapters through the base; these tests pin
the base's own rules with a recording adapter (a double, in addition to the
real ones): checks happen before any primitive runs, a closed broker refuses
everything, async and one-way sends are batched and flushed, close is once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest

from broker_adapter.adapter import AdapterBase, ConsumerLimits, check_messages
from broker_adapter.base import DEFAULT_MAX_BODY_BYTES, Consumer
from broker_adapter.checks import check_int, is_int
from broker_adapter.errors import BrokerClosed, InvalidArgument, InvalidTopic, MessageTooLarge
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    MessageView,
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
