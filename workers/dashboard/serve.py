"""Serving the dashboard with uvicorn on a socket the caller bound (``chronoq
dashboard`` binds it first, so ``--port 0`` knows its port before it prints it)."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn


class DashboardServer(uvicorn.Server):
    """uvicorn's server, except that SIGTERM/SIGINT end it with exit status 0:
    uvicorn raises the signal again after its graceful shutdown, so the process
    would die of it (status -15), which reads as a failure to supervisors."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Stop gracefully on SIGTERM/SIGINT (a second SIGINT: at once)."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only
            return

        def stop(signum: int, frame: FrameType | None) -> None:
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

        saved = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)


def serve(app: Any, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve ``app`` on the listening ``sock`` until SIGTERM/SIGINT (no access log:
    request lines would add nothing but noise; the token is never in them anyway)."""
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="on", timeout_graceful_shutdown=5
    )
    DashboardServer(config).run(sockets=[sock])


__all__ = ["DashboardServer", "serve"]
