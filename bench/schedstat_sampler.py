"""Who had the CPUs: a sampler PROCESS reading tasks' ``/proc/.../schedstat`` (issue 16).

Used by ``bench/redis_ab_cpu.py --stall-ms``. The sampler is a separate process (a
thread would take the measured client's GIL): every ``every_s`` it writes one line
with the time, the machine's steal ticks (``/proc/stat``), the runnable tasks now
(``/proc/loadavg``) and, per task, its ns on a CPU and ns waiting in the run queue.
:func:`windows` then charges each late job's window (due -> start) to the tasks: a
window where redis-server or the client waited in the run queue is the machine's
scheduling; one where they neither ran nor waited is a wait in the code.

Run by :class:`Sampler`; by hand: ``python bench/schedstat_sampler.py OUT 0.002
redis=/proc/PID/schedstat ...`` (stops when its stdin closes).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


class Row(NamedTuple):
    """One sample: epoch s, steal ticks, runnable tasks, per task (run ns, wait ns)."""

    t: float
    steal: int
    runnable: int
    tasks: list[tuple[int, int]]


def sample(out: str, every_s: float, paths: Sequence[str]) -> None:
    """The sampler's loop: one line per sample until stdin closes."""
    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    with open(out, "w", encoding="ascii") as f:
        while not stop.is_set():
            t = time.time()
            with open("/proc/stat", encoding="ascii") as s:
                steal = s.readline().split()[8]
            with open("/proc/loadavg", encoding="ascii") as s:
                runnable = s.read().split()[3].split("/")[0]
            vals = []
            for p in paths:
                try:
                    with open(p, encoding="ascii") as s:
                        a = s.read().split()
                    vals.append(f"{a[0]},{a[1]}")
                except OSError:
                    vals.append("0,0")
            f.write(f"{t:.5f} {steal} {runnable} {' '.join(vals)}\n")
            time.sleep(every_s)


class Sampler:
    """A sampler process over ``named`` schedstat paths (name -> path)."""

    def __init__(self, every_ms: float, named: dict[str, str]) -> None:
        self.path = f"/tmp/chronoq-schedstat-{os.getpid()}.txt"
        self.names = list(named)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.path, str(every_ms / 1000)]
            + list(named.values()),
            stdin=subprocess.PIPE,
        )

    def stop(self) -> list[Row]:
        """Stop it; its samples."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        rows = []
        with open(self.path, encoding="ascii") as f:
            for line in f:
                t, steal, runnable, *vals = line.split()
                pairs = [(int(v.split(",")[0]), int(v.split(",")[1])) for v in vals]
                rows.append(Row(float(t), int(steal), int(runnable), pairs))
        os.unlink(self.path)
        return rows


def totals(rows: list[Row], names: list[str]) -> dict[str, tuple[float, float]]:
    """Run and run-queue wait (ms) of each task over the samples."""
    if len(rows) < 2:
        return {}
    a, b = rows[0].tasks, rows[-1].tasks
    return {n: ((b[i][0] - a[i][0]) / 1e6, (b[i][1] - a[i][1]) / 1e6) for i, n in enumerate(names)}


def waits_over(rows: list[Row], names: list[str], ms: float) -> dict[str, int]:
    """Per task: sampling intervals in which it waited ``ms`` or more in the run queue."""
    out = dict.fromkeys(names, 0)
    for r0, r1 in itertools.pairwise(rows):
        for i, n in enumerate(names):
            if (r1.tasks[i][1] - r0.tasks[i][1]) / 1e6 >= ms:
                out[n] += 1
    return out


def window(rows: list[Row], names: list[str], t0: float, t1: float) -> str:
    """The tasks' run/wait (ms), the steal and the most runnable tasks from ``t0`` to
    ``t1`` (epoch s; widened to the samples around them)."""
    i = max(0, next((k for k, r in enumerate(rows) if r.t > t0), len(rows)) - 1)
    j = next((k for k, r in enumerate(rows) if r.t >= t1), len(rows) - 1)
    if j <= i:
        return "no samples"
    a, b = rows[i], rows[j]
    parts = [
        f"{n} {(b.tasks[k][0] - a.tasks[k][0]) / 1e6:.1f}/{(b.tasks[k][1] - a.tasks[k][1]) / 1e6:.1f}"
        for k, n in enumerate(names)
    ]
    runnable = max(r.runnable for r in rows[i : j + 1])
    steal = (b.steal - a.steal) * TICK_MS
    return (
        f"[{(b.t - a.t) * 1000:.1f} ms] run/wait ms: {', '.join(parts)}; steal {steal:.0f} ms;"
        f" runnable max {runnable}"
    )


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    sample(sys.argv[1], float(sys.argv[2]), sys.argv[3:])
