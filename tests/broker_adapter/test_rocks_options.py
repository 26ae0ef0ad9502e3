"""rocks_options: what each durability mode writes with, and that a store and the
offline tools open one real directory with the same options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.check import open_read_only
from broker_adapter.embedded.rocks_options import DURABILITY_MODES, write_options
from broker_adapter.embedded.store import RocksStore
from broker_adapter.errors import InvalidArgument


def flags(opt: Any) -> tuple[bool, bool]:
    """``(sync, disable_wal)`` of a ``WriteOptions`` (typed ``Any``: rocksdict's .pyi
    calls ``disable_wal`` a method, while 0.3.29 has a property)."""
    return opt.sync, opt.disable_wal


@pytest.mark.parametrize(
    ("durability", "durable", "lazy"),
    [
        # (sync, disable_wal) of the durable and of the lazy options
        ("sync", (True, False), (False, False)),
        ("wal", (False, False), (False, False)),
        ("fast", (False, True), (False, True)),
    ],
)
def test_each_mode_s_write_options(
    tmp_path: Path, durability: str, durable: tuple[bool, bool], lazy: tuple[bool, bool]
) -> None:
    d, lz = write_options(durability)
    assert flags(d) == durable
    assert flags(lz) == lazy
    store = RocksStore(tmp_path / "db", durability)
    try:  # the store writes with exactly these
        assert flags(store.write_opt) == durable
        assert flags(store.lazy_opt) == lazy
    finally:
        store.close()


def test_modes_are_the_three_documented_ones() -> None:
    assert DURABILITY_MODES == ("sync", "wal", "fast")


def test_an_unknown_mode_is_refused_before_the_directory_is_made(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="durability must be one of sync, wal, fast"):
        RocksStore(tmp_path / "db", "sometimes")
    assert not (tmp_path / "db").exists()


def test_a_read_only_open_with_the_same_options_reads_the_store_s_raw_keys(
    tmp_path: Path,
) -> None:
    store = RocksStore(tmp_path / "db", "fast")
    store.put(K.CF_READY, b"\x00\x01", b"v")
    store.close()  # flushes: fast mode has no WAL
    db = open_read_only(tmp_path / "db")
    try:
        assert dict(db.get_column_family(K.CF_READY).items()) == {b"\x00\x01": b"v"}
    finally:
        db.close()
