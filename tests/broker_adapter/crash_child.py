"""Child process of the kill -9 test: sends, aborts and consumes until killed.

After each call returns it appends a line to the journal (and flushes), so the
journal lists only what the broker had acknowledged: ``sent <id>``, then for an
abort ``aborting <id>`` before the call and ``aborted <id>`` or ``kept <id>``
after it. A kill between an abort's answer and its line leaves ``aborting``
alone: that message may be either.
"""

from __future__ import annotations

import random
import sys
import threading

from broker_adapter import AbortStatus, Message, open_broker


def main(data_dir: str, journal_path: str) -> None:
    broker = open_broker(f"rocksdb://{data_dir}")
    journal = open(journal_path, "a", buffering=1)  # noqa: SIM115 - lives until SIGKILL
    rng = random.Random(7)

    def consume() -> None:
        consumer = broker.consumer("crash-test", ["crash"])
        while True:
            for m in consumer.pull(max_messages=64, wait_ms=200):
                consumer.ack(m)

    threading.Thread(target=consume, daemon=True).start()
    n = 0
    while True:
        n += 1
        if n % 5 == 0:
            batch = [
                Message("crash", b"b%d" % i, delay_ms=rng.randrange(0, 3000)) for i in range(50)
            ]
            journal.writelines(f"sent {res.msg_id}\n" for res in broker.send_batch(batch))
        else:
            res = broker.send(Message("crash", b"s", key=f"k{n}", delay_ms=rng.randrange(0, 3000)))
            journal.write(f"sent {res.msg_id}\n")
            if n % 3 == 0:
                journal.write(f"aborting {res.msg_id}\n")
                status = broker.abort(msg_id=res.msg_id).status
                outcome = "aborted" if status is AbortStatus.ABORTED else "kept"
                journal.write(f"{outcome} {res.msg_id}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
