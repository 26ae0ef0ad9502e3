"""kill -9 in the middle of sending, aborting and firing loses no acknowledged message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker_adapter import MessageState, open_broker

CHILD = Path(__file__).with_name("crash_child.py")


def _journal(path: Path) -> tuple[set[str], set[str]]:
    sent, aborted = set(), set()
    for line in path.read_text().splitlines():
        kind, _, msg_id = line.partition(" ")
        if len(msg_id) != 32:  # the last line may be cut by the kill
            continue
        (sent if kind == "sent" else aborted).add(msg_id)
    return sent, aborted


def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    data, journal = tmp_path / "data", tmp_path / "journal.txt"
    journal.touch()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for round_no in range(2):  # kill twice: the second time recovery itself is under load
        child = subprocess.Popen([sys.executable, str(CHILD), str(data), str(journal)], env=env)
        try:
            deadline = time.monotonic() + 60
            target = 3000 * (round_no + 1)
            while len(journal.read_text().splitlines()) < target:
                assert child.poll() is None, "the child died on its own"
                assert time.monotonic() < deadline, "the child was too slow to send"
                time.sleep(0.05)
            time.sleep(0.3)  # let firing and acking run too
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    sent, aborted = _journal(journal)
    assert len(sent) >= 6000 and aborted

    with open_broker(f"rocksdb://{data}") as broker:
        for msg_id in sent:
            view = broker.query(msg_id)
            assert view is not None, f"acknowledged message {msg_id} was lost"
            if msg_id in aborted:
                assert view.state is MessageState.ABORTED
            else:
                assert view.state is not MessageState.ABORTED
        # Everything still pending fires within 3 s; a new group reads all that fired.
        received: set[str] = set()
        expected = sent - aborted
        with broker.consumer("verify", ["crash"]) as consumer:
            deadline = time.monotonic() + 30
            while not expected <= received and time.monotonic() < deadline:
                for m in consumer.pull(max_messages=512, wait_ms=200):
                    received.add(m.msg_id)
                    consumer.ack(m)
        assert expected <= received, f"{len(expected - received)} acknowledged never delivered"
        assert not (received & aborted), "an aborted message was delivered"
