"""Job-start lateness over a recent window, from the delivery trace that
``chronoq run --trace`` writes (:mod:`scheduler.trace_format`): :func:`lateness_report`.

Lateness is ``started_ms - deliver_at_ms`` (``dispatched_ms`` when the body
never started; lines with neither are left out), as the delivery report
computes it, and the percentiles are nearest-rank like ``chronoq report``'s
(the smallest value with at least P % of the values at or below it), here in
plain Python over the lines that finished within the window. Reading is
bounded: the newest files first, at most :data:`MAX_LINES` lines, and a file
last written before the window is not opened.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scheduler.trace_format import FILE_GLOB

#: Most trace lines read per report (the newest).
MAX_LINES = 1_000_000
#: Most points of the CDF.
CDF_POINTS = 200


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


def _lateness(line: str, since_ms: int) -> int | None:
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict) or (rec.get("finished_ms") or 0) < since_ms:
            return None
        start = rec.get("started_ms")
        if start is None:
            start = rec.get("dispatched_ms")
        due = rec.get("deliver_at_ms")
        if start is None or due is None:
            return None
        return int(start - due)
    except (ValueError, TypeError):
        return None  # a line being written, or not a trace line


def read_lateness(trace_dir: Path, since_ms: int, max_lines: int = MAX_LINES) -> list[int]:
    """The lateness of every delivery in ``trace_dir`` that finished at or after
    ``since_ms`` (the newest ``max_lines`` lines at most), unsorted."""
    files = sorted(trace_dir.glob(FILE_GLOB), key=lambda p: p.name, reverse=True)
    values: list[int] = []
    budget = max_lines
    for path in files:
        try:
            if path.stat().st_mtime * 1000 < since_ms:
                continue  # nothing in it finished within the window
            with path.open(encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError:
            continue  # rotated away meanwhile
        for line in reversed(lines[-budget:]):
            late = _lateness(line, since_ms)
            if late is not None:
                values.append(late)
        budget -= min(budget, len(lines))
        if budget <= 0:
            break
    return values


def lateness_report(trace_dir: Path | None, since_ms: int) -> dict[str, Any]:
    """The ``api/lateness`` document over deliveries finished since ``since_ms``.

    :param trace_dir: the trace directory; ``None`` or a missing one: not available.
    """
    empty: dict[str, Any] = {
        "available": False,
        "count": 0,
        "p50_ms": None,
        "p99_ms": None,
        "p999_ms": None,
        "max_ms": None,
        "cdf": [],
    }
    if trace_dir is None or not trace_dir.is_dir():
        return empty
    ordered = sorted(read_lateness(trace_dir, since_ms))
    doc = dict(empty, available=True, count=len(ordered))
    if ordered:
        doc.update(
            p50_ms=nearest_rank(ordered, 0.5),
            p99_ms=nearest_rank(ordered, 0.99),
            p999_ms=nearest_rank(ordered, 0.999),
            max_ms=ordered[-1],
            cdf=cdf(ordered),
        )
    return doc


__all__ = ["CDF_POINTS", "MAX_LINES", "cdf", "lateness_report", "nearest_rank", "read_lateness"]
