"""A client process for the server tests: send, and consume in one group, at once.

``python -m tests.server.client_child URL NAME N OUT_DIR``: sends N messages
(bodies ``NAME:i``) with one ``send`` each while a thread pulls and acks group
``shared``; writes ``NAME.sent`` when the sends are done, and, once ``stop``
appears in OUT_DIR, the received ids to ``NAME.recv`` (one per line). Ends by
itself after 120 s at the latest.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from broker_adapter import Message, open_broker


def main(url: str, name: str, n: int, out: Path) -> int:
    broker = open_broker(url)
    received: list[str] = []
    deadline = time.monotonic() + 120
    stop = out / "stop"

    def consume() -> None:
        with broker.consumer("shared", ["two"]) as c:
            while time.monotonic() < deadline and not stop.exists():
                for m in c.pull(64, 100):
                    received.append(m.msg_id)
                    c.ack(m)

    t = threading.Thread(target=consume)
    t.start()
    ids = [broker.send(Message("two", f"{name}:{i}".encode())).msg_id for i in range(n)]
    (out / f"{name}.sent").write_text("\n".join(ids) + "\n")
    t.join()
    (out / f"{name}.recv").write_text("\n".join(received) + "\n")
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
