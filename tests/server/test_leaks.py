"""A closed RemoteBroker leaves no threads and no file descriptors behind."""

from __future__ import annotations

import os
import threading

from broker_adapter.message import Message
from broker_adapter.server.client import RemoteBroker
from tests.helpers import eventually, pull_one
from tests.server.serverproc import ServerProcess


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_threads_and_fds(server: ServerProcess) -> None:
    threads, fds = threading.active_count(), _fds()
    for _ in range(3):
        broker = RemoteBroker.from_url(server.url)
        c = broker.consumer("leak", ["leak"])
        broker.send(Message("leak", b"x"))
        broker.send_async(Message("leak", b"y"), lambda r, e: None)
        assert c.ack(pull_one(c))
        broker.close()
    eventually(lambda: threading.active_count() <= threads, what="threads ended")
    eventually(lambda: _fds() <= fds, what="file descriptors closed")
