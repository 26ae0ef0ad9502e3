"""Job-start lateness over a recent window, from the delivery trace that
``chronoq run --trace`` writes (:mod:`scheduler.trace_format`): :class:`TraceIndex`
and :func:`lateness_report`.

Lateness is ``started_ms - deliver_at_ms`` (``dispatched_ms`` when the body
never started; lines with neither are left out), as the delivery report
computes it, and the percentiles are nearest-rank like ``chronoq report``'s
(the smallest value with at least P % of the values at or below it), here in
plain Python over the deliveries that finished within the window.

Trace files only grow (and are rotated, the oldest deleted), so the index keeps
each file's ``(finished_ms, lateness)`` pairs in compact arrays and reads only
what was appended since the last request: a page reloaded every few seconds
costs the new lines, not the whole trace. It holds the newest files up to about
:data:`MAX_LINES` deliveries (16 bytes each); a file last written before the
window is not read.
"""

from __future__ import annotations

import json
import math
import re
import threading
from array import array
from pathlib import Path
from typing import Any

from scheduler.trace_format import FILE_GLOB

#: About the most deliveries the index holds (the newest files').
MAX_LINES = 1_000_000
#: Most points of the CDF.
CDF_POINTS = 200
#: Bytes read from a file at a time.
CHUNK = 8 * 1024 * 1024

#: The times of a line as :class:`workers.trace.DeliveryTrace` writes it (compact, the
#: fields in schema order): a search is several times cheaper than ``json.loads``.
#: Strings before them are JSON-escaped, so their quotes cannot fake a match.
_TIMES = re.compile(
    rb'"deliver_at_ms":(-?\d+),"fired_ms":(?:-?\d+|null),"dispatched_ms":(-?\d+|null),'
    rb'"started_ms":(-?\d+|null),"finished_ms":(-?\d+)'
)


def nearest_rank(ordered: list[int], fraction: float) -> int:
    """The nearest-rank percentile of the sorted ``ordered`` (not empty)."""
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[max(rank, 1) - 1]


def cdf(ordered: list[int], points: int = CDF_POINTS) -> list[list[float]]:
    """Up to ``points`` ``[lateness_ms, fraction]`` pairs of the sorted ``ordered``:
    at each, the fraction of values at or below it (the last pair is the max, 1.0)."""
    n = len(ordered)
    out: list[list[float]] = []
    for i in range(1, min(points, n) + 1):
        idx = math.ceil(i * n / min(points, n)) - 1
        value = ordered[idx]
        if out and out[-1][0] == value:
            out[-1][1] = (idx + 1) / n
        else:
            out.append([value, (idx + 1) / n])
    return out


def parse_line(line: bytes) -> tuple[int, int] | None:
    """``(finished_ms, lateness_ms)`` of one trace line, or ``None`` (no lateness, a
    line being written, not a trace line)."""
    m = _TIMES.search(line)
    if m is not None:
        due, dispatched, started, finished = m.groups()
        begun = started if started != b"null" else dispatched
        return None if begun == b"null" else (int(finished), int(begun) - int(due))
    try:  # written some other way (spaces, another field order): parse it
        rec = json.loads(line)
        if not isinstance(rec, dict):
            return None
        start = rec.get("started_ms")
        if start is None:
            start = rec.get("dispatched_ms")
        due_ms, end = rec.get("deliver_at_ms"), rec.get("finished_ms")
        if start is None or due_ms is None or end is None:
            return None
        return int(end), int(start - due_ms)
    except (ValueError, TypeError):
        return None


class _FileIndex:
    """The deliveries of one trace file read so far."""

    __slots__ = ("finished", "late", "offset")

    def __init__(self) -> None:
        self.offset = 0  # bytes read: always the end of a whole line
        self.finished = array("q")
        self.late = array("q")

    def read_more(self, path: Path) -> None:
        """Parse the whole lines appended since the last call."""
        with path.open("rb") as f:
            f.seek(self.offset)
            rest = b""
            while chunk := f.read(CHUNK):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()  # a line still being written waits for next time
                for line in lines:
                    got = parse_line(line)
                    if got is not None:
                        self.finished.append(got[0])
                        self.late.append(got[1])
                self.offset += sum(len(line) + 1 for line in lines)


class TraceIndex:
    """The lateness of the deliveries in one trace directory (see the module).

    :param directory: the trace directory (it may not exist yet).
    :param max_lines: about the most deliveries held.
    """

    def __init__(self, directory: Path, max_lines: int = MAX_LINES) -> None:
        self.directory = directory
        self._max = max_lines
        self._files: dict[str, _FileIndex] = {}
        self._lock = threading.Lock()  # requests run on several threads

    @property
    def available(self) -> bool:
        """Whether the directory exists."""
        return self.directory.is_dir()

    def lateness(self, since_ms: int) -> list[int]:
        """The lateness of each delivery that finished at or after ``since_ms``."""
        with self._lock:
            self._refresh(since_ms)
            out: list[int] = []
            for fi in self._files.values():
                out.extend(
                    late for end, late in zip(fi.finished, fi.late, strict=True) if end >= since_ms
                )
            return out

    def _refresh(self, since_ms: int) -> None:
        paths = sorted(self.directory.glob(FILE_GLOB), key=lambda p: p.name, reverse=True)
        kept: dict[str, _FileIndex] = {}
        held = 0
        for path in paths:  # newest first
            if held >= self._max:
                break
            try:
                st = path.stat()
                fi = self._files.get(path.name)
                if fi is None and st.st_mtime * 1000 < since_ms:
                    continue  # nothing in it finished within the window
                if fi is None or st.st_size < fi.offset:  # new, or replaced by a shorter one
                    fi = _FileIndex()
                if st.st_size > fi.offset:
                    fi.read_more(path)
            except OSError:
                continue  # rotated away meanwhile
            kept[path.name] = fi
            held += len(fi.late)
        self._files = kept  # files rotated away, or beyond the bound, are forgotten


def lateness_report(index: TraceIndex | None, since_ms: int) -> dict[str, Any]:
    """The ``api/lateness`` document over deliveries finished since ``since_ms``.

    :param index: the trace's index; ``None`` or a missing directory: not available.
    """
    doc: dict[str, Any] = {
        "available": False,
        "count": 0,
        "p50_ms": None,
        "p99_ms": None,
        "p999_ms": None,
        "max_ms": None,
        "cdf": [],
    }
    if index is None or not index.available:
        return doc
    ordered = sorted(index.lateness(since_ms))
    doc.update(available=True, count=len(ordered))
    if ordered:
        doc.update(
            p50_ms=nearest_rank(ordered, 0.5),
            p99_ms=nearest_rank(ordered, 0.99),
            p999_ms=nearest_rank(ordered, 0.999),
            max_ms=ordered[-1],
            cdf=cdf(ordered),
        )
    return doc


__all__ = [
    "CDF_POINTS",
    "MAX_LINES",
    "TraceIndex",
    "cdf",
    "lateness_report",
    "nearest_rank",
    "parse_line",
]
