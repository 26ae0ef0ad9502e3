"""Small helpers shared by the bench scripts: percentiles, process memory and CPU,
and the labelled summary blocks they print.

Memory figures come from ``/proc/<pid>/status``: ``VmRSS`` (resident now) and
``VmHWM`` (this process's own resident peak). ``ru_maxrss`` is not used: for a
child of a large parent it starts at the parent's peak (see ``shared/NOTES.md``).
Sizes are printed in MB = 10**6 bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence

#: The lateness percentiles every bench prints.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)


def percentile_name(p: float) -> str:
    """``50.0 -> "p50"``, ``99.9 -> "p99.9"``."""
    return f"p{p:g}"


def percentiles(
    values: Iterable[float], ps: Sequence[float] = PERCENTILES
) -> dict[str, float | None]:
    """Nearest-rank percentiles (the smallest value with at least p % of the data at
    or below it), plus ``max`` and ``count``; ``None`` for each figure of empty data."""
    data = sorted(values)
    n = len(data)
    out: dict[str, float | None] = {}
    for p in ps:
        out[percentile_name(p)] = data[max(0, math.ceil(p / 100.0 * n) - 1)] if n else None
    out["max"] = data[-1] if n else None
    out["count"] = float(n)
    return out


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The ``Vm*`` lines of ``/proc/<pid>/status``, in bytes (empty off Linux)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Vm") and line.rstrip().endswith("kB"):
                    name, _, rest = line.partition(":")
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def rss_bytes() -> int:
    """Resident set size of this process now (``VmRSS``), bytes; 0 if unknown."""
    return proc_status().get("VmRSS", 0)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (``VmHWM``), bytes; 0 if unknown."""
    return proc_status().get("VmHWM", 0)


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads)."""
    t = os.times()
    return t.user + t.system


def dir_bytes(path: str) -> int:
    """Total size of the files under ``path`` (0 if it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def load_average() -> str:
    """The machine's load averages over 1, 5 and 15 minutes, ``"5.89 6.54 6.32"``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def mb(n_bytes: float) -> str:
    """``123456789 -> "123.5 MB"`` (MB = 10**6 bytes)."""
    return f"{n_bytes / 1e6:.1f} MB"


def num(n: float) -> str:
    """A count or rate with thousands separators, no decimals."""
    return f"{n:,.0f}"


def ms(v: float | None) -> str:
    """A duration in ms: 2 decimals below 10 ms, 1 below 1 s, none above."""
    if v is None:
        return "-"
    if abs(v) < 10:
        return f"{v:.2f}"
    if abs(v) < 1000:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def format_percentiles(pct: Mapping[str, float | None]) -> str:
    """``"P50 0.61  P90 0.93  P99 1.40  P99.9 3.20  max 5.10"`` (ms)."""
    parts = [f"{k.upper()} {ms(v)}" for k, v in pct.items() if k.startswith("p")]
    parts.append(f"max {ms(pct.get('max'))}")
    return "  ".join(parts)


def print_block(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """Print a titled block of ``label  value`` rows, labels aligned."""
    width = max((len(label) for label, _ in rows), default=0)
    print(f"== {title} ==")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value}")
    print(flush=True)
