"""CPU per job on ``redis://`` (one instance), per thread and in redis-server, for
two or more source trees in alternating runs (issue 16: the +6 % hunt).

Run from the project root (``/work/main``)::

    git worktree add --detach /tmp/wt_base 4e959e0
    .venv/bin/python bench/redis_ab_cpu.py --trees /tmp/wt_base,. --rounds 2
    .venv/bin/python bench/redis_ab_cpu.py --trees . --n 100000 --due-to 33 --count

The workload is ``bench/vs_apscheduler.py --broker redis --batch 1000``'s chronoq
child: one process, a ``Scheduler`` on a fresh ``redis-server`` child (loopback,
``--save ''``, ``--appendonly no``), a ``Dispatcher`` (default settings) on a thread,
``N`` jobs scheduled with ``schedule_many`` (batches of 1,000) at whole-ms due times
uniform in ``[--due-from, --due-to]`` s after the start (default 50,000 over 3-18 s:
vs_apscheduler's 3,333 jobs/s at N=100,000 in half the time); each job records its
start. Each run is a child process that puts its tree's root first on ``sys.path``
(this file is loaded from wherever it is), so each tree runs its own chronoq.

Printed per run: lateness P50 / P99 / P99.9 / max (ms), CPU per job (us) from the
end of scheduling to the last start, of the process, of each thread (pool threads
summed), and of redis-server; Redis commands per job (``INFO commandstats``, reset
after scheduling); GC pauses. With ``--count``: calls per job of the Redis adapter's
hot methods (the wrappers cost a little CPU alike in every tree). Then per tree the
median of its runs. ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TICKS = os.sysconf("SC_CLK_TCK")
#: Methods counted with ``--count``: (module, class, method).
COUNTED = (
    ("broker_adapter.redis.consumer", "RedisConsumer", "pull"),
    ("broker_adapter.redis.consumer", "RedisConsumer", "_take"),
    ("broker_adapter.redis.consumer", "RedisConsumer", "_trip"),
    ("broker_adapter.redis.consumer", "RedisConsumer", "_await_fire"),
    ("broker_adapter.redis.firer", "Firer", "fire_once"),
    ("broker_adapter.redis.firer", "Firer", "take_duty"),
    ("broker_adapter.redis.news", "ReadyNews", "tell"),
    ("broker_adapter.redis.news", "ReadyNews", "wait_changed"),
    ("broker_adapter.redis.acks", "AckBatcher", "flush"),
    ("broker_adapter.redis.acks", "AckBatcher", "carried"),
    ("broker_adapter.redis.scripts", "Scripts", "fan_steps"),
    ("broker_adapter.redis.scripts", "Scripts", "fan"),
)


def proc_cpu_s(pid: int | str, tid: int | None = None) -> float:
    """User + system CPU seconds of a process (or one of its threads) from /proc."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    with open(path, encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def switches(pid: int | str) -> tuple[int, int, float]:
    """Voluntary and involuntary context switches of a process (all its threads), and
    its system CPU seconds."""
    vol = invol = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol += int(line.split()[1])
        except OSError:
            pass  # ended meanwhile
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        sys_s = int(f.read().rsplit(")", 1)[1].split()[12]) / TICKS
    return vol, invol, sys_s


def thread_cpu() -> dict[str, float]:
    """CPU seconds per live thread of this process, by name (pool threads summed)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.native_id is None:
            continue
        name = "chronoq-job*" if t.name.startswith("chronoq-job") else t.name
        try:
            out[name] = out.get(name, 0.0) + proc_cpu_s("self", t.native_id)
        except OSError:
            pass  # ended meanwhile
    return out


def start_redis(nice: int = 0) -> tuple[subprocess.Popen[bytes], int]:
    """A ``redis-server`` child (as ``bench.async_client.redis_server`` starts it, plus
    ``nice`` and the process for its CPU): its own copy, since the child's ``bench``
    package is the measured tree's, which may predate what it needs."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    if nice:
        os.setpriority(os.PRIO_PROCESS, proc.pid, nice)  # its main thread: the one that serves
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.02)


