"""Offline check of an embedded broker's data directory: checksums and invariants.

:func:`check_directory` opens the directory read-only (it refuses one a live
process holds: ask that process for a backup and check the copy), reads every key
of every column family with checksums verified, and checks the broker's own
invariants (the key layout is in :mod:`~broker_adapter.embedded.keys`):

* every ``wheel``, ``ready`` and ``aborted`` value is a record that decodes, of a
  registered topic, whose due time is the one in its key;
* no ``wheel`` entry lies below the fire position (it would never fire);
* every ``keys`` entry and every ``moves`` entry leads to a message: a ``wheel``
  entry, an ``aborted`` tombstone or a ``ready`` record at its current wheel key;
* each topic's pending counter equals its ``wheel`` entries, and its fired counter
  is at least its ``ready`` entries;
* the sequence high-water mark lies beyond every sequence number used;
* every group cursor belongs to a registered group and topic.

The report counts keys per family and lists problems by kind, each with a few
example message ids or keys. :mod:`~broker_adapter.embedded.repair` fixes what
it can.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Cache, Rdict, ReadOptions

from broker_adapter.embedded import keys as K
from broker_adapter.embedded import store as S
from broker_adapter.embedded.records import HEAD_SIZE, VERSION
from broker_adapter.embedded.rocks_options import options_for
from broker_adapter.errors import BrokerLocked

#: Example ids or keys a report keeps per kind of problem.
EXAMPLES = 5
_HEAD = struct.Struct(">BBHHQQ16sHHI")  # records.py's header, read without decoding JSON


@dataclass
class Problem:
    """One kind of problem: how many were found and a few examples."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str) -> None:
        """Count one more, keeping the first :data:`EXAMPLES` examples."""
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)


@dataclass
class CheckReport:
    """What :func:`check_directory` found.

    :ivar families: keys read per column family.
    :ivar problems: problems by kind (``checksum``, ``dangling_key`` ...).
    :ivar unusable: why the directory could not be opened at all, or ``None``.
    """

    path: str
    families: dict[str, int] = field(default_factory=dict)
    problems: dict[str, Problem] = field(default_factory=dict)
    unusable: str | None = None
    seconds: float = 0.0
    bad_families: list[str] = field(default_factory=list)

    def add(self, kind: str, example: str) -> None:
        """Record one problem of ``kind``."""
        self.problems.setdefault(kind, Problem()).add(example)

    @property
    def exit_code(self) -> int:
        """0 clean, 1 problems found, 2 unusable."""
        return 2 if self.unusable else 1 if self.problems else 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "path": self.path,
            "ok": self.exit_code == 0,
            "unusable": self.unusable,
            "families": self.families,
            "problems": {
                k: {"count": p.count, "examples": p.examples} for k, p in self.problems.items()
            },
            "keys_read": sum(self.families.values()),
            "seconds": round(self.seconds, 3),
        }

    def describe(self) -> str:
        """A report for people."""
        lines = [f"check of {self.path}:"]
        if self.unusable:
            lines.append(f"  UNUSABLE: {self.unusable}")
            lines.append("  run `chronoq broker check --repair` on it (after taking a copy)")
            return "\n".join(lines)
        counts = ", ".join(f"{name} {n}" for name, n in self.families.items())
        lines.append(f"  keys per family: {counts} ({self.seconds:.2f} s)")
        if not self.problems:
            lines.append("  no problems found")
        for kind, p in sorted(self.problems.items()):
            lines.append(f"  {kind}: {p.count} (e.g. {', '.join(p.examples)})")
        return "\n".join(lines)


def holder_of(path: Path) -> str | None:
    """Who holds the directory's RocksDB lock (a live process), or ``None``."""
    if S.RocksStore.is_open_here(path):  # a lock probe here would release it
        return f"this process (pid {os.getpid()})"
    lock = path / "LOCK"
    if not lock.exists():
        return None
    with lock.open("rb") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            try:
                return (path / S.OWNER_FILE).read_text().strip() or "another process"
            except OSError:
                return "another process"
        fcntl.lockf(f, fcntl.LOCK_UN)
    return None


def refuse_if_held(path: Path) -> None:
    """:raises BrokerLocked: when a live process holds ``path``."""
    holder = holder_of(path)
    if holder is not None:
        raise BrokerLocked(str(path), f"process {holder} (check a backup of it instead)")


def open_read_only(path: Path) -> Rdict:
    """The broker's DB at ``path``, read-only (raises RocksDB's own errors)."""
    cache = Cache(8 * 1024 * 1024)
    cfs = {name: options_for(cache, name) for name in K.COLUMN_FAMILIES}
    return Rdict(
        str(path), options_for(cache), column_families=cfs, access_type=AccessType.read_only()
    )


