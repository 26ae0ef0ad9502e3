"""How the embedded broker tunes RocksDB: the options its DB and column families open
with, and the write options each durability mode means.

:class:`~broker_adapter.embedded.store.RocksStore` opens with them, and so do the
tools that open a data directory themselves (check, repair), so every open reads
the files with the same table format, filters and memory budget.
"""

from __future__ import annotations

from rocksdict import BlockBasedOptions, Cache, Options, WriteOptions

#: ``sync``: fsync the WAL on every send/abort (survives power loss; slowest).
#: ``wal`` (default): write the WAL on every send/abort without fsync (survives
#: ``kill -9`` of the process, not a power cut). ``fast``: no WAL (a crash loses
#: recent sends; ``close()`` still persists everything).
DURABILITY_MODES = ("sync", "wal", "fast")

#: Memory budget. Memtables of all families share ``MEMTABLE_BUDGET`` and data
#: blocks share one LRU block cache (RocksDB's defaults would let six families
#: hold 64 MiB memtables each). Bloom filters and indexes cost about 2 bytes per
#: pending message on top (10M pending: ~165 MB RSS in all).
MEMTABLE_BUDGET = 48 * 1024 * 1024
BLOCK_CACHE_BYTES = 32 * 1024 * 1024
_BIG_FAMILIES = ("wheel", "ready")


def options_for(cache: Cache, family: str | None = None) -> Options:
    """The options the broker opens its DB with (``family=None``) or one of its column
    families with, in raw mode.

    :param cache: the block cache every family of one DB shares.
    :param family: a column family's name, or ``None`` for the DB's own options.
    """
    opt = Options(raw_mode=True)
    if family is None:  # options of the DB itself
        opt.create_if_missing(True)
        opt.create_missing_column_families(True)
        opt.increase_parallelism(2)
        opt.set_db_write_buffer_size(MEMTABLE_BUDGET)
        opt.set_max_open_files(512)
        opt.set_keep_log_file_num(3)
    big = family in _BIG_FAMILIES
    opt.set_write_buffer_size((16 if big else 4) * 1024 * 1024)
    opt.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    # Index and filter blocks stay in table-reader memory (a few bytes per key):
    # charging them to the small block cache made key lookups thrash once data
    # left the memtables (613k/s -> 12k/s at 1M keys).
    table.set_bloom_filter(10, False)  # point lookups: keys, wheel, ready, aborted
    opt.set_block_based_table_factory(table)
    return opt


def write_options(durability: str) -> tuple[WriteOptions, WriteOptions]:
    """The write options of ``durability``: ``(durable, lazy)``, the first for sends
    and aborts, the second for background writes (fire, cursors) that never need an
    fsync, since losing them only repeats a delivery, which at-least-once allows.

    :param durability: one of :data:`DURABILITY_MODES` (the caller has checked it).
    """
    durable = WriteOptions()
    if durability == "sync":
        durable.sync = True
    elif durability == "fast":
        _disable_wal(durable)
    lazy = WriteOptions()
    if durability == "fast":
        _disable_wal(lazy)
    return durable, lazy


def _disable_wal(opt: WriteOptions) -> None:
    # rocksdict 0.3.29 exposes disable_wal as a property (its .pyi says method)
    setattr(opt, "disable_wal", True)  # noqa: B010


__all__ = [
    "BLOCK_CACHE_BYTES",
    "DURABILITY_MODES",
    "MEMTABLE_BUDGET",
    "options_for",
    "write_options",
]
