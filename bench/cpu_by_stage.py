"""CPU per job by stage: the embedded dispatcher against APScheduler 3 (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/cpu_by_stage.py                    # N=20,000 due 5-35 s, both
    .venv/bin/python bench/cpu_by_stage.py --n 100000 --system chronoq

The workload and the two systems of ``bench/vs_apscheduler.py`` (its
``run_apscheduler`` and ``run_chronoq``, each in a child process), with probes
wrapped around public methods (this script only; nothing of the library
changes). A probe adds the calling thread's CPU (``time.thread_time``) spent
inside the method, *exclusive* of probes nested in it, to its stage; what a
thread spends outside every probe is its ``rest`` (for a waiting thread: the
wake-ups, and waiting for the GIL after one). Each probe costs ~1-2 us of CPU
per call itself, charged to its stage; compare the rows, not the last us.

Stages, chronoq (``rocksdb://``, app and dispatcher in one process):

* dispatcher thread: ``wait`` (``ReadySignal.wait``: the timed wait to the due
  time), ``fire`` (``GroupRegistry.fire_due``: the chunk's RocksDB write and the
  wheel's bookkeeping), ``take`` (``EmbeddedConsumer._take``), ``dispatch``
  (``PullLoop._dispatch``: decode, route, admit, hooks), ``hand-off``
  (``LocalExecutor.start_job``: the queue put that wakes a pool thread);
* pool threads: ``job`` (``run_job``: the body in its context), ``settle``
  (``RunEnds._finish``: hooks, the ack, the bookkeeping).

APScheduler (``BackgroundScheduler``, ``MemoryJobStore``, ``ThreadPoolExecutor(10)``):

* scheduler thread: ``process`` (``_process_jobs``: due jobs, next run times,
  events), of which ``hand-off`` (``BaseExecutor.submit_job``: the pool's submit);
* pool threads: ``job`` (``run_job``: the body, events).

With ``--fine`` the fire and take stages are split into their parts, each charged
to its enclosing stage: ``fire.core`` (``BrokerCore.fire_due``'s own code),
``.pop`` (``TimingWheel.pop_due``), ``.write`` (``RocksStore.write``), ``.keep``
(``FreshRows.keep``), ``.notify`` (``GroupRegistry.add_ready``), ``.write-held``
(``FireWrites.write``: a held batch's write, its ``RocksStore.write`` inside), ``.scan``
(``RocksStore.scan``) and ``.fresh`` (``FreshRows.rows``).

Per thread group it also prints voluntary and involuntary context switches per
job (``/proc/self/task/<tid>/status``). psutil and APScheduler come with the
``bench`` extra (``pip install 'chronoq[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.job_start_breakdown import thread_switches
from bench.vs_apscheduler import Recorder, run_apscheduler, run_chronoq

_thread_time = time.thread_time


def group_of(name: str) -> str:
    """A thread's group: pools count as one."""
    if name.startswith(("chronoq-job", "ThreadPoolExecutor")):
        return "pool"
    if name in ("bench-dispatcher", "APScheduler"):
        return "scheduler"
    if name.startswith("chronoq-wheel"):
        return "wheel"
    return "main" if name == "MainThread" else "other"


class Probes:
    """Exclusive thread-CPU per (thread group, stage), from wrapped methods."""

    def __init__(self) -> None:
        self.cpu: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self.on = False

    def wrap(self, owner: Any, attr: str, stage: str) -> None:
        """Replace ``owner.attr`` by a probe charging its CPU to ``stage``; a ``stage``
        starting with ``.`` is a part of the enclosing probe's stage (``fire.write``),
        and outside any probe it charges nothing of its own."""
        inner: Callable[..., Any] = getattr(owner, attr)
        local, probes = self._local, self
        part = stage.startswith(".")

        def probe(*args: Any, **kwargs: Any) -> Any:
            if not probes.on:
                return inner(*args, **kwargs)
            stack: list[float] | None = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
                local.names = []
                local.group = group_of(threading.current_thread().name)
            names: list[str] = local.names
            if part and not names:
                return inner(*args, **kwargs)
            name = names[-1].split(".", 1)[0] + stage if part else stage
            stack.append(0.0)  # CPU of probes nested in this call
            names.append(name)
            t0 = _thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                took = _thread_time() - t0
                nested = stack.pop()
                names.pop()
                if stack:
                    stack[-1] += took
                probes.add(local.group, name, took - nested)

        setattr(owner, attr, probe)

    def add(self, group: str, stage: str, cpu: float) -> None:
        key = (group, stage)
        with self._lock:
            self.cpu[key] = self.cpu.get(key, 0.0) + cpu
            self.calls[key] = self.calls.get(key, 0) + 1


