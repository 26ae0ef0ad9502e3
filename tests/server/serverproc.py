"""A broker server subprocess for tests (``python -m broker_adapter.server``).

Real process, real socket on 127.0.0.1, real RocksDB directory. The port is
picked by the server (``--port 0``) and read from its first stdout line.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from broker_adapter.server.link import Link
from tests.helpers import stop_process

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


class ServerProcess:
    """One ``python -m broker_adapter.server`` child.

    :param data_dir: its data directory.
    :param token: ``--token``, if any.
    :param manual_clock_ms: ``--manual-clock`` (test-only admin requests), if any.
    :param extra: more command-line arguments.
    :param log_path: append the child's stderr (its log) to this file.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        token: str | None = None,
        manual_clock_ms: int | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.token = token
        self.manual_clock_ms = manual_clock_ms
        self.extra = extra
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.node = ""

    def argv(self) -> list[str]:
        """The child's command line."""
        argv = [
            sys.executable,
            "-m",
            "broker_adapter.server",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            *self.extra,
        ]
        if self.token is not None:
            argv += ["--token", self.token]
        if self.manual_clock_ms is not None:
            argv += ["--manual-clock", str(self.manual_clock_ms)]
        return argv

    def start(self) -> ServerProcess:
        """Start the child and wait for its "listening" line.

        On a restart the same port is asked for again, so clients find it.
        """
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(self.env or {})}
        if self.log_path is None:
            self.proc = subprocess.Popen(
                self.argv(), stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
            )
        else:
            with self.log_path.open("a") as err:  # the child keeps its own copy of the fd
                self.proc = subprocess.Popen(
                    self.argv(), stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT
                )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("chronoq broker listening on"):
            self.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        words = line.split()
        self.port = int(words[4].rpartition(":")[2])
        self.node = words[6]
        return self

    @property
    def url(self) -> str:
        """``chronoq://127.0.0.1:PORT[?token=...]``."""
        query = f"?token={self.token}" if self.token else ""
        return f"chronoq://127.0.0.1:{self.port}{query}"

    def alive(self) -> bool:
        """Whether the child still runs."""
        return self.proc is not None and self.proc.poll() is None

    def link(self) -> Link:
        """A raw protocol link (for admin requests and protocol tests)."""
        return Link("127.0.0.1", self.port, self.token)

    def admin(self, op: str, **args: Any) -> Any:
        """One request on a short-lived link."""
        link = self.link()
        try:
            return link.call(op, args, 30.0)
        finally:
            link.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc is None:
            return 0
        rc = stop_process(self.proc, timeout)
        self._close_pipe()
        return rc if rc is not None else 0

    def kill(self) -> None:
        """SIGKILL (``kill -9``) and reap."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def restart(self) -> ServerProcess:
        """Stop (SIGTERM) and start again on the same data dir and port."""
        self.stop()
        deadline = time.monotonic() + 10
        while True:  # the port may linger a moment in the kernel
            try:
                return self.start()
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
