"""Fixtures of the broker_adapter tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded.core import BrokerCore


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; killed at its end if still running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


@pytest.fixture
def core(data_dir: Path, manual_clock: ManualClock) -> Iterator[BrokerCore]:
    """An embedded broker's core on ``data_dir``, closed at the test's end."""
    c = BrokerCore(data_dir, manual_clock)
    try:
        yield c
    finally:
        c.close()