def install_counters(counts: dict[str, int]) -> None:
    """Wrap the :data:`COUNTED` methods to count their calls into ``counts``."""
    import functools
    import importlib

    for mod_name, cls_name, meth in COUNTED:
        cls = getattr(importlib.import_module(mod_name), cls_name, None)
        fn = getattr(cls, meth, None) if cls is not None else None
        if fn is None:
            continue
        key = f"{cls_name}.{meth}"
        counts[key] = 0

        def wrapped(*a: Any, _fn: Any = fn, _key: str = key, **kw: Any) -> Any:
            counts[_key] += 1
            return _fn(*a, **kw)

        setattr(cls, meth, functools.wraps(fn)(wrapped))


def sampler_module() -> Any:
    """``bench/schedstat_sampler.py`` beside this file (the child's ``bench`` package is
    its tree's, which may predate it)."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.append(here)
    return importlib.import_module("schedstat_sampler")


def start_sampler(redis_pid: int) -> Any:
    """A schedstat sampler over redis-server and this process's chronoq threads."""
    named = {"redis": f"/proc/{redis_pid}/schedstat"}
    for t in threading.enumerate():
        if t.native_id is not None and t.name.startswith(("bench-dispatcher", "chronoq-redis")):
            short = t.name.removeprefix("chronoq-redis-").removeprefix("bench-")
            named[short] = f"/proc/self/task/{t.native_id}/schedstat".replace(
                "self", str(os.getpid())
            )
    return sampler_module().Sampler(2.0, named)


