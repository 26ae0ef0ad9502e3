"""RocksStore: one RocksDB directory opened in raw mode with the broker's column families.

It owns the durability choice (see :data:`DURABILITY_MODES`) and says who holds
the directory when RocksDB's lock refuses us.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from broker_adapter.embedded.keys import COLUMN_FAMILIES
from broker_adapter.errors import BrokerError, BrokerLocked, InvalidArgument

log = logging.getLogger("chronoq.broker_adapter.RocksStore")
log.addHandler(logging.NullHandler())

#: ``sync``: fsync the WAL on every send/abort (survives power loss; slowest).
#: ``wal`` (default): write the WAL on every send/abort without fsync (survives
#: ``kill -9`` of the process, not a power cut). ``fast``: no WAL (a crash loses
#: recent sends; ``close()`` still persists everything).
DURABILITY_MODES = ("sync", "wal", "fast")
OWNER_FILE = "CHRONOQ_OWNER"


#: Memory budget. Memtables of all families share ``MEMTABLE_BUDGET`` and data
#: blocks share one LRU block cache (RocksDB's defaults would let six families
#: hold 64 MiB memtables each). Bloom filters and indexes cost about 2 bytes per
#: pending message on top (10M pending: ~165 MB RSS in all).
MEMTABLE_BUDGET = 48 * 1024 * 1024
BLOCK_CACHE_BYTES = 32 * 1024 * 1024
_BIG_FAMILIES = ("wheel", "ready")


def _options(cache: Cache, family: str | None = None) -> Options:
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


def _disable_wal(opt: WriteOptions) -> None:
    # rocksdict 0.3.29 exposes disable_wal as a property (its .pyi says method)
    setattr(opt, "disable_wal", True)  # noqa: B010


class RocksStore:
    """The broker's RocksDB directory: column families, batches, owner file.

    :param path: the data directory (created if missing).
    :param durability: one of :data:`DURABILITY_MODES`.
    :raises BrokerLocked: when another process (or another broker in this one) owns it.
    """

    def __init__(self, path: str | os.PathLike[str], durability: str = "wal") -> None:
        if durability not in DURABILITY_MODES:
            raise InvalidArgument(
                f"durability must be one of {', '.join(DURABILITY_MODES)}, got {durability!r}"
            )
        self.path = Path(path).resolve()
        self.durability = durability
        self.path.mkdir(parents=True, exist_ok=True)
        cache = Cache(BLOCK_CACHE_BYTES)
        cfs = {name: _options(cache, name) for name in COLUMN_FAMILIES}
        try:
            self.db = Rdict(str(self.path), _options(cache), column_families=cfs)
        except Exception as e:
            text = str(e)
            if "lock" in text.lower():
                raise BrokerLocked(str(self.path), self._holder()) from e
            raise BrokerError(f"cannot open RocksDB at {self.path}: {text}") from e
        self._write_owner()
        self.cf = {name: self.db.get_column_family(name) for name in COLUMN_FAMILIES}
        self.handle = {name: self.db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self.write_opt = WriteOptions()
        if durability == "sync":
            self.write_opt.sync = True
        elif durability == "fast":
            _disable_wal(self.write_opt)
        # Background writes (fire, cursors) never need an fsync: losing them only
        # repeats a delivery, which at-least-once allows.
        self.lazy_opt = WriteOptions()
        if durability == "fast":
            _disable_wal(self.lazy_opt)

    def _holder(self) -> str:
        try:
            info = (self.path / OWNER_FILE).read_text().strip()
        except OSError:
            return "another process (no owner file found)"
        pid = info.split(" ", 1)[0]
        if pid == str(os.getpid()):
            return f"this process (pid {pid}): close the other broker first"
        return f"process {info}"

    def _write_owner(self) -> None:
        cmd = " ".join(sys.argv)[:200]
        (self.path / OWNER_FILE).write_text(f"{os.getpid()} on {socket.gethostname()}: {cmd}\n")

    def batch(self) -> WriteBatch:
        """A new raw-mode write batch."""
        return WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch, lazy: bool = False) -> None:
        """Apply ``batch`` atomically; ``lazy`` for writes a crash may repeat."""
        self.db.write(batch, self.lazy_opt if lazy else self.write_opt)

    def scan(self, cf: str, lower: bytes, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` ``(key, value)`` pairs of ``cf`` in ``[lower, upper)``, in order."""
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        out: list[tuple[bytes, bytes]] = []
        for key, value in self.cf[cf].items(from_key=lower, read_opt=opt):
            if len(out) >= limit or key >= upper:  # type: ignore[operator]  # raw mode: bytes
                break  # (the bound check is belt and braces: bounds misbehaved in some builds)
            out.append((key, value))  # type: ignore[arg-type]
        return out

    def count(self, cf: str, lower: bytes, upper: bytes) -> int:
        """How many keys ``cf`` has in ``[lower, upper)`` (a keys-only scan)."""
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        it = self.cf[cf].iter(opt)
        it.seek(lower)
        n = 0
        while it.valid():
            n += 1
            it.next()
        return n

    def last_key(self, cf: str, lower: bytes, upper: bytes) -> bytes | None:
        """The greatest key of ``cf`` in ``[lower, upper)``, if any."""
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        it = self.cf[cf].iter(opt)
        it.seek_for_prev(upper)
        while it.valid():
            key: bytes = it.key()
            if lower <= key < upper:
                return key
            it.prev()
        return None

    def close(self) -> None:
        """Flush memtables (so ``fast`` mode loses nothing on a clean close) and close."""
        try:
            self.db.flush(True)
        except Exception:  # pragma: no cover - close must not raise on a broken disk
            log.exception("flush on close failed for %s", self.path)
        self.db.close()
        # Column-family objects keep the DB (and its LOCK) alive until dropped.
        self.cf.clear()
        self.handle.clear()
        del self.db
        gc.collect()
