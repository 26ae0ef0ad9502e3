"""Child process of the held-fires kill -9 test: pulls fires whose write is held.

``held_child.py DATA JOURNAL MODE N``: on an embedded broker whose pulls hold their
fires for a minute, it sends ``N`` messages due 8 ms apart from 0.3 s on and pulls
them all (never acking), so their fires are held in memory. With ``MODE`` ``send-after`` it
then sends one message due in an hour (a write that must carry the held fires).
It writes ``pulled <id>`` per message, ``held <n>`` (the core's held fires at that
point) and ``ready`` to the journal, then sleeps until killed.
"""

from __future__ import annotations

import sys
import time

from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.message import Message


def main(data_dir: str, journal_path: str, mode: str, n: int) -> None:
    broker = EmbeddedBroker(data_dir, fire_hold_ms=60_000)
    journal = open(journal_path, "a", buffering=1)  # noqa: SIM115 - lives until SIGKILL
    consumer = broker.consumer("g", ["t"])
    now = int(time.time() * 1000)
    for i in range(n):
        broker.send(Message(topic="t", body=b"%d" % i, deliver_at_ms=now + 300 + i * 8))
    pulled: list[str] = []
    deadline = time.monotonic() + 20
    while len(pulled) < n and time.monotonic() < deadline:
        pulled += [m.msg_id for m in consumer.pull(64, wait_ms=500)]
    journal.writelines(f"pulled {msg_id}\n" for msg_id in pulled)
    journal.write(f"held {broker.core.held_fires}\n")
    if mode == "send-after":
        broker.send(Message(topic="t", body=b"later", delay_ms=3_600_000))
        journal.write(f"held {broker.core.held_fires}\n")
    journal.write("ready\n")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