def probe_report(sampler: Any, starts: list[tuple[int, float]], args: Any) -> list[str]:
    """Lines: each task's run and run-queue wait per job, the 2 ms samples in which it
    waited 1 ms or more, and the windows of the latest starts past ``--stall-ms``."""
    mod = sampler_module()
    totals, waits_over, window = mod.totals, mod.waits_over, mod.window
    rows = sampler.stop()
    names = sampler.names
    n = len(starts) or 1
    lines = [
        "run/wait us per job: "
        + ", ".join(
            f"{k} {r * 1000 / n:.1f}/{w * 1000 / n:.1f}"
            for k, (r, w) in totals(rows, names).items()
        ),
        "2 ms samples with a run-queue wait >= 1 ms: "
        + ", ".join(f"{k} {v}" for k, v in waits_over(rows, names, 1.0).items())
        + f" (of {len(rows)})",
    ]
    late = sorted(((s - d, d, s) for d, s in starts if s - d >= args.stall_ms), reverse=True)
    seen: set[int] = set()
    for lat, due, start in late:
        if due in seen:
            continue
        seen.add(due)
        lines.append(f"late {lat:.2f} ms: {window(rows, names, due / 1000, start / 1000)}")
        if len(seen) >= args.worst:
            break
    lines.append(f"jobs {args.stall_ms:g} ms late or more: {len(late)} (due ms: {len(seen)} shown)")
    return lines


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.abspath(args.root))
    import redis

    from scheduler import Call, Scheduler
    from workers import Dispatcher
    from workers.gc_tuning import tune_gc

    counts: dict[str, int] = {}
    if args.count:
        install_counters(counts)
    starts: list[tuple[int, float]] = []

    def record(jid: int, due_ms: int) -> None:
        starts.append((due_ms, time.time() * 1000.0))

    pauses: list[float] = []
    t_gc = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            t_gc[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - t_gc[0]) * 1000)

    rproc, port = start_redis(args.redis_nice)
    url = f"redis://127.0.0.1:{port}/0"
    r = redis.Redis(port=port)
    try:
        app = Scheduler(url, topic="bench.ab")
        job = app.job(name="bench.ab.record")(record)
        dispatcher = Dispatcher(app)
        dispatcher.open()
        tune_gc()
        thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
        thread.start()
        try:
            start_ms = int(time.time() * 1000)
            rng = random.Random(args.seed)
            lo, hi = start_ms + args.due_from * 1000, start_ms + args.due_to * 1000
            dues = [int(rng.uniform(lo, hi)) for _ in range(args.n)]
            for i in range(0, args.n, 1000):
                job.schedule_many(
                    [
                        Call((jid, dues[jid]), at=EPOCH + timedelta(milliseconds=dues[jid]))
                        for jid in range(i, min(i + 1000, args.n))
                    ]
                )
            sched_s = time.time() - start_ms / 1000
            r.config_resetstat()
            for k in counts:
                counts[k] = 0
            gc.callbacks.append(on_gc)
            sampler = start_sampler(rproc.pid) if args.stall_ms else None
            cpu0, thr0, red0 = proc_cpu_s("self"), thread_cpu(), proc_cpu_s(rproc.pid)
            sw0, rsw0 = switches("self"), switches(rproc.pid)
            deadline = start_ms / 1000 + args.due_to + 30
            while len(starts) < args.n and time.time() < deadline:
                time.sleep(0.002)
            cpu1, thr1, red1 = proc_cpu_s("self"), thread_cpu(), proc_cpu_s(rproc.pid)
            sw1, rsw1 = switches("self"), switches(rproc.pid)
            gc.callbacks.remove(on_gc)
            probe = probe_report(sampler, starts, args) if sampler is not None else []
            snap = dict(counts)
            stats = r.info("commandstats")
        finally:
            dispatcher.stop()
            thread.join()
            app.close()
    finally:
        r.close()
        rproc.terminate()
        rproc.wait(10)
    lats = sorted(s - d for d, s in starts)
    n = args.n

    def pct(p: float) -> float:
        return lats[min(len(lats) - 1, int(p / 100 * len(lats)))] if lats else float("nan")

    result = {
        "root": args.root,
        "sched_s": sched_s,
        "started": len(starts),
        "p50": pct(50),
        "p99": pct(99),
        "p999": pct(99.9),
        "max": lats[-1] if lats else float("nan"),
        "min": lats[0] if lats else float("nan"),
        "proc_us": (cpu1 - cpu0) * 1e6 / n,
        "redis_us": (red1 - red0) * 1e6 / n,
        "switches_per_job": [(b - a) / n for a, b in zip(sw0[:2], sw1[:2], strict=True)],
        "redis_switches_per_job": [(b - a) / n for a, b in zip(rsw0[:2], rsw1[:2], strict=True)],
        "sys_us": (sw1[2] - sw0[2]) * 1e6 / n,
        "redis_sys_us": (rsw1[2] - rsw0[2]) * 1e6 / n,
        "threads_us": {k: (v - thr0.get(k, 0.0)) * 1e6 / n for k, v in thr1.items()},
        "cmds_per_job": {
            k.removeprefix("cmdstat_"): v["calls"] / n for k, v in stats.items() if v["calls"]
        },
        "cmd_us_per_job": sum(v["usec"] for v in stats.values()) / n,
        "evalsha_us_per_call": (
            stats["cmdstat_evalsha"]["usec_per_call"] if "cmdstat_evalsha" in stats else 0.0
        ),
        "gc_ms": {"count": len(pauses), "max": max(pauses, default=0.0), "sum": sum(pauses)},
        "calls_per_job": {k: v / n for k, v in snap.items()},
        "probe": probe,
    }
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(result, f)


def uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def show(res: dict[str, Any]) -> None:
    print(
        f"{res['root']:<22} P50 {res['p50']:.2f} P99 {res['p99']:.2f} P99.9 {res['p999']:.2f}"
        f" max {res['max']:.1f} min {res['min']:.2f} ms | CPU/job process "
        f"{res['proc_us']:.1f} + redis {res['redis_us']:.1f} = "
        f"{res['proc_us'] + res['redis_us']:.1f} us | sched {res['sched_s']:.1f} s"
    )
    sw, rsw = res["switches_per_job"], res["redis_switches_per_job"]
    print(
        f"    system CPU us/job: process {res['sys_us']:.1f}, redis {res['redis_sys_us']:.1f};"
        f" context switches/job (vol/invol): process {sw[0]:.2f}/{sw[1]:.2f},"
        f" redis {rsw[0]:.2f}/{rsw[1]:.2f}"
    )
    thr = ", ".join(f"{k} {v:.1f}" for k, v in sorted(res["threads_us"].items()) if v >= 0.05)
    print(f"    threads us/job: {thr}")
    cmds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(res["cmds_per_job"].items()))
    print(f"    redis commands/job: {cmds}")
    print(
        f"    redis command time (commandstats): {res['cmd_us_per_job']:.1f} us/job,"
        f" evalsha {res['evalsha_us_per_call']:.1f} us/call"
    )
    g = res["gc_ms"]
    print(f"    gc: {g['count']} pauses, max {g['max']:.1f} ms, sum {g['sum']:.0f} ms")
    for line in res["probe"]:
        print(f"    {line}")
    if res["calls_per_job"]:
        calls = ", ".join(f"{k} {v:.3f}" for k, v in res["calls_per_job"].items())
        print(f"    calls/job: {calls}")


def main(argv: Sequence[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trees", default=".", help="comma list of source roots (default .)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each tree, alternating")
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--due-from", type=float, default=3.0)
    p.add_argument("--due-to", type=float, default=18.0)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--count", action="store_true", help="count calls of hot methods")
    p.add_argument(
        "--stall-ms",
        type=float,
        default=0.0,
        help="sample schedstat every 2 ms and show the windows of starts this late",
    )
    p.add_argument(
        "--redis-nice",
        type=int,
        default=0,
        help="start redis-server at this nice value (an experiment: -10 as root puts it "
        "ahead of the machine's other tasks)",
    )
    p.add_argument("--worst", type=int, default=12, help="windows shown with --stall-ms")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    trees = [t for t in args.trees.split(",") if t]
    print(f"== redis_ab_cpu: N={args.n} due {args.due_from:g}-{args.due_to:g} s, load {uptime()}")
    by_tree: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    tmp = tempfile.mkdtemp(prefix="chronoq-ab-")
    try:
        for rnd in range(args.rounds):
            for i, tree in enumerate(trees):
                out = os.path.join(tmp, f"{rnd}-{i}.json")
                argv2 = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    "--root",
                    tree,
                    "--result",
                    out,
                    "--n",
                    str(args.n),
                    "--due-from",
                    str(args.due_from),
                    "--due-to",
                    str(args.due_to),
                    "--seed",
                    str(args.seed),
                    *(["--count"] if args.count else []),
                    *(["--stall-ms", str(args.stall_ms), "--worst", str(args.worst)]),
                    *(["--redis-nice", str(args.redis_nice)]),
                ]
                if subprocess.call(argv2) != 0 or not os.path.exists(out):
                    print(f"{tree}: the child failed", file=sys.stderr)
                    continue
                with open(out, encoding="utf-8") as f:
                    res = json.load(f)
                by_tree[tree].append(res)
                show(res)
                print(f"    load {uptime()}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("medians per tree:")
    for tree, runs in by_tree.items():
        if not runs:
            continue

        def med(key: str, rs: list[dict[str, Any]] = runs) -> float:
            return float(statistics.median(x[key] for x in rs))

        tots = [x["proc_us"] + x["redis_us"] for x in runs]
        each = ", ".join(f"{t:.0f}" for t in tots)
        print(
            f"  {tree:<22} runs {len(runs)}: CPU/job {statistics.median(tots):.1f} us (process {med('proc_us'):.1f},"
            f" redis {med('redis_us'):.1f}); P99 {med('p99'):.2f} P99.9 {med('p999'):.2f} ms;"
            f" each total {each}"
        )
    print(f"load after {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
