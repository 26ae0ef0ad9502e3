"""RocksStore: one RocksDB directory opened in raw mode with the broker's column families.

It applies the durability choice (the modes and the options they mean are in
:mod:`~broker_adapter.embedded.rocks_options`) and says who holds the directory
when RocksDB's lock refuses us.

Every write goes through :meth:`RocksStore.write` or :meth:`RocksStore.put`, the one
place RocksDB's errors become typed ones: no space left (and RocksDB's "Writer has
previous error" that follows it) is :class:`~broker_adapter.errors.StorageFull`,
any other failure a :class:`~broker_adapter.errors.BrokerError`. A write that raised
was not applied (RocksDB writes the WAL before the memtable, and a torn WAL tail
is dropped on recovery). After a full disk RocksDB refuses every write until the
DB is reopened (rocksdict exposes no ``Resume()``), so :meth:`RocksStore.resume`
reopens it in place once there is room again; reads keep working meanwhile.
"""

from __future__ import annotations

import bisect
import functools
import gc
import itertools
import logging
import os
import socket
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rocksdict import AccessType, Cache, Rdict, ReadOptions, WriteBatch

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.dir_lock import held_here
from broker_adapter.embedded.keys import COLUMN_FAMILIES
from broker_adapter.embedded.rocks_options import (
    BLOCK_CACHE_BYTES,
    DURABILITY_MODES,
    options_for,
    write_options,
)
from broker_adapter.errors import (
    BrokerClosed,
    BrokerError,
    BrokerLocked,
    ChronoqError,
    InvalidArgument,
    StorageFull,
)

log = logging.getLogger("chronoq.broker_adapter.RocksStore")
log.addHandler(logging.NullHandler())

OWNER_FILE = "CHRONOQ_OWNER"

#: Least time between two attempts to resume writing after a full disk.
RESUME_PROBE_S = 1.0
# Longest a reader waits for such a reopen.
_REOPEN_WAIT_S = 10.0
# Reopening replays the WAL into a new table file: ask for that much room plus slack.
_RESUME_SLACK_BYTES = 4 * 1024 * 1024
_NO_SPACE = ("No space left on device", "Writer has previous error")


def is_no_space(text: str) -> bool:
    """Whether a RocksDB error text means the disk (or quota) is full."""
    return any(s in text for s in _NO_SPACE)


class _Families(dict[str, Any]):
    """Family objects by name; empty only while the DB is being reopened after a full
    disk (behind the core's lock, which readers do not take): a reader then waits for
    the reopen (tens to hundreds of ms) instead of failing."""

    path = ""
    #: Why the dict is empty: ``closed``, ``reopening``, or why a reopen failed.
    why = "closed"

    def __missing__(self, name: str) -> Any:
        if self.why == "closed":
            raise BrokerClosed(f"the store of {self.path!r} is closed; open a new broker")
        if self.why != "reopening":
            raise StorageFull(self.path, self.why)
        deadline = time.monotonic() + _REOPEN_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.002)
            found = dict.get(self, name)
            if found is not None:
                return found
        raise StorageFull(self.path, "the store is reopening after a full disk; retry")


