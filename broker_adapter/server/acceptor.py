"""The accept thread of a :class:`~broker_adapter.server.server.BrokerServer`.

A new connection costs no thread until it speaks: it waits in one selector with
the listening socket (the *opening* stage of
:mod:`~broker_adapter.server.admission`), and only once bytes arrive on it (a
client sends its hello right after connecting) does it get its reader thread. A
flood of sockets that never send is thus a set of file descriptors in one
``epoll``: accepting, evicting and timing them out is a few system calls each, so
the accept queue keeps moving and a client's connect is served in its turn.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import time
from typing import TYPE_CHECKING

from broker_adapter.errors import InvalidArgument
from broker_adapter.server import protocol as P
from broker_adapter.server.connection import Connection

if TYPE_CHECKING:
    from broker_adapter.server.server import BrokerServer

log = logging.getLogger("chronoq.broker_adapter.BrokerServer")
log.addHandler(logging.NullHandler())

#: Most connections accepted in one go before the opening ones are looked at again.
ACCEPT_BURST = 256
#: Seconds between two sweeps of the hello deadlines (and the longest select wait).
SWEEP_S = 0.1


class Acceptor:
    """Accepts, admits and hands over the connections of ``server``'s ``listener``.

    :param server: the server (its admission, refusal log, metrics, and
        :meth:`~broker_adapter.server.server.BrokerServer.serve`).
    :param listener: the listening socket (made non-blocking here).
    """

    def __init__(self, server: BrokerServer, listener: socket.socket) -> None:
        self._server = server
        self._listener = listener
        listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, None)

    def run(self) -> None:
        """Serve until the server stops (then close the connections still opening)."""
        server = self._server
        next_sweep = 0.0
        try:
            while not server.stopping:
                try:
                    events = self._sel.select(SWEEP_S)
                except (OSError, ValueError):  # the listener closed under us: stopping
                    if server.stopping:
                        return
                    raise
                for key, _ in events:
                    if key.data is None:
                        self._accept_burst()
                    else:
                        self._speaks(key.data)
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + SWEEP_S
                    self._close_expired()
        finally:
            for key in list(self._sel.get_map().values()):
                if key.data is not None:
                    self._drop(key.data)
            self._sel.close()

    def _accept_burst(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                if self._server.stopping:
                    return
                log.exception("accept failed")
                time.sleep(0.1)
                return
            self._admit(sock, addr)

    def _admit(self, sock: socket.socket, addr: object) -> None:
        server = self._server
        sock.settimeout(None)
        if isinstance(addr, tuple):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer, address = f"{addr[0]}:{addr[1]}", str(addr[0])
        else:
            peer = address = f"unix:{sock.fileno()}"
        conn = Connection(server, sock, peer, address)
        verdict = server.admission.admit(conn, address)
        for old in verdict.evict:  # silent, so still here: no thread to stop
            server.refusals.note("silent ones closed for newer", old.address)
            self._drop(old)
        if verdict.refusal is not None:
            server.metrics.refused()
            server.refusals.note(f"refused: {verdict.label}", address)
            with contextlib.suppress(OSError):
                sock.sendall(
                    P.error_response(0, InvalidArgument(f"{verdict.refusal}; try again later"))
                )
            sock.close()
            return
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _speaks(self, conn: Connection) -> None:
        """Bytes arrived on an opening connection: give it its reader thread."""
        self._sel.unregister(conn.sock)
        conn.heard = True  # from now on its thread owns it (never evicted, never dropped)
        self._server.serve(conn)

    def _close_expired(self) -> None:
        """Close the connections that did not say hello within the hello timeout."""
        server = self._server
        for conn in server.admission.expired():
            server.refusals.note("closed: no hello in time", conn.address)
            if conn.heard:
                conn.close()  # its reader thread cleans up
            else:
                self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        """Close an opening connection that has no thread."""
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        self._server.admission.release(conn)
        conn.sock.close()


__all__ = ["ACCEPT_BURST", "SWEEP_S", "Acceptor"]
