"""kill -9 in the middle of sending, aborting and firing loses no acknowledged message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from broker_adapter import MessageState, open_broker

CHILD = Path(__file__).with_name("crash_child.py")


class Journal(NamedTuple):
    """What the child's journal says the broker acknowledged."""

    sent: set[str]
    aborted: set[str]
    #: Aborts asked for whose answer has no line: the kill came in between.
    unanswered: set[str]


def _journal(path: Path) -> Journal:
    lines: dict[str, set[str]] = {"sent": set(), "aborting": set(), "aborted": set(), "kept": set()}
    for line in path.read_text().splitlines():
        kind, _, msg_id = line.partition(" ")
        if len(msg_id) == 32 and kind in lines:  # the last line may be cut by the kill
            lines[kind].add(msg_id)
    answered = lines["aborted"] | lines["kept"]
    return Journal(lines["sent"], lines["aborted"], lines["aborting"] - answered)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    data, journal = tmp_path / "data", tmp_path / "journal.txt"
    journal.touch()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _round in range(2):  # kill twice: the second time recovery itself is under load
        child = subprocess.Popen([sys.executable, str(CHILD), str(data), str(journal)], env=env)
        try:
            deadline = time.monotonic() + 60
            # Counted from this round's start: the first round writes thousands of lines
            # in its last 0.3 s, so a total would kill the second child while it starts.
            target = _lines(journal) + 3000
            while _lines(journal) < target:
                assert child.poll() is None, "the child died on its own"
                assert time.monotonic() < deadline, "the child was too slow to send"
                time.sleep(0.05)
            time.sleep(0.3)  # let firing and acking run too
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    sent, aborted, unanswered = _journal(journal)
    assert len(sent) >= 6000 and aborted
    assert len(unanswered) <= 2, "at most one abort per kill can lose its answer's line"

    with open_broker(f"rocksdb://{data}") as broker:
        for msg_id in sent:
            view = broker.query(msg_id)
            assert view is not None, f"acknowledged message {msg_id} was lost"
            if msg_id in aborted:
                assert view.state is MessageState.ABORTED
            elif msg_id not in unanswered:
                assert view.state is not MessageState.ABORTED
        # Everything still pending fires within 3 s; a new group reads all that fired.
        received: set[str] = set()
        expected = sent - aborted - unanswered
        with broker.consumer("verify", ["crash"]) as consumer:
            deadline = time.monotonic() + 30
            while not expected <= received and time.monotonic() < deadline:
                for m in consumer.pull(max_messages=512, wait_ms=200):
                    received.add(m.msg_id)
                    consumer.ack(m)
        assert expected <= received, f"{len(expected - received)} acknowledged never delivered"
        assert not (received & aborted), "an aborted message was delivered"
