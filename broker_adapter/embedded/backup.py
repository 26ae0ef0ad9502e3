"""Online backups of the embedded broker's data directory: RocksDB checkpoints.

A checkpoint is a consistent copy of the DB at one moment, taken while the broker
runs: RocksDB flushes its memtables, then hard-links the table files (copies them
across file systems) and copies the MANIFEST and the live WAL into the new
directory. Sends and firing go on meanwhile; every send acknowledged before the
backup started is in the copy (it is in the WAL or a table file by then).

Restore: stop the broker, move the damaged directory aside, and point a broker at
the copy (``rocksdb:///path/to/copy``, ``chronoq broker serve --data-dir COPY``),
or copy it back into place first. The copy is a complete data directory: it fires
what fell due since the backup on its first start. Hard links share disk blocks
with the live directory until compaction rewrites them, so a backup on the same
disk costs little space at first but is no protection against losing that disk:
copy it elsewhere (``cp -a``/``rsync`` of a finished backup is safe).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Checkpoint

from broker_adapter.embedded.store import RocksStore, is_no_space
from broker_adapter.errors import BrokerError, InvalidArgument, StorageFull

log = logging.getLogger("chronoq.broker_adapter.EmbeddedBroker")
log.addHandler(logging.NullHandler())

#: The prefix of the directories ``chronoq broker serve --backup-dir`` creates.
BACKUP_PREFIX = "chronoq-backup-"


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """What a backup wrote.

    :param path: the new data directory (absolute).
    :param size_bytes: bytes of its files (hard-linked ones included).
    :param files: how many files it has.
    :param seconds: how long the checkpoint took.
    """

    path: str
    size_bytes: int
    files: int
    seconds: float

    def to_list(self) -> list[object]:
        """The wire form: ``[path, size_bytes, files, seconds]``."""
        return [self.path, self.size_bytes, self.files, self.seconds]

    @classmethod
    def from_list(cls, value: list[object]) -> BackupInfo:
        """The inverse of :meth:`to_list`."""
        path, size, files, seconds = value
        return cls(str(path), int(str(size)), int(str(files)), float(str(seconds)))

    def describe(self) -> str:
        """One line for people."""
        mb = self.size_bytes / 1e6
        return f"backup {self.path}: {mb:.1f} MB in {self.files} files, {self.seconds:.2f} s"


def check_destination(dest: str | os.PathLike[str]) -> Path:
    """``dest`` as an absolute path, if a backup may be written there: it must not
    exist, or be an empty directory.

    :raises InvalidArgument: when it exists and is not an empty directory.
    """
    path = Path(dest).resolve()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InvalidArgument(
            f"backup destination {str(path)!r} exists and is not an empty directory; "
            "name a new directory (a backup never overwrites anything)"
        )
    return path


def timestamped(parent: str | os.PathLike[str]) -> Path:
    """A new backup directory name under ``parent``: ``chronoq-backup-<UTC time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = Path(parent).resolve() / f"{BACKUP_PREFIX}{stamp}"
    n = 1
    while path.exists():  # two in one second
        n += 1
        path = path.with_name(f"{BACKUP_PREFIX}{stamp}-{n}")
    return path


def _flush_first(store: RocksStore, timeout_s: float = 30.0) -> None:
    """Flush every family's memtable in the background and wait for it here.

    A checkpoint flushes the memtables itself, but inside one rocksdict call that
    holds the GIL: every thread of the process (the wheel's, the consumers') would
    stop for the whole flush. Flushed first, without the GIL, the checkpoint only
    has the writes since then to flush.
    """
    families = list(store.cf.values())
    try:
        for cf in families:
            cf.flush(False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            cf.property_int_value("rocksdb.num-immutable-mem-table")
            for cf in families  # not flushed yet
        ):
            time.sleep(0.005)
    except Exception as e:  # noqa: BLE001 - the checkpoint flushes anyway, and says why not
        log.warning("flush before the backup of %s: %s", store.path, str(e))


def checkpoint(store: RocksStore, dest: str | os.PathLike[str]) -> BackupInfo:
    """Write a consistent copy of ``store``'s DB into the new directory ``dest``.

    :raises InvalidArgument: when ``dest`` exists and is not an empty directory.
    :raises StorageFull: when the destination's disk has no room (a partial copy is
        left there: delete it).
    :raises BrokerError: when RocksDB fails otherwise.
    """
    path = check_destination(dest)
    if path.exists():
        path.rmdir()  # RocksDB creates the directory itself and refuses an existing one
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    _flush_first(store)
    try:
        Checkpoint(store.db).create_checkpoint(str(path))
    except Exception as e:
        text = str(e)
        if is_no_space(text):
            raise StorageFull(str(path), text) from e
        raise BrokerError(f"backup of {store.path} into {path} failed: {text}") from e
    seconds = time.perf_counter() - start
    size = files = 0
    for f in path.iterdir():
        size += f.stat().st_size
        files += 1
    return BackupInfo(str(path), size, files, seconds)


def backup_directory(data_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> BackupInfo:
    """Back up a data directory no process holds: open it (without the wheel, so
    nothing fires), take a checkpoint, close it.

    :raises InvalidArgument: when ``data_dir`` is no broker directory, or ``dest``
        exists and is not an empty directory.
    :raises BrokerLocked: when a process holds ``data_dir`` (ask that process).
    :raises BrokerError: when RocksDB fails.
    """
    source = Path(data_dir).resolve()
    if not (source / "CURRENT").is_file():
        raise InvalidArgument(f"{str(source)!r} is not a broker data directory (no CURRENT file)")
    check_destination(dest)
    store = RocksStore(source)
    try:
        return checkpoint(store, dest)
    finally:
        store.close()


__all__ = [
    "BACKUP_PREFIX",
    "BackupInfo",
    "backup_directory",
    "check_destination",
    "checkpoint",
    "timestamped",
]
