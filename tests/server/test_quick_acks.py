"""Acks a RemoteConsumer answers itself (issue 16): written without waiting, batched,
and always applied by the server before the next request of the same process."""

from __future__ import annotations

import os
import signal
import threading

from broker_adapter.message import Message
from broker_adapter.results import MessageState
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.stage_log import StageLog
from tests.helpers import eventually, pull_one, pull_until
from tests.server.serverproc import ServerProcess


def _group(broker: RemoteBroker, group: str) -> tuple[int, int]:
    """``(inflight, acked_total)`` of ``group`` by the broker's stats."""
    g = broker.stats().groups[group]
    return g.inflight, g.acked_total


def test_an_ack_of_a_held_message_needs_no_answer_from_the_server(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        c = broker.consumer("g", ["t"])
        broker.send(Message("t", b"x"))
        m = pull_one(c)
        box: list[bool] = []
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # the server answers nothing now
        try:
            t = threading.Thread(target=lambda: box.append(c.ack(m)), daemon=True)
            t.start()
            t.join(10)
            assert box == [True]
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert _group(broker, "g") == (0, 1)  # applied before the stats request


def test_acks_from_many_threads_are_all_applied_before_the_next_request(
    server: ServerProcess,
) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        c = broker.consumer("g", ["t"], max_inflight=1000)
        broker.send_batch([Message("t", b"%d" % i) for i in range(400)])
        got = pull_until(c, 400, max_messages=100)
        assert len(got) == 400
        results: list[bool] = []

        def ack_all(part: list[object]) -> None:
            results.extend(c.ack(m) for m in part)  # type: ignore[arg-type]

        threads = [threading.Thread(target=ack_all, args=(got[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [True] * 400
        assert _group(broker, "g") == (0, 400)
        assert c.pull(10, 100) == []


def test_a_second_ack_and_an_ack_after_a_nack_answer_false(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        c = broker.consumer("g", ["t"])
        broker.send_batch([Message("t", b"a"), Message("t", b"b"), Message("t", b"c")])
        a, b, d = pull_until(c, 3)
        assert c.ack(a) is True
        assert c.ack(a) is False
        assert c.ack_batch([b, b]) == [True, False]
        assert c.nack(d, delay_ms=60_000) is True
        assert c.ack(d) is False
        assert _group(broker, "g")[1] == 2


def test_an_ack_past_the_invisible_time_asks_the_server(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        # The invisible time is the group's: both members get the short one.
        slow = broker.consumer("g", ["t"], invisible_ms=1_200)
        other = broker.consumer("g", ["t"], invisible_ms=1_200)
        broker.send(Message("t", b"x"))
        m = pull_one(slow)
        again = pull_one(other, timeout=20)  # its invisible time passed: delivered again
        assert (again.msg_id, again.attempts) == (m.msg_id, 2)
        assert slow.ack(m) is False
        assert other.ack(again) is True


def test_another_client_sees_the_ack(server: ServerProcess) -> None:
    with RemoteBroker.from_url(server.url) as broker, RemoteBroker.from_url(server.url) as watcher:
        c = broker.consumer("g", ["t"])
        r = broker.send(Message("t", b"x"))
        assert c.ack(pull_one(c)) is True
        eventually(lambda: _group(watcher, "g") == (0, 1), what="the ack reached the server")
        view = watcher.query(r.msg_id)
        assert view is not None and view.state is MessageState.DONE


def test_a_consumer_closed_after_acks_leaves_nothing_to_deliver_again(
    server: ServerProcess,
) -> None:
    with RemoteBroker.from_url(server.url) as broker:
        c = broker.consumer("g", ["t"], invisible_ms=1_500)
        broker.send_batch([Message("t", b"%d" % i) for i in range(50)])
        for m in pull_until(c, 50):
            assert c.ack(m)
        c.close()
        again = broker.consumer("g", ["t"], invisible_ms=1_500)
        assert again.pull(50, 2_000) == []  # past the invisible time: nothing came back


def test_the_stage_log_maps_each_message_to_its_answer() -> None:
    log = StageLog()
    log.written(["a", "b"])
    log.written([])
    log.written(["c"])
    log.read(1.5, True, iter(["a"]))
    log.read(2.5, False, iter(["b", "c"]))
    written = log.write_times()
    assert sorted(written) == ["a", "b", "c"]
    assert written["a"] == written["b"] <= written["c"]
    assert log.read_times() == {"a": (1.5, True), "b": (2.5, False), "c": (2.5, False)}


def test_acks_during_a_long_poll_reach_the_server_without_it(server: ServerProcess) -> None:
    # Given a consumer holding 30 messages, and a long poll of the same process (same
    # link) that nothing answers for a minute
    with RemoteBroker.from_url(server.url) as broker, RemoteBroker.from_url(server.url) as watcher:
        c = broker.consumer("g", ["t"])
        idle = broker.consumer("idle", ["quiet"])
        broker.send_batch([Message("t", b"%d" % i) for i in range(30)])
        got = pull_until(c, 30)
        polled: list[object] = []
        poll = threading.Thread(target=lambda: polled.extend(idle.pull(1, 60_000)), daemon=True)
        poll.start()
        eventually(lambda: _group(watcher, "idle") == (0, 0), what="the long poll is open")
        # When they are acked in bursts (the link's background reader writes them: no
        # request of this process carries them)
        for burst in (got[:10], got[10:11], got[11:]):
            assert [c.ack(m) for m in burst] == [True] * len(burst)
            threading.Event().wait(0.02)
        # Then every ack reaches the server while the long poll still waits
        eventually(lambda: _group(watcher, "g") == (0, 30), what="the acks reached the server")
        assert poll.is_alive() and polled == []
        broker.send(Message("quiet", b"end"))
        poll.join(30)
        assert len(polled) == 1
