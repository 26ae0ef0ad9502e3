"""OwnerWatch: one idle connection to a directory's owner that tells when it is gone.

A client of a shared directory (see :mod:`broker_adapter.shared`) keeps one
extra connection to the owner's socket, said ``hello`` on and then only read.
The owner never writes to it, so the read blocks until the owner's process
closes it: a clean close, or the kernel's close of a killed process. That
moment starts the handover at once, even in a process that is idle (a web
worker between requests, a dispatcher in a long poll), so the directory gets a
new owner and its wheel fires again without waiting for someone's next call.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_adapter.errors import ConnectionFailed
from broker_adapter.server import protocol as P
from broker_adapter.server.unix import connect_unix

log = logging.getLogger("chronoq.broker_adapter.SharedBroker")
log.addHandler(logging.NullHandler())


def say_hello(path: Path, timeout_s: float) -> tuple[socket.socket, dict[str, Any]]:
    """Connect to the owner's socket at ``path`` and say hello; the socket and what the
    owner answered (its ``pid`` among it).

    :raises ConnectionFailed: when nobody serves there (no file, or a dead owner's).
    """
    try:
        sock = connect_unix(path, timeout_s)
    except OSError as e:
        raise ConnectionFailed(f"no owner answers on {path}: {e}") from e
    try:
        sock.sendall(P.request(0, "hello", {"v": P.VERSION, "token": None}))
        frames = P.FrameReader(sock).frames()
        if not frames:
            raise ConnectionFailed(f"the owner on {path} closed the connection at hello")
        resp = P.decode_response(frames[0])
        if not resp.ok or not isinstance(resp.result, dict):
            raise ConnectionFailed(f"the owner on {path} refused hello: {resp.result!r}")
    except (OSError, P.ProtocolError, ConnectionFailed) as e:
        sock.close()
        if isinstance(e, ConnectionFailed):
            raise
        raise ConnectionFailed(f"hello to the owner on {path} failed: {e}") from e
    sock.settimeout(None)
    return sock, resp.result


class OwnerWatch:
    """Calls ``on_gone()`` once, on its own thread, when the owner closes ``sock``.

    :param sock: a connection to the owner that has said hello (see :func:`say_hello`).
    :param on_gone: what to do when the owner is gone (not called after :meth:`stop`).
    :param name: the thread's name.
    """

    def __init__(self, sock: socket.socket, on_gone: Callable[[], None], name: str) -> None:
        self._sock = sock
        self._on_gone = on_gone
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._sock.recv(4096):
                pass  # the owner never writes here; ignore anything it might
        except OSError:
            pass
        finally:
            self._sock.close()
        if not self._stopped.is_set():
            try:
                self._on_gone()
            except Exception:
                log.exception("taking over after the owner left failed")

    def stop(self) -> None:
        """Stop watching (the owner is left on purpose); ``on_gone`` will not be called."""
        self._stopped.set()
        # No join: the thread may be the one handing over (it calls stop itself), or be
        # waiting for the lock of whoever calls stop; it ends on its own, doing nothing.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


__all__ = ["OwnerWatch", "say_hello"]