def _clear_frames(err: BaseException) -> None:
    """Drop the locals of the finished frames in ``err``'s tracebacks (its cause's and
    context's too): a kept error must not keep family objects, and the DB, alive.
    The traceback still prints (files and lines stay)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


class RocksStore:
    """The broker's RocksDB directory: column families, batches, owner file.

    :param path: the data directory (created if missing).
    :param durability: one of :data:`DURABILITY_MODES`.
    :raises BrokerLocked: when another process (or another broker in this one) owns it.
    """

    # Directories a read-write store of this process has open (see is_open_here).
    _open_here: ClassVar[set[Path]] = set()

    @classmethod
    def is_open_here(cls, path: str | os.PathLike[str]) -> bool:
        """Whether a store of this process holds ``path`` (RocksDB's lock is per process,
        so another process's probe of it cannot tell, and a probe here would drop it)."""
        return Path(path).resolve() in cls._open_here

    def __init__(self, path: str | os.PathLike[str], durability: str = "wal") -> None:
        if durability not in DURABILITY_MODES:
            raise InvalidArgument(
                f"durability must be one of {', '.join(DURABILITY_MODES)}, got {durability!r}"
            )
        self.path = Path(path).resolve()
        self.durability = durability
        self.path.mkdir(parents=True, exist_ok=True)
        self._cache = Cache(BLOCK_CACHE_BYTES)
        self.cf = _Families()
        self.handle = _Families()
        self.cf.path = self.handle.path = str(self.path)
        # Why writes are refused (a full disk), or None; and when resume() last tried.
        self._refused: str | None = None
        self._probed = 0.0
        # Errors raised for a full disk or a failed read: their tracebacks hold frames
        # whose locals may hold family objects or iterators, which would keep the DB
        # (and its LOCK) alive after close() or a resume; _release() clears them.
        self._raised: weakref.WeakSet[BaseException] = weakref.WeakSet()
        self._open(read_only=False)
        # Sends and aborts write with write_opt; background writes with lazy_opt.
        self.write_opt, self.lazy_opt = write_options(durability)

    def _open(self, read_only: bool) -> None:
        cfs = {name: options_for(self._cache, name) for name in COLUMN_FAMILIES}
        access = AccessType.read_only() if read_only else AccessType.read_write()
        try:
            self.db = Rdict(
                str(self.path), options_for(self._cache), column_families=cfs, access_type=access
            )
        except Exception as e:
            text = str(e)
            if is_no_space(text):  # before the lock test: the cause, not a symptom
                raise StorageFull(str(self.path), text) from e
            if "lock" in text.lower():
                raise BrokerLocked(str(self.path), self._holder()) from e
            raise BrokerError(f"cannot open RocksDB at {self.path}: {text}") from e
        if not read_only:
            self._open_here.add(self.path)  # the class's set: shared by every store
            try:
                self._write_owner()
            except OSError as e:
                self._release()
                raise StorageFull(str(self.path), f"writing {OWNER_FILE}: {e}") from e
        self.cf.update({name: self.db.get_column_family(name) for name in COLUMN_FAMILIES})
        self.handle.update(
            {name: self.db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        )

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

    #: ``batch()``: a new raw-mode write batch. The class's own C call, no Python frame
    #: (a send makes one per call: ~0.1 us less than a method; issue 16).
    batch: Callable[[], WriteBatch] = staticmethod(functools.partial(WriteBatch, True))

    def write(self, batch: WriteBatch, lazy: bool = False) -> None:
        """Apply ``batch`` atomically; ``lazy`` for writes a crash may repeat.

        :raises StorageFull: the disk is full; nothing of ``batch`` was written.
        :raises BrokerError: RocksDB failed otherwise; nothing was written.
        """
        try:
            self.db.write(batch, self.lazy_opt if lazy else self.write_opt)
        except Exception as e:
            raise self._write_error(e) from e

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        """Write one ``key`` of family ``cf`` durably (as :meth:`write` does a batch).

        :raises StorageFull: the disk is full; nothing was written.
        :raises BrokerError: RocksDB failed otherwise; nothing was written.
        """
        try:
            self.cf[cf].put(key, value, self.write_opt)
        except Exception as e:
            raise self._write_error(e) from e

    def _write_error(self, e: Exception) -> BrokerError:
        if isinstance(e, BrokerError):
            return e
        text = str(e)
        if self._refused is not None or is_no_space(text):
            if self._refused is None:
                self._refused = text
                log.warning("writes refused on %s: %s", self.path, text)
            err = StorageFull(str(self.path), text)
            self._raised.add(err)
            return err
        return BrokerError(f"RocksDB write failed in {self.path}: {text}")

    @property
    def writable(self) -> bool:
        """False while writes are refused after a full disk (see :meth:`resume`)."""
        return self._refused is None

    def resume_due(self) -> bool:
        """Whether :meth:`resume` should try now: writes are refused, the last try was
        :data:`RESUME_PROBE_S` ago, and the disk seems to have room for the reopen."""
        if self._refused is None or time.monotonic() - self._probed < RESUME_PROBE_S:
            return False
        self._probed = time.monotonic()
        try:
            st = os.statvfs(self.path)
            wal = sum(p.stat().st_size for p in self.path.glob("*.log"))
        except OSError:
            return True
        return st.f_bavail * st.f_frsize >= wal + _RESUME_SLACK_BYTES

    def resume(self) -> bool:
        """Reopen the DB in place to leave RocksDB's refusing state after a full disk;
        returns whether writes work again. The WAL replays everything acknowledged.
        Callers hold every writer off (the core's lock) and have dropped the family
        objects they keep: a live one keeps the old DB, and its lock, open. If the
        reopen fails, the DB is opened read-only so reads go on, and a later call
        tries again."""
        self.cf.why = self.handle.why = "reopening"
        try:
            return self._reopen()
        finally:
            if not self.cf:  # not even a read-only open: say so, at once
                self.cf.why = self.handle.why = f"cannot reopen {self.path}: see the log"

    def _reopen(self) -> bool:
        self._release()
        try:
            self._open(read_only=False)
        except ChronoqError as e:
            # Log text, never the error: a handler that keeps records would keep its
            # traceback's frames alive, and their family objects hold the DB open.
            log.warning("cannot resume writing on %s yet: %s", self.path, str(e))
            try:
                self._open(read_only=True)
            except ChronoqError as again:
                log.error("cannot reopen %s even read-only: %s", self.path, str(again))
            return False
        self._refused = None
        log.warning("writes resumed on %s", self.path)
        return True

    def _release(self) -> None:
        """Close the DB whatever state it is in, and drop every family object so its
        LOCK goes (a DB that refuses writes raises on close)."""
        db = self.__dict__.pop("db", None)
        self._open_here.discard(self.path)
        if db is not None:
            try:
                db.close()
            except Exception as e:  # noqa: BLE001  # a refusing DB still releases once dropped
                log.warning("closing %s: %s", self.path, str(e))
        self.cf.clear()
        self.handle.clear()
        del db
        for err in list(self._raised):
            _clear_frames(err)
        self._raised.clear()
        if held_here(self.path / "LOCK"):
            gc.collect()  # a cycle still holds the DB, and so its LOCK: free it now

    def scan(self, cf: str, lower: bytes, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` ``(key, value)`` pairs of ``cf`` in ``[lower, upper)``, in order."""
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        try:
            # islice rather than a Python loop: ~0.26 against ~0.38 us per row
            out: list[tuple[bytes, bytes]] = list(
                itertools.islice(self.cf[cf].items(from_key=lower, read_opt=opt), limit)
            )
            if out and out[-1][0] >= upper:  # belt and braces: bounds misbehaved in some builds
                del out[bisect.bisect_left(out, (upper,)) :]  # raw mode: bytes keys, in order
            if len(out) < limit:  # ended early: at the bound, the end, or a bad block
                self._check_stop(cf, K.next_key(out[-1][0]) if out else lower, upper)
        except Exception as e:
            raise self._read_error(e, cf) from e
        return out

    def _check_stop(self, cf: str, at: bytes, upper: bytes) -> None:
        """Raise RocksDB's error if a scan stopped at ``at`` because of it: rocksdict's
        ``items()`` ends quietly at a corrupted block (one seek to tell)."""
        opt = ReadOptions()
        opt.set_iterate_upper_bound(upper)
        it = self.cf[cf].iter(opt)
        it.seek(at)
        it.status()

    def _read_error(self, e: Exception, cf: str) -> BrokerError:
        if isinstance(e, BrokerError):
            return e
        err = BrokerError(
            f"RocksDB read of {cf!r} failed in {self.path}: {str(e)[:300]}; if it says "
            "Corruption, stop the broker and run `chronoq broker check --data-dir` on it"
        )
        self._raised.add(err)
        return err

    def count(self, cf: str, lower: bytes, upper: bytes) -> int:
        """How many keys ``cf`` has in ``[lower, upper)`` (a keys-only scan)."""
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        try:
            it = self.cf[cf].iter(opt)
            it.seek(lower)
            n = 0
            while it.valid():
                n += 1
                it.next()
        except Exception as e:
            raise self._read_error(e, cf) from e
        return n

    def last_key(self, cf: str, lower: bytes, upper: bytes) -> bytes | None:
        """The greatest key of ``cf`` in ``[lower, upper)``, if any."""
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        try:
            it = self.cf[cf].iter(opt)
            it.seek_for_prev(upper)
            while it.valid():
                key: bytes = it.key()
                if lower <= key < upper:
                    return key
                it.prev()
        except Exception as e:
            raise self._read_error(e, cf) from e
        return None

    def close(self) -> None:
        """Flush memtables (so ``fast`` mode loses nothing on a clean close) and close;
        the directory is released even when RocksDB fails to flush or close."""
        try:
            self.db.flush(True)
        except Exception as e:  # noqa: BLE001  # a full disk: the WAL has every write
            log.warning("flush on close failed for %s: %s", self.path, str(e))
        self._release()
        self.cf.why = self.handle.why = "closed"