def scan(db: Rdict, family: str, verify: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of ``family`` in order; raises RocksDB's error at a bad block."""
    opt = ReadOptions()
    opt.set_verify_checksums(verify)
    opt.fill_cache(False)  # type: ignore[call-arg]  # the .pyi misses its argument
    it = db.get_column_family(family).iter(opt)
    it.seek_to_first()
    while it.valid():
        yield it.key(), it.value()
        it.next()
    it.status()  # raises on corruption


def record_problem(key: bytes, value: bytes, topics: dict[int, str]) -> str | None:
    """Why ``value`` stored at wheel key ``key`` is not a sound record, or ``None``."""
    if len(value) < HEAD_SIZE:
        return "record_truncated"
    ver, _f, tid, _a, due, _born, _raw, klen, tlen, plen = _HEAD.unpack_from(value)
    if ver != VERSION or HEAD_SIZE + klen + tlen + plen > len(value):
        return "record_garbled"
    if tid not in topics:
        return "record_unknown_topic"
    if due != K.wheel_time(key):
        return "record_wrong_time"
    return None


def msg_id(first: bytes, tid: int) -> str:
    """The message id (hex) of a first wheel key and topic id."""
    return K.make_id(first, tid).hex()


class Checker:
    """One pass over an open DB (read-only here, read-write from repair).

    Besides the report it collects what :mod:`~broker_adapter.embedded.repair` acts
    on: ``drop`` (family, key) of unsound records and dangling entries, ``lost``
    (message ids, or wheel keys where the id is unreadable), and ``rearm_from``, the
    lowest wheel key below the fire position.
    """

    def __init__(self, db: Rdict, report: CheckReport) -> None:
        self.db = db
        self.report = report
        self.topics: dict[int, str] = {}
        self.pending: dict[int, int] = {}
        self.ready: dict[int, int] = {}
        self.max_seq = 0
        self.bad_families: set[str] = set()
        self.drop: list[tuple[str, bytes]] = []
        self.lost: list[str] = []
        self.rearm_from: bytes | None = None
        meta = self.rows(K.CF_META)
        self.meta = dict(meta)
        for key, value in meta:
            if key[:1] == K.META_TOPIC:
                self.topics[int(K.U16.unpack(value)[0])] = key[1:].decode(errors="replace")
        seq = self.meta.get(K.META_SEQ)
        self.seq = int(K.U64.unpack(seq)[0]) if seq else 1
        self.fired_upto = self.meta.get(K.META_FIRED_UPTO) or K.wheel_key(0, 0)

    def rows(self, family: str) -> list[tuple[bytes, bytes]]:
        """A small family read whole (``meta``), checksum errors reported."""
        return list(self.each(family))

    def each(self, family: str) -> Iterator[tuple[bytes, bytes]]:
        """Every row of ``family``, counted; a checksum error is reported and ends it."""
        n = 0
        try:
            for row in scan(self.db, family):
                n += 1
                yield row
        except Exception as e:  # noqa: BLE001 - RocksDB's corruption error, reported
            self.bad_families.add(family)
            self.report.bad_families = sorted(self.bad_families)
            self.report.add("checksum", f"{family} after {n} keys: {str(e)[:160]}")
        self.report.families[family] = self.report.families.get(family, 0) + n

    def run(self) -> None:
        """Check every family and invariant, adding to the report."""
        for family in K.COLUMN_FAMILIES:
            if family != K.CF_META:
                getattr(self, "check_" + family)()
        self.check_counters()

    def _record(self, family: str, key: bytes, wkey: bytes, value: bytes) -> int | None:
        why = record_problem(wkey, value, self.topics)
        if why is not None:
            self.report.add(why, f"{family}:{key.hex()}")
            self.drop.append((family, key))
            if family == K.CF_WHEEL:
                self.lost.append(f"wheel key {key.hex()}")
            return None
        self.max_seq = max(self.max_seq, int.from_bytes(wkey[8:16], "big"))
        return (value[2] << 8) | value[3]

    def check_wheel(self) -> None:
        for key, value in self.each(K.CF_WHEEL):
            tid = self._record(K.CF_WHEEL, key, key, value)
            if tid is not None:
                self.pending[tid] = self.pending.get(tid, 0) + 1
            if key < self.fired_upto:
                self.report.add("wheel_below_fire_position", key.hex())
                if self.rearm_from is None:
                    self.rearm_from = key

    def check_ready(self) -> None:
        for key, value in self.each(K.CF_READY):
            tid = self._record(K.CF_READY, key, key[2:], value)
            if tid is not None:
                self.ready[tid] = self.ready.get(tid, 0) + 1
                if tid != int(K.U16.unpack_from(key)[0]):
                    self.report.add("record_wrong_topic", key.hex())

    def check_aborted(self) -> None:
        for key, value in self.each(K.CF_ABORTED):
            self._record(K.CF_ABORTED, key, key, value[8:])

    def holds(self, wkey: bytes, tids: list[int]) -> bool:
        """Whether a message sits at wheel key ``wkey`` (pending, aborted, or fired into
        one of ``tids``); ``True`` when a checksum error hides the answer."""
        get = self.db.get_column_family
        try:
            if get(K.CF_WHEEL).get(wkey) is not None or get(K.CF_ABORTED).get(wkey) is not None:
                return True
            ready = get(K.CF_READY)
            return any(ready.get(K.tid_bytes(t) + wkey) is not None for t in tids)
        except Exception:  # noqa: BLE001 - a bad block, reported as a checksum problem
            return True  # cannot tell: not reported as dangling

    def check_keys(self) -> None:
        moves = self.db.get_column_family(K.CF_MOVES)
        for key, value in self.each(K.CF_KEYS):
            tid = int(K.U16.unpack_from(key)[0])
            first = value[:16]
            current = moves.get(first) or first
            if len(value) != 24 or not self.holds(current, [tid]):
                name = key[2:].decode(errors="replace")
                self.report.add("dangling_key", f"{msg_id(first, tid)} ({name})")
                self.drop.append((K.CF_KEYS, key))
                self.lost.append(msg_id(first, tid))

    def check_moves(self) -> None:
        for first, current in self.each(K.CF_MOVES):
            if not self.holds(current, list(self.topics)):
                self.report.add("dangling_move", first.hex())
                self.drop.append((K.CF_MOVES, first))

    def check_consume(self) -> None:
        for key, value in self.each(K.CF_CONSUME):
            if len(key) != 18 or value[:1] not in (b"R", b"D", b"X"):
                self.report.add("bad_group_note", key.hex())
                self.drop.append((K.CF_CONSUME, key))

    def check_counters(self) -> None:
        groups = set()
        for key, value in self.meta.items():
            kind = key[:1]
            if kind == K.META_GROUP:
                groups.add(value[:2])
            elif kind == K.META_COUNTERS:
                tid = int(K.U16.unpack_from(key, 1)[0])
                pending, fired = K.U64X2.unpack(value)
                if pending != self.pending.get(tid, 0):
                    self.report.add(
                        "counter_mismatch",
                        f"{self.topics.get(tid, tid)}: pending {pending}, found {self.pending.get(tid, 0)}",
                    )
                if fired < self.ready.get(tid, 0):
                    self.report.add(
                        "counter_mismatch", f"{self.topics.get(tid, tid)}: fired {fired} < ready"
                    )
        for tid in set(self.pending) - {
            t for t in self.topics if K.META_COUNTERS + K.tid_bytes(t) in self.meta
        }:
            self.report.add("counter_missing", str(self.topics.get(tid, tid)))
        for key in self.meta:
            if key[:1] == K.META_CURSOR and (
                key[1:3] not in groups or int(K.U16.unpack_from(key, 3)[0]) not in self.topics
            ):
                self.report.add("cursor_unknown_group", key.hex())
        if self.max_seq >= self.seq:
            self.report.add("sequence_behind", f"high-water {self.seq} <= used {self.max_seq}")


def check_directory(path: str | os.PathLike[str]) -> CheckReport:
    """Check the data directory ``path`` (see the module docstring).

    :raises BrokerLocked: when a live process holds it.
    """
    root = Path(path).resolve()
    report = CheckReport(str(root))
    start = time.perf_counter()
    if not root.is_dir():
        report.unusable = "no such directory"
        return report
    refuse_if_held(root)
    try:
        db = open_read_only(root)
    except Exception as e:  # noqa: BLE001 - RocksDB's reason, reported
        report.unusable = f"RocksDB cannot open it: {str(e)[:300]}"
        return report
    try:
        Checker(db, report).run()
    finally:
        db.close()
    report.seconds = time.perf_counter() - start
    return report


__all__ = [
    "CheckReport",
    "Checker",
    "Problem",
    "check_directory",
    "holder_of",
    "open_read_only",
    "record_problem",
    "refuse_if_held",
    "scan",
]
