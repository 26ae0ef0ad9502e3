"""Fixtures for the Scheduler tests: a Scheduler on a real embedded broker in a
temporary directory, driven by a ManualClock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from scheduler import Scheduler


@pytest.fixture
def app(data_dir: Path, manual_clock: ManualClock) -> Iterator[Scheduler]:
    """A Scheduler whose broker (opened on first use) lives in ``data_dir``."""
    with Scheduler(f"rocksdb://{data_dir}", clock=manual_clock) as scheduler:
        yield scheduler
