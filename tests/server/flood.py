"""A connection flood for tests and ``bench/connection_flood.py``: silent sockets
from chosen loopback source addresses (any 127.x.y.z can be bound on Linux), opened
again as soon as the server closes them."""

from __future__ import annotations

import selectors
import socket
import threading
from typing import Self


class Flood:
    """Keeps ``want[address]`` silent sockets open from each source address, opening
    a new one (at most ``burst`` per round of 50 ms) whenever the server closed one."""

    def __init__(self, port: int, want: dict[str, int], burst: int = 40) -> None:
        self._port = port
        self._want = want
        self._burst = burst
        self._sel = selectors.DefaultSelector()
        self._open = dict.fromkeys(want, 0)
        self.opened = 0
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def _connect(self, source: str) -> None:
        s = socket.socket()
        s.bind((source, 0))
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self._port))
        except BlockingIOError:
            pass
        self._sel.register(s, selectors.EVENT_READ, source)
        self._open[source] += 1
        self.opened += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            budget = self._burst
            for source, want in self._want.items():
                while self._open[source] < want and budget > 0:
                    self._connect(source)
                    budget -= 1
            for key, _ in self._sel.select(0.05):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:  # the server closed it (or refused it)
                    self._sel.unregister(sock)
                    sock.close()
                    self._open[key.data] -= 1
                    self.closed_by_server += 1
