"""Repair of a damaged embedded broker directory: salvage, then restore the invariants.

:func:`repair_directory` works on a directory no process holds (take a copy
first: repair changes it in place):

1. It checks the directory (:func:`~broker_adapter.embedded.check.check_directory`).
2. Salvage: from each family with a checksum error it reads what it still can with
   checksums off (a flipped byte in a value leaves the other rows of its block
   readable; a record that no longer decodes is dropped below).
3. If RocksDB cannot open the directory (a missing ``CURRENT``, a garbage
   ``MANIFEST``) or a family had a checksum error, RocksDB's own repair
   (``Rdict.repair``) rebuilds the MANIFEST from the table files and the WAL; a
   table file it cannot read is set aside in ``lost/`` (and its rows are gone,
   except what step 2 salvaged, which is written back).
4. The broker's invariants (see :mod:`~broker_adapter.embedded.check`): unsound
   records, dangling ``keys`` and ``moves`` entries and bad group notes are
   deleted; wheel entries below the fire position are re-armed (the fire position
   moves back to them, so they fire on the next start); counters are recounted;
   the sequence high-water mark moves beyond every number used.
5. It checks again and reports what was lost: messages by count and id range (the
   ids of keyed ones whose record is gone, and the pending count the counters
   claimed against what was found).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import Cache, Rdict, ReadOptions

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.check import (
    Checker,
    CheckReport,
    check_directory,
    open_read_only,
    record_problem,
    refuse_if_held,
)
from broker_adapter.embedded.core import SEQ_BLOCK
from broker_adapter.embedded.rocks_options import options_for
from broker_adapter.embedded.store import RocksStore
from broker_adapter.errors import BrokerError

_RECORD_FAMILIES = (K.CF_WHEEL, K.CF_READY, K.CF_ABORTED)


@dataclass
class RepairReport:
    """What :func:`repair_directory` did and what was lost.

    :ivar before: the check before repairing; ``after``: the check after.
    :ivar rocksdb_repair: why RocksDB's repair ran, or ``None``.
    :ivar salvaged: rows read past checksum errors and written back.
    :ivar actions: what was changed, by kind, with counts.
    :ivar lost: ids of messages found lost (wheel keys where the id is unreadable).
    :ivar pending_claimed: pending messages the counters claimed before.
    :ivar pending_found: pending messages found after.
    """

    path: str
    before: CheckReport
    after: CheckReport | None = None
    rocksdb_repair: str | None = None
    salvaged: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    pending_claimed: int = 0
    pending_found: int = 0
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        """The exit code of the check after repair (0: the directory is sound now)."""
        return 2 if self.after is None else self.after.exit_code

    def lost_range(self) -> tuple[str, str] | None:
        """The first and last lost message id (ids sort by first due time)."""
        ids = sorted(i for i in self.lost if " " not in i)
        return (ids[0], ids[-1]) if ids else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form."""
        span = self.lost_range()
        return {
            "path": self.path,
            "before": self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
            "rocksdb_repair": self.rocksdb_repair,
            "salvaged": self.salvaged,
            "actions": self.actions,
            "lost": {
                "count": len(self.lost),
                "first_id": span[0] if span else None,
                "last_id": span[1] if span else None,
                "examples": self.lost[:5],
            },
            "pending_claimed": self.pending_claimed,
            "pending_found": self.pending_found,
            "seconds": round(self.seconds, 3),
        }

    def describe(self) -> str:
        """A report for people."""
        lines = [self.before.describe(), f"repair of {self.path}:"]
        if self.rocksdb_repair:
            lines.append(f"  RocksDB repair ran ({self.rocksdb_repair})")
        if self.salvaged:
            lines.append(f"  salvaged {self.salvaged} rows past checksum errors")
        for kind, n in sorted(self.actions.items()):
            lines.append(f"  {kind}: {n}")
        span = self.lost_range()
        lost = f"  lost: {len(self.lost)} messages known by id"
        if span:
            lost += f" ({span[0]} .. {span[1]})"
        lines.append(lost)
        lines.append(
            f"  pending: the counters claimed {self.pending_claimed}, {self.pending_found} found"
        )
        if self.after is not None:
            lines.append(self.after.describe())
        return "\n".join(lines)


def _salvage(root: Path, families: list[str]) -> dict[str, list[tuple[bytes, bytes]]]:
    """Rows of ``families`` read with checksums off, skipping blocks that still fail."""
    out: dict[str, list[tuple[bytes, bytes]]] = {}
    try:
        db = open_read_only(root)
    except Exception:  # noqa: BLE001 - nothing to salvage from a DB that does not open
        return out
    try:
        for family in families:
            out[family] = _salvage_family(db, family)
    finally:
        db.close()
    return out


_WIDTH = 24  # bytes of the keys' integer view when searching past a bad block


def _salvage_family(db: Rdict, family: str) -> list[tuple[bytes, bytes]]:
    rows: list[tuple[bytes, bytes]] = []
    start: bytes | None = None  # None: from the first key
    while True:
        it = _iter(db, family)
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        read = len(rows)
        try:
            while it.valid():
                rows.append((it.key(), it.value()))
                it.next()
            it.status()
            return rows
        except Exception:  # noqa: BLE001,S110 - an unreadable block: search past it
            pass
        # past the last row read, or past the last target if it gave nothing new
        if len(rows) > read:
            after = rows[-1][0]
        else:
            after = b"" if start is None else start
        start = _past_bad_block(db, family, after)
        if start is None:
            return rows


