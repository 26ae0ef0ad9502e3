"""The protocol against a live server: batch requests, pipelining, test-only requests."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from broker_adapter.errors import InvalidArgument, InvalidTopic
from broker_adapter.message import Message
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V
from broker_adapter.server.client import RemoteBroker
from tests.server.serverproc import ServerProcess


def test_a_batch_request_runs_each_member_and_answers_each(
    manual_server: ServerProcess,
) -> None:
    link = manual_server.link()
    try:
        good = V.encode_message(Message("b", b"x", delay_ms=1_000))
        bad = ["", b"x", None, None, None, None, None, None, None]
        answers = link.call(
            "batch", {"reqs": [["send", {"m": good}], ["send", {"m": bad}], ["stats", {}]]}, 30
        )
    finally:
        link.close()
    assert [a[0] for a in answers] == [P.OK, P.ERROR, P.OK]
    assert V.decode_result(answers[0][1]).status.value == "OK"
    assert isinstance(P.decode_error(answers[1][1]), InvalidTopic)
    assert answers[2][1]["topics"]["b"][0] == 1  # one pending: the bad one stored nothing


def test_pipelined_requests_are_all_answered_by_id(manual_server: ServerProcess) -> None:
    link = manual_server.link()
    results: dict[int, Any] = {}
    done = threading.Event()
    n = 200

    def answer(i: int) -> Any:
        def record(result: Any, error: BaseException | None) -> None:
            results[i] = (result, error)
            if len(results) == n:
                done.set()

        return record

    try:
        for i in range(n):
            m = V.encode_message(Message("pipe", b"%d" % i, delay_ms=1_000 + i))
            link.submit("send", {"m": m}, answer(i))
        assert done.wait(30)
    finally:
        link.close()
    dues = [V.decode_result(results[i][0]).deliver_at_ms for i in range(n)]
    assert dues == [dues[0] + i for i in range(n)]  # each answer matched its own request
    with RemoteBroker.from_url(manual_server.url) as b:
        assert b.stats().topics["pipe"].pending == n


@pytest.mark.parametrize(("op", "args"), [("advance", {"ms": 1}), ("reset", {"start_ms": 0})])
def test_test_only_requests_are_refused_without_manual_clock(
    server: ServerProcess, op: str, args: dict[str, int]
) -> None:
    with RemoteBroker.from_url(server.url) as b:
        b.send(Message("kept", b"x", delay_ms=60_000))
    with pytest.raises(InvalidArgument, match="test-only"):
        server.admin(op, **args)
    with RemoteBroker.from_url(server.url) as b:
        assert b.stats().topics["kept"].pending == 1


def test_advance_moves_the_manual_clock_forward_only(manual_server: ServerProcess) -> None:
    now = manual_server.admin("advance", ms=0)
    assert manual_server.admin("advance", ms=1_000) == now + 1_000
    assert manual_server.admin("advance", to_ms=now + 5_000) == now + 5_000
    with pytest.raises(InvalidArgument):
        manual_server.admin("advance", to_ms=now)