def thread_cpu_by_group() -> dict[str, float]:
    """User + system CPU seconds per thread group of this process (live threads)."""
    import psutil  # type: ignore[import-untyped]

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        g = group_of(names.get(t.id, ""))
        out[g] = out.get(g, 0.0) + t.user_time + t.system_time
    return out


def switches_by_group() -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for name, (v, i) in thread_switches().items():
        g = "pool" if name.startswith("chronoq-job") else group_of(name)
        v0, i0 = out.get(g, (0, 0))
        out[g] = (v0 + v, i0 + i)
    return out


def install(system: str, probes: Probes, fine: bool = False) -> None:
    if system == "chronoq" and fine:  # parts of the fire and take stages
        from broker_adapter.embedded.core import BrokerCore
        from broker_adapter.embedded.fire_writes import FireWrites
        from broker_adapter.embedded.fresh import FreshRows
        from broker_adapter.embedded.group_registry import GroupRegistry as Registry
        from broker_adapter.embedded.store import RocksStore
        from broker_adapter.embedded.timing_wheel import TimingWheel

        probes.wrap(BrokerCore, "fire_due", ".core")
        probes.wrap(TimingWheel, "pop_due", ".pop")
        probes.wrap(RocksStore, "write", ".write")
        probes.wrap(RocksStore, "scan", ".scan")
        probes.wrap(FreshRows, "keep", ".keep")
        probes.wrap(FreshRows, "rows", ".fresh")
        probes.wrap(Registry, "add_ready", ".notify")
        probes.wrap(FireWrites, "write", ".write-held")
    if system == "chronoq":
        from broker_adapter.embedded.consumer import EmbeddedConsumer, ReadySignal
        from broker_adapter.embedded.group_registry import GroupRegistry
        from workers.executors import local
        from workers.pull_loop import PullLoop
        from workers.run_ends import RunEnds

        probes.wrap(ReadySignal, "wait", "wait")
        probes.wrap(GroupRegistry, "fire_due", "fire")
        probes.wrap(EmbeddedConsumer, "_take", "take")
        probes.wrap(PullLoop, "_dispatch", "dispatch")
        probes.wrap(local.LocalExecutor, "start_job", "hand-off")
        probes.wrap(local, "run_job", "job")
        probes.wrap(RunEnds, "_finish", "settle")
    else:
        from apscheduler.executors import pool
        from apscheduler.executors.base import BaseExecutor
        from apscheduler.schedulers.base import BaseScheduler

        probes.wrap(BaseScheduler, "_process_jobs", "process")
        probes.wrap(BaseExecutor, "submit_job", "hand-off")
        probes.wrap(pool, "run_job", "job")