def _iter(db: Rdict, family: str) -> Any:
    # A fresh iterator per seek: one that met a bad block keeps failing.
    opt = ReadOptions()
    opt.set_verify_checksums(False)
    opt.fill_cache(False)  # type: ignore[call-arg]  # the .pyi misses its argument
    return db.get_column_family(family).iter(opt)


def _past_bad_block(db: Rdict, family: str, after: bytes) -> bytes | None:
    """The smallest seek target beyond ``after`` that lands on a readable key, or
    ``None`` when nothing readable follows. Keys are read as :data:`_WIDTH`-byte
    integers; as the target grows a seek lands in the bad block, then in a readable
    one, then past the end: a binary search finds the boundary."""

    def lands(target: int) -> str:
        it = _iter(db, family)
        it.seek(target.to_bytes(_WIDTH, "big"))
        try:
            it.status()  # first: raises inside the bad block
        except Exception:  # noqa: BLE001 - still inside the bad block
            return "bad"
        return "ok" if it.valid() else "end"

    top = 1 << (8 * _WIDTH)
    lo = int.from_bytes(after[:_WIDTH].ljust(_WIDTH, b"\0"), "big")
    hi = top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if lands(mid) == "bad":
            lo = mid
        else:
            hi = mid
    if hi >= top or lands(hi) != "ok":
        return None
    return hi.to_bytes(_WIDTH, "big")


def _write_back(store: RocksStore, salvage: dict[str, list[tuple[bytes, bytes]]]) -> int:
    """Put salvaged rows the repaired DB lacks; returns how many."""
    n = 0
    topics = {
        int(K.U16.unpack(v)[0]): k[1:].decode(errors="replace")
        for k, v in store.scan(K.CF_META, K.META_TOPIC, b"U", 1 << 30)
    }
    for family, rows in salvage.items():
        cf, handle = store.cf[family], store.handle[family]
        batch = store.batch()
        for key, value in rows:
            if family in _RECORD_FAMILIES:
                wkey = key[2:] if family == K.CF_READY else key
                record = value[8:] if family == K.CF_ABORTED else value
                if record_problem(wkey, record, topics) is not None:
                    continue  # garbled: dropped (and reported as lost below)
            if cf.get(key) is None:
                batch.put(key, value, handle)
                n += 1
        store.write(batch)
    return n


def _fix(store: RocksStore, report: RepairReport) -> None:
    """Restore the invariants on the open ``store``, noting actions and losses."""
    scratch = CheckReport(report.path)
    checker = Checker(store.db, scratch)
    checker.run()
    report.pending_claimed = sum(
        K.U64X2.unpack(v)[0] for k, v in checker.meta.items() if k[:1] == K.META_COUNTERS
    )
    report.lost.extend(checker.lost)
    batch = store.batch()
    for family, key in checker.drop:
        batch.delete(key, store.handle[family])
        report.actions[f"deleted from {family}"] = (
            report.actions.get(f"deleted from {family}", 0) + 1
        )
    h_meta = store.handle[K.CF_META]
    if checker.rearm_from is not None:
        batch.put(K.META_FIRED_UPTO, checker.rearm_from, h_meta)
        report.actions["fire position moved back (re-armed)"] = scratch.problems[
            "wheel_below_fire_position"
        ].count
    pending = dict(checker.pending)  # dropped records were never counted
    for tid in set(pending) | {
        int(K.U16.unpack_from(k, 1)[0]) for k in checker.meta if k[:1] == K.META_COUNTERS
    }:
        key = K.META_COUNTERS + K.tid_bytes(tid)
        old = checker.meta.get(key)
        fired = int(K.U64X2.unpack(old)[1]) if old else 0
        value = K.U64X2.pack(pending.get(tid, 0), max(fired, checker.ready.get(tid, 0)))
        if value != old:
            batch.put(key, value, h_meta)
            report.actions["counters recounted"] = report.actions.get("counters recounted", 0) + 1
    if checker.max_seq >= checker.seq:
        batch.put(K.META_SEQ, K.U64.pack(checker.max_seq + 1 + SEQ_BLOCK), h_meta)
        report.actions["sequence high-water mark raised"] = 1
    store.write(batch)
    report.pending_found = sum(pending.values())


def repair_directory(path: str | os.PathLike[str]) -> RepairReport:
    """Repair the data directory ``path`` in place (see the module docstring).

    :raises BrokerLocked: when a live process holds it.
    :raises BrokerError: when even RocksDB's repair cannot make it open.
    """
    root = Path(path).resolve()
    start = time.perf_counter()
    refuse_if_held(root)
    before = check_directory(root)
    report = RepairReport(str(root), before)
    salvage = _salvage(root, before.bad_families) if before.bad_families else {}
    if before.unusable or before.bad_families:
        report.rocksdb_repair = before.unusable or f"checksum errors in {before.bad_families}"
        try:
            Rdict.repair(str(root), options_for(Cache(8 * 1024 * 1024)))
        except Exception as e:
            raise BrokerError(f"RocksDB's repair of {root} failed: {e}") from e
    store = RocksStore(root)  # read-write: creates the families the repair did not find
    try:
        report.salvaged = _write_back(store, salvage)
        _fix(store, report)
    finally:
        store.close()
    report.after = check_directory(root)
    report.seconds = time.perf_counter() - start
    return report


__all__ = ["RepairReport", "repair_directory"]
