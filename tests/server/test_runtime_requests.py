"""The runtime calls as data (:mod:`broker_adapter.server.runtime_requests`), stepped
by hand: which requests go to which endpoint, and how the replies merge.

The real clients drive these same calls against real servers in
tests/server/test_runtime_multi.py and the conformance suite; here each call runs
over plain endpoint records so the merges are checked reply by reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from broker_adapter.checks import NewDue
from broker_adapter.errors import MessageTooLarge, UnknownTopic
from broker_adapter.results import (
    MessageState,
    MessageView,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)
from broker_adapter.server import runtime_requests as RQ
from broker_adapter.server import values as V


@dataclass
class Ep:
    """An endpoint as the merges see it: its node id."""

    node: str


def drive(
    steps: RQ.Steps[Ep, Any], answer: Callable[[RQ.Request[Ep]], Any]
) -> tuple[Any, list[RQ.Request[Ep]]]:
    """Run ``steps`` with ``answer`` as every server; the result and the requests sent."""
    sent: list[RQ.Request[Ep]] = []

    def send(request: RQ.Request[Ep]) -> Any:
        sent.append(request)
        return answer(request)

    run = RQ.Run(steps)
    while run.request is not None:
        run.call(send)
    return run.result, sent


def view(msg_id: str, due: int) -> MessageView:
    return MessageView(msg_id, "t", MessageState.PENDING, due, 0)


def test_a_prefix_abort_sums_every_endpoint_and_skips_one_without_the_topic() -> None:
    a, b, c = Ep("a"), Ep("b"), Ep("c")

    def answer(r: RQ.Request[Ep]) -> Any:
        if r.ep is b:
            raise UnknownTopic("t")
        return V.encode_prefix_abort(PrefixAbortResult(2 if r.ep is a else 3, ("k",), 1))

    result, sent = drive(RQ.abort_prefix([a, b, c], "t", "p:"), answer)
    assert result.aborted == 5
    assert result.already_delivered_count == 2
    assert [r.ep for r in sent] == [a, b, c]
    assert all(r.timeout_s == RQ.ABORT_PREFIX_TIMEOUT_S for r in sent)


def test_a_prefix_abort_on_a_topic_no_endpoint_knows_raises_unknown_topic() -> None:
    def answer(r: RQ.Request[Ep]) -> Any:
        raise UnknownTopic("t")

    with pytest.raises(UnknownTopic):
        drive(RQ.abort_prefix([Ep("a"), Ep("b")], "t", "p:"), answer)


def test_an_error_other_than_unknown_topic_leaves_the_call_as_raised() -> None:
    def answer(r: RQ.Request[Ep]) -> Any:
        raise MessageTooLarge(10, 5)

    with pytest.raises(MessageTooLarge):
        drive(RQ.abort_prefix([Ep("a"), Ep("b")], "t", "p:"), answer)


def test_a_reschedule_by_key_stops_at_the_first_taker_and_tags_its_id() -> None:
    a, b = Ep("a"), Ep("b")
    due = NewDue(1000, None)

    def answer(r: RQ.Request[Ep]) -> Any:
        return V.encode_reschedule(
            RescheduleResult(RescheduleStatus.RESCHEDULED, "42", 5000)
            if r.ep is a
            else RescheduleResult(RescheduleStatus.NOT_FOUND, None, None)
        )

    def tag(ep: Ep, msg_id: str) -> str:
        return f"{ep.node}:{msg_id}"

    steps = RQ.reschedule([(a, ""), (b, "")], None, "k", "t", due, b"xyz", tag)
    result, sent = drive(steps, answer)
    assert result.status is RescheduleStatus.RESCHEDULED
    assert result.msg_id == "a:42"
    assert len(sent) == 1
    assert sent[0].args == {"key": "k", "topic": "t", "delay": 1000, "at": None, "body": b"xyz"}
    assert sent[0].body_len == 3
    with pytest.raises(MessageTooLarge):
        RQ.check_body(sent[0], 2)
    RQ.check_body(sent[0], 3)


def test_find_pending_merges_two_endpoints_in_due_order_and_tags_ids() -> None:
    a, b = Ep("a"), Ep("b")
    pages = {
        "a": PendingPage([view("1", 10), view("2", 30)], None),
        "b": PendingPage([view("1", 20), view("2", 40)], None),
    }

    def answer(r: RQ.Request[Ep]) -> Any:
        return V.encode_page(pages[r.ep.node])

    args = RQ.find_args("t", None, None, None, None, 10, False)
    page, sent = drive(RQ.find_pending([a, b], True, args, 10, None), answer)
    assert [(m.msg_id, m.deliver_at_ms) for m in page.messages] == [
        ("a:1", 10),
        ("b:1", 20),
        ("a:2", 30),
        ("b:2", 40),
    ]
    assert page.cursor is None
    assert [r.args["cursor"] for r in sent] == [None, None]


def test_find_pending_raises_unknown_topic_only_when_no_endpoint_knows_it() -> None:
    a, b = Ep("a"), Ep("b")

    def some(r: RQ.Request[Ep]) -> Any:
        if r.ep is a:
            raise UnknownTopic("t")
        return V.encode_page(PendingPage([view("1", 10)], None))

    args = RQ.find_args("t", None, None, None, None, 10, False)
    page, _ = drive(RQ.find_pending([a, b], True, args, 10, None), some)
    assert [m.msg_id for m in page.messages] == ["b:1"]

    def none(r: RQ.Request[Ep]) -> Any:
        raise UnknownTopic("t")

    with pytest.raises(UnknownTopic):
        drive(RQ.find_pending([a, b], True, args, 10, None), none)


def test_dead_letters_do_not_absorb_an_unknown_topic() -> None:
    def answer(r: RQ.Request[Ep]) -> Any:
        raise UnknownTopic("t")

    with pytest.raises(UnknownTopic):
        drive(RQ.dead_letters([Ep("a"), Ep("b")], True, "g", None, 10, False), answer)


def test_settling_without_ids_stops_asking_once_the_limit_is_reached() -> None:
    a, b = Ep("a"), Ep("b")
    done, sent = drive(RQ.settle_dead([a, b], "purge_dead", "g", None, 5), lambda r: 5)
    assert done == 5
    assert [r.ep for r in sent] == [a]
    assert sent[0].args == {"group": "g", "ids": None, "limit": 5}

    done, sent = drive(RQ.settle_dead([a, b], "purge_dead", "g", None, 5), lambda r: 2)
    assert done == 4
    assert [r.args["limit"] for r in sent] == [5, 3]


def test_settling_ids_sends_each_endpoint_its_own_ids_once() -> None:
    a, b = Ep("a"), Ep("b")
    plan = RQ.ids_by_endpoint([[(a, "1")], [(b, "2")], [(a, "3")]])
    done, sent = drive(RQ.settle_dead([a, b], "requeue_dead", "g", plan, 9), lambda r: 1)
    assert done == 2
    assert [(r.ep, r.args["ids"]) for r in sent] == [(a, ["1", "3"]), (b, ["2"])]


def test_pending_counts_add_up_and_are_exact_only_if_all_are() -> None:
    replies = iter([PendingCounts([1, 2], True), PendingCounts([3, 4], False)])
    counts, _ = drive(
        RQ.count_pending([Ep("a"), Ep("b")], (10,), "t"),
        lambda r: V.encode_counts(next(replies)),
    )
    assert counts == PendingCounts([4, 6], False)


def test_a_call_with_nothing_to_send_has_its_result_at_once() -> None:
    result, sent = drive(RQ.count_pending([], (10,), None), lambda r: None)
    assert sent == []
    assert result == PendingCounts([], True)
