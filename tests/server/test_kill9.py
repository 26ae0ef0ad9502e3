"""``kill -9`` of the server under load, restart on the same data dir: no message
whose send was acknowledged is lost (delivery is at least once)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from broker_adapter.errors import ChronoqError, ConnectionFailed
from broker_adapter.message import Message
from broker_adapter.results import ReceivedMessage, SendStatus
from broker_adapter.server.client import RemoteBroker
from tests.helpers import eventually, pull_until
from tests.server.serverproc import ServerProcess

RUN_S = 60.0  # bound on every loop of this test


class Load:
    """Sync and batched senders plus a consumer, all on one RemoteBroker."""

    def __init__(self, broker: RemoteBroker) -> None:
        self.broker = broker
        self.acked_sends: set[str] = set()
        self.failed_sends = 0
        self.received: set[str] = set()
        self.stop = threading.Event()
        # set once both senders have returned: before that a send in flight can still
        # be acknowledged, so "all acknowledged were received" is not final yet
        self.senders_done = threading.Event()
        self.deadline = time.monotonic() + RUN_S
        self._lock = threading.Lock()
        self.consumer_end = "running"  # why the consumer loop ended, for a failure message
        self.threads = [
            threading.Thread(target=f, daemon=True)
            for f in (self._single, self._batched, self._consume)
        ]

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def _single(self) -> None:
        i = 0
        while self.running():
            i += 1
            try:
                r = self.broker.send(Message("k9", b"s%d" % i))
            except ConnectionFailed:
                self.failed_sends += 1
                time.sleep(0.01)
                continue
            assert r.status is SendStatus.OK
            with self._lock:
                self.acked_sends.add(r.msg_id)

    def _batched(self) -> None:
        i = 0
        while self.running():
            i += 1
            try:
                rs = self.broker.send_batch([Message("k9", b"b%d:%d" % (i, j)) for j in range(50)])
            except ConnectionFailed:
                self.failed_sends += 1
                time.sleep(0.01)
                continue
            with self._lock:
                self.acked_sends.update(r.msg_id for r in rs)

    def _consume(self) -> None:
        try:
            self._consume_until_done()
        except BaseException as e:
            self.consumer_end = f"raised {e!r}"
            raise

    def _consume_until_done(self) -> None:
        c = self.broker.consumer("k9", ["k9"])
        errors = 0
        last_error = ""
        while time.monotonic() < self.deadline and not (
            self.senders_done.is_set() and self.acked_sends <= self.received
        ):
            try:
                got: list[ReceivedMessage] = c.pull(200, 100)
                for m in got:
                    self.received.add(m.msg_id)
                    c.ack(m)
            except ChronoqError as e:  # server gone: a dispatcher would log and go on
                errors += 1
                last_error = repr(e)
                time.sleep(0.05)
        self.consumer_end = (
            f"ended {'at its deadline' if time.monotonic() >= self.deadline else 'done'}"
            f" after {errors} errors (last {last_error or 'none'})"
        )
        c.close()


def test_kill_9_under_load_loses_no_acknowledged_message(server: ServerProcess) -> None:
    broker = RemoteBroker.from_url(server.url)
    load = Load(broker)
    for t in load.threads:
        t.start()
    try:
        eventually(lambda: len(load.acked_sends) >= 3_000, timeout=RUN_S, what="load running")
        server.kill()  # kill -9, mid-load
        before_restart = len(load.acked_sends)
        server.start()  # same data dir, same port
        eventually(
            lambda: len(load.acked_sends) >= before_restart + 1_000,
            timeout=RUN_S,
            what="sends go on after the restart",
        )
        load.stop.set()
        for t in load.threads[:2]:
            t.join(RUN_S)
        assert not any(t.is_alive() for t in load.threads[:2]), "senders did not stop"
        load.senders_done.set()
        try:
            eventually(
                lambda: load.acked_sends <= load.received,
                timeout=RUN_S,
                what="every acknowledged message delivered",
            )
        except AssertionError as e:  # say where the missing ones are (a rare failure)
            missing = sorted(load.acked_sends - load.received)
            with RemoteBroker.from_url(server.url) as check:
                states = [check.query(mid) for mid in missing[:5]]
            raise AssertionError(
                f"{e}: {len(missing)} missing, e.g. {states}; consumer {load.consumer_end}"
            ) from e
        load.threads[2].join(RUN_S)
    finally:
        load.stop.set()
        broker.close()
    lost = load.acked_sends - load.received
    assert not lost, f"{len(lost)} acknowledged messages lost"
    assert before_restart >= 3_000
    with RemoteBroker.from_url(server.url) as check:
        sample = sorted(load.acked_sends)[:: max(1, len(load.acked_sends) // 50)]
        assert all(check.query(mid) is not None for mid in sample)


_PARKED_PULLER = """
import sys, pathlib
from broker_adapter import open_broker
broker = open_broker(sys.argv[1])
consumer = broker.consumer("g", ["parked"], invisible_ms=120_000)
pathlib.Path(sys.argv[2]).write_text("ready")
while True:
    for m in consumer.pull(8, 5_000):
        consumer.ack(m)
"""


def test_a_pull_parked_for_a_killed_client_gives_back_what_it_took(
    server: ServerProcess, tmp_path: Path
) -> None:
    """kill -9 of a client whose long poll waits on the server: a message that fires
    in that poll's remaining wait goes back to the group at once (uncounted), not
    after the dead consumer's invisible time (120 s here)."""
    ready = tmp_path / "ready"
    url = server.url
    child = subprocess.Popen([sys.executable, "-c", _PARKED_PULLER, url, str(ready)])
    try:
        eventually(ready.exists, timeout=30)
        time.sleep(0.5)  # its first pull is parked on the server now
    finally:
        child.kill()
        child.wait()
    with RemoteBroker.from_url(url) as broker:
        sent = broker.send(Message("parked", b"x"))
        with broker.consumer("g", ["parked"]) as consumer:
            got = pull_until(consumer, 1, timeout=30)
        assert [m.msg_id for m in got] == [sent.msg_id]
        assert got[0].attempts == 1
