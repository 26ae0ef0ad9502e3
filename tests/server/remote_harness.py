"""The ``remote`` adapter of the conformance suite: RemoteBroker against a server subprocess.

One server process (``--manual-clock``) serves the whole session; each test
starts with a ``reset`` admin request (fresh data directory, the test's clock
time). The test's ``ManualClock`` is mirrored to the server: every move is sent
as an ``advance`` admin request before ``advance`` returns. ``reopen`` restarts
the subprocess (SIGTERM, then start) on the same data directory.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import ManualClock
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.link import Link
from tests.server.serverproc import ServerProcess

_shared: dict[str, ServerProcess] = {}


def shared_server() -> ServerProcess:
    """The session's manual-clock server, started (again) when not running."""
    proc = _shared.get("server")
    if proc is None:
        data = Path(tempfile.mkdtemp(prefix="chronoq-remote-")) / "data"
        proc = ServerProcess(data, token="conformance-token", manual_clock_ms=0)
        _shared["server"] = proc

        def stop() -> None:
            proc.stop()
            shutil.rmtree(data.parent, ignore_errors=True)

        atexit.register(stop)
    if not proc.alive():
        proc.start()
    return proc


class RemoteFactory:
    """Opens ``RemoteBroker`` clients of the shared server for one test."""

    can_reopen = True

    def __init__(self) -> None:
        self.server = shared_server()
        self._clock: ManualClock | None = None
        self._admin: Link | None = None
        self._opened = False

    def _sync_clock(self) -> None:
        assert self._clock is not None
        if self._admin is None or not self._admin.alive:
            if self._admin is not None:
                self._admin.close()  # a dead link still holds its socket
            self._admin = self.server.link()
        self._admin.call("advance", {"to_ms": self._clock.now_ms()}, 30.0)

    def open(self, clock: ManualClock) -> BrokerAdapter:
        if not self._opened:
            self.server.admin("reset", start_ms=clock.now_ms())
            self._clock = clock
            clock.subscribe(self._sync_clock)
            self._opened = True
        else:  # reopen: a new process on the same data, at the clock's time
            if self._admin is not None:
                self._admin.close()
                self._admin = None
            self.server.stop()
            self.server.manual_clock_ms = clock.now_ms()
            self.server.restart()
        return RemoteBroker.from_url(self.server.url)

    def cleanup(self) -> None:
        if self._clock is not None:
            self._clock.unsubscribe(self._sync_clock)
        if self._admin is not None:
            self._admin.close()


def make_remote(request: pytest.FixtureRequest, workdir: Path) -> RemoteFactory:
    """Factory maker for ``AdapterSpec("remote", ...)``."""
    return RemoteFactory()
