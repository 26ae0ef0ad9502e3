"""RocksStore.scan: bounds, limit and order, on a real RocksDB directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.store import RocksStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksStore]:
    s = RocksStore(tmp_path / "db")
    for i in range(10):
        s.put(K.CF_READY, b"k%02d" % i, b"v%d" % i)
    yield s
    s.close()


def keys(rows: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [k for k, _ in rows]


def test_scan_is_lower_inclusive_upper_exclusive_and_in_order(store: RocksStore) -> None:
    rows = store.scan(K.CF_READY, b"k03", b"k07", 100)
    assert rows == [(b"k03", b"v3"), (b"k04", b"v4"), (b"k05", b"v5"), (b"k06", b"v6")]


@pytest.mark.parametrize("limit", [0, 1, 3, 4, 5])
def test_scan_stops_at_the_limit(store: RocksStore, limit: int) -> None:
    assert (
        keys(store.scan(K.CF_READY, b"k03", b"k07", limit))
        == [
            b"k03",
            b"k04",
            b"k05",
            b"k06",
        ][:limit]
    )


def test_scan_of_an_empty_range_and_past_the_end(store: RocksStore) -> None:
    assert store.scan(K.CF_READY, b"k05", b"k05", 10) == []
    assert store.scan(K.CF_READY, b"k10", b"k99", 10) == []
    assert keys(store.scan(K.CF_READY, b"k08", b"k99", 10)) == [b"k08", b"k09"]
