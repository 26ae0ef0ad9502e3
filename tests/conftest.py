"""Fixtures shared by every suite: a fresh data directory and a manual clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock

#: Where every ManualClock in the tests starts (2023-11-14T22:13:20Z).
START_MS = 1_700_000_000_000


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty directory for one broker's RocksDB data (not created yet)."""
    return tmp_path / "chronoq-data"


@pytest.fixture
def manual_clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock(START_MS)
