"""The parts under a :class:`~broker_adapter.server.link.Link`: its socket
(:class:`~broker_adapter.server.link_socket.LinkSocket`) and its queue of acks written
without waiting (:class:`~broker_adapter.server.ack_queue.AckQueue`), driven by hand
against a real server subprocess."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

import pytest

from broker_adapter.adapter import ConsumerLimits
from broker_adapter.errors import ConnectionFailed
from broker_adapter.message import Message
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V
from broker_adapter.server.ack_queue import ACK_BUSY_S, ACK_WRITE_DELAY_S, AckQueue
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.link_socket import LinkSocket
from tests.helpers import eventually
from tests.server.serverproc import ServerProcess

Pending = dict[int, Any]


def _answers(sock: LinkSocket, *rids: int) -> list[P.Response]:
    """Read until the answers to ``rids`` came (10 s at most); them, in that order."""
    got: dict[int, P.Response] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(rid in got for rid in rids):
        for payload in sock.read(deadline):
            resp = P.decode_response(payload)
            got[resp.rid] = resp
    missing = [rid for rid in rids if rid not in got]
    assert not missing, f"no answer to requests {missing} within 10 s"
    return [got[rid] for rid in rids]


def _call(sock: LinkSocket, rid: int, op: str, args: dict[str, Any]) -> Any:
    sock.sendall(P.request(rid, op, args))
    (resp,) = _answers(sock, rid)
    assert resp.ok, P.decode_error(resp.result)
    return resp.result


def _open(server: ServerProcess) -> LinkSocket:
    return LinkSocket("127.0.0.1", server.port, server.token, 3.0, 0.02)


def test_a_link_socket_says_hello_then_carries_requests_and_answers(
    manual_server: ServerProcess,
) -> None:
    sock = _open(manual_server)
    try:
        assert sock.address == f"127.0.0.1:{manual_server.port}"
        assert sock.hello.node == manual_server.node
        assert sock.read(time.monotonic() - 1) == []  # past its deadline: no wait, nothing
        assert sock.read(None) == []  # nothing within the read slice
        m = V.encode_message(Message("parts", b"x", delay_ms=1_000))
        sock.sendall(P.request(1, "send", {"m": m}) + P.request(2, "stats", {}))
        sent, stats = _answers(sock, 1, 2)
        assert sent.ok
        assert stats.result["topics"]["parts"][0] == 1
    finally:
        sock.close()


def test_a_link_socket_reports_a_server_that_went_away(manual_server: ServerProcess) -> None:
    sock = _open(manual_server)
    try:
        manual_server.kill()

        def gone() -> bool:
            try:
                sock.read(None)
            except ConnectionFailed:
                return True
            return False

        eventually(gone, what="the read to fail once the server is killed")
        sock.shutdown()
        sock.shutdown()  # twice: no error
    finally:
        sock.close()


def test_acks_queue_per_consumer_and_leave_as_one_ack_batch_each() -> None:
    q = AckQueue(threading.Lock(), "nowhere")
    assert not q
    assert q.add(1, b"a") is True
    assert q.add(2, b"b") is False
    assert q.add(1, b"c") is False
    assert q
    pending: Pending = {}
    frames = q.take_frames(itertools.count(7), pending)
    assert not q
    assert [P.decode_request(f[P.HEADER.size :]) for f in frames] == [
        P.Request(7, "ack_batch", {"cid": 1, "receipts": [b"a", b"c"]}),
        P.Request(8, "ack_batch", {"cid": 2, "receipts": [b"b"]}),
    ]
    assert sorted(pending) == [7, 8]
    assert q.batches == 2
    pending[7]([True, True], None)
    pending[8](None, ConnectionFailed("gone"))
    assert q.batches == 0


def test_dropped_acks_leave_no_frame() -> None:
    q = AckQueue(threading.Lock(), "nowhere")
    q.add(1, b"a")
    q.drop()
    pending: Pending = {}
    assert not q
    assert q.take_frames(itertools.count(1), pending) == []
    assert pending == {}
    assert q.batches == 0


def test_the_background_reader_times_acks_only_while_they_flow() -> None:
    q = AckQueue(threading.Lock(), "nowhere")
    assert q.wait_s(100.0) is None  # nothing queued, none lately
    q.add(1, b"a")
    due = q.arm(100.0)
    assert due == pytest.approx(100.0 + ACK_WRITE_DELAY_S)
    assert q.wait_s(100.0) == pytest.approx(ACK_WRITE_DELAY_S)
    wait = q.wait_s(due)
    assert wait is not None and wait <= 0  # due: write now
    q.take_frames(itertools.count(1), {})
    # Written, but acks flow: look again soon rather than be woken for the next batch.
    assert q.wait_s(100.0 + ACK_BUSY_S / 2) == ACK_WRITE_DELAY_S
    assert q.wait_s(100.0 + 2 * ACK_BUSY_S) is None


def test_a_server_applies_the_queued_acks_and_answers_late_ones_false(
    manual_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="chronoq.broker_adapter.Link")
    limits = ConsumerLimits()
    sock = _open(manual_server)
    try:
        _call(sock, 1, "send", {"m": V.encode_message(Message("parts", b"x"))})
        cid = _call(
            sock,
            2,
            "consumer_open",
            {
                "group": "g",
                "topics": ["parts"],
                "invisible_ms": limits.invisible_ms,
                "max_attempts": limits.max_attempts,
                "max_inflight": limits.max_inflight,
                "max_inflight_bytes": limits.max_inflight_bytes,
            },
        )
        pulled = _call(sock, 3, "pull", {"cid": cid, "max": 1, "wait": 1000})
        assert len(pulled) == 1
        receipt = V.decode_received(pulled[0]).receipt
        q = AckQueue(threading.Lock(), sock.address)
        rids = itertools.count(10)
        pending: Pending = {}
        for _ in range(2):  # the same ack twice: the second comes too late
            q.add(cid, receipt)
            (frame,) = q.take_frames(rids, pending)
            sock.sendall(frame)
        for rid, resp in zip((10, 11), _answers(sock, 10, 11), strict=True):
            assert resp.ok
            pending.pop(rid)(resp.result, None)
        assert q.batches == 0
    finally:
        sock.close()
    assert "1 acks to 127.0.0.1" in caplog.text and "came too late" in caplog.text
    with RemoteBroker.from_url(manual_server.url) as broker:
        group = broker.stats().groups["g"]
        assert (group.inflight, group.acked_total) == (0, 1)
