"""Fixtures of the workers suite: a Scheduler on a fresh embedded broker with a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from scheduler.scheduler import Scheduler


@pytest.fixture
def app(data_dir: Path, manual_clock: ManualClock) -> Iterator[Scheduler]:
    """A Scheduler on its own embedded broker, driven by ``manual_clock``."""
    scheduler = Scheduler(f"rocksdb://{data_dir}", clock=manual_clock, max_workers=4, prefetch=8)
    yield scheduler
    scheduler.close()
