"""Fixtures of the broker-server tests: real server subprocesses on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import START_MS
from tests.server.serverproc import ServerProcess

TOKEN = "s3cret-token"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server on the system clock, with token :data:`TOKEN`, on a fresh data dir."""
    proc = ServerProcess(tmp_path / "data", token=TOKEN).start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def manual_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A ``--manual-clock`` server (test-only admin requests) without a token."""
    proc = ServerProcess(tmp_path / "data", manual_clock_ms=START_MS).start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two servers on the system clock, both with token :data:`TOKEN`."""
    a = ServerProcess(tmp_path / "a", token=TOKEN).start()
    b = ServerProcess(tmp_path / "b", token=TOKEN).start()
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()