def child(args: argparse.Namespace) -> int:
    import psutil

    probes = Probes()
    install(args.child, probes, args.fine)
    proc = psutil.Process()
    rec = Recorder(os.devnull)
    marks: dict[str, Any] = {}
    # Start counting once scheduling is done: hook the first CPU reading
    # vs_apscheduler takes after it (tree_cpu_seconds), and the last (before the grace).
    import bench.vs_apscheduler as vs

    real_tree_cpu = vs.tree_cpu_seconds

    def tree_cpu(p: Any) -> float:
        if "t0" not in marks:
            marks["t0"] = (thread_cpu_by_group(), switches_by_group())
            probes.on = True
        else:
            probes.on = False
            marks["t1"] = (thread_cpu_by_group(), switches_by_group())
        return float(real_tree_cpu(p))

    vs.tree_cpu_seconds = tree_cpu
    run = run_apscheduler if args.child == "apscheduler" else run_chronoq
    args.broker = "embedded"
    args.batch = args.batch or 0
    result = run(args, rec, proc)
    rec.close()
    (cpu0, sw0), (cpu1, sw1) = marks["t0"], marks["t1"]
    out = {
        "cpu_s": result["cpu_s"],
        "started": len(rec.starts),
        "threads": {g: cpu1.get(g, 0.0) - cpu0.get(g, 0.0) for g in cpu1},
        "switches": {
            g: [sw1[g][0] - sw0.get(g, (0, 0))[0], sw1[g][1] - sw0.get(g, (0, 0))[1]] for g in sw1
        },
        "stages": [[g, s, c, probes.calls[(g, s)]] for (g, s), c in probes.cpu.items()],
    }
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


ORDER = {
    "chronoq": ("wait", "fire", "take", "dispatch", "hand-off", "job", "settle"),
    "apscheduler": ("process", "hand-off", "job"),
}


def print_table(system: str, n: int, r: dict[str, Any]) -> None:
    us = 1e6 / n
    print(f"-- {system}: CPU per job {r['cpu_s'] * us:.1f} us (process), {r['started']:,} started")
    print(f"  {'thread / stage':<28} {'us/job':>8} {'calls/job':>10}")
    stages: dict[str, list[tuple[str, float, int]]] = {}
    for g, s, c, k in r["stages"]:
        stages.setdefault(g, []).append((s, c, k))
    for g in ("scheduler", "pool", "wheel", "main", "other"):
        total = r["threads"].get(g, 0.0)
        if total <= 0.0005:
            continue
        v, i = r["switches"].get(g, (0, 0))
        print(
            f"  {g:<28} {total * us:8.1f}            switches/job {v / n:.2f} vol, {i / n:.2f} invol"
        )
        inside = 0.0
        rows = sorted(
            stages.get(g, []), key=lambda x: (ORDER[system].index(x[0].split(".")[0]), x[0])
        )
        for s, c, k in rows:
            inside += c
            print(f"    {s:<26} {c * us:8.1f} {k / n:10.2f}")
        if rows:
            print(f"    {'rest (wake-ups, loop)':<26} {(total - inside) * us:8.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--due-from", type=float, default=5.0)
    p.add_argument("--due-to", type=float, default=35.0)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--batch", type=int, default=0, help="chronoq: schedule_many batches")
    p.add_argument("--no-inline", action="store_true", help="chronoq: inline_jobs=False")
    p.add_argument(
        "--fine", action="store_true", help="chronoq: split fire and take into their parts"
    )
    p.add_argument(
        "--system", default="apscheduler,chronoq", help="apscheduler, chronoq (comma list)"
    )
    p.add_argument("--url-query", default="", help="chronoq: rocksdb:// URL parameters")
    p.add_argument("--child", choices=("apscheduler", "chronoq"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== cpu_by_stage: N={args.n:,} due {args.due_from:g}-{args.due_to:g} s, load {load} ==")
    with tempfile.TemporaryDirectory(prefix="chronoq-cpu-stage-") as tmp:
        for system in args.system.split(","):
            result = os.path.join(tmp, f"{system}.json")
            argv_c = [sys.executable, os.path.abspath(__file__), "--child", system]
            for opt in ("n", "due_from", "due_to", "seed", "timeout", "batch"):
                argv_c += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
            if args.no_inline:
                argv_c.append("--no-inline")
            if args.fine:
                argv_c.append("--fine")
            if args.url_query:
                argv_c += ["--url-query", args.url_query]
            rc = subprocess.call([*argv_c, "--result", result])
            if rc != 0:
                print(f"{system}: the child failed (exit status {rc})", file=sys.stderr)
                return 1
            with open(result, encoding="utf-8") as f:
                print_table(system, args.n, json.load(f))
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
