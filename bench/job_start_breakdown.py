"""Where a job's start lateness goes, stage by stage, on the embedded broker (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/job_start_breakdown.py                     # N=20,000 over 3-13 s
    .venv/bin/python bench/job_start_breakdown.py --n 100000 --due-to 35 --metrics
    .venv/bin/python bench/job_start_breakdown.py --profile 25        # + cProfile top 25

One process, as ``bench/vs_apscheduler.py``'s ``chronoq-embedded`` child: a
``Scheduler`` on a fresh ``rocksdb://`` directory and a ``Dispatcher`` (default
settings: 8 pool threads, prefetch 32) on a thread; ``N`` jobs scheduled with
``job.schedule_many`` (batches of 1,000, ``at=`` each) at whole-ms due times uniform in
``[--due-from, --due-to]`` s after the start. Every timestamp is ``time.time()``:

* ``fire``: the wheel thread's write of the message's chunk returned
  (:mod:`broker_adapter.embedded.fire_log`, turned on by ``CHRONOQ_FIRE_LOG=1``,
  which this script sets before it imports chronoq);
* ``pulled``: the dispatcher's pull returned it (a hook's ``on_pulled``);
* ``submitted``: handed to the executor (the hook's ``before_start``);
* ``started``: the job body's first line;
* ``acked``: the ack returned (the hook's ``after_settle``).

It prints, per stage, P50 / P99 / P99.9 / max in ms, and the lateness
(``started - due``), the median split of the jobs around the P99; with ``--worst K`` the ``K`` latest starts with their due
time and per-stage split (do they cluster in one stall?); then CPU: the process's user + system CPU from the end of
scheduling to the last ack, per job, and per thread (psutil's per-thread times,
named by ``threading``); the GC's collections and pauses meanwhile (``gc.callbacks``); with ``--profile N``, the
top ``N`` functions by own CPU time of each thread (the pool's together; cProfile
timed by ``time.thread_time``, which slows them: read its shares, not its times). ``--metrics`` adds
the ``JobMetrics`` hook ``chronoq run`` installs; ``--no-gc-tuning`` leaves out
:func:`workers.gc_tuning.tune_gc`, which ``chronoq run`` calls. psutil comes with the ``bench``
extra (``pip install 'chronoq[bench]'``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

os.environ["CHRONOQ_FIRE_LOG"] = "1"  # before chronoq is imported: read once there

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stats import ms, percentiles
from broker_adapter.embedded.fire_log import fire_log
from broker_adapter.results import ReceivedMessage
from workers.context import JobContext
from workers.hooks import DispatchHook
from workers.runs import Run

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STAGES = ("fire", "pulled", "submitted", "started", "acked")
PCTS = ("p50", "p99", "p99.9", "max")


class StageStamps(DispatchHook):
    """Notes when each message was pulled, submitted and acked (by message id)."""

    def __init__(self) -> None:
        self.pulled: dict[str, float] = {}
        self.submitted: dict[str, float] = {}
        self.acked: dict[str, float] = {}

    def on_pulled(self, messages: list[ReceivedMessage]) -> None:
        t = time.time()
        pulled = self.pulled
        for m in messages:
            pulled[m.msg_id] = t

    def before_start(self, run: Run, job: JobContext) -> None:
        self.submitted[run.message.msg_id] = time.time()

    def after_settle(self, message: ReceivedMessage, outcome: str) -> None:
        self.acked[message.msg_id] = time.time()


class Body:
    """The job: notes its start (epoch s) by job number."""

    def __init__(self, n: int) -> None:
        self.started: list[float] = [0.0] * n

    def __call__(self, jid: int) -> None:
        self.started[jid] = time.time()


class ThreadProfiles:
    """A cProfile per thread started after :meth:`install`, grouped by thread name."""

    def __init__(self) -> None:
        self.by_group: dict[str, list[cProfile.Profile]] = {}
        self._lock = threading.Lock()

    def install(self) -> None:
        threading.setprofile(self._first_event)

    def _first_event(self, frame: Any, event: str, arg: Any) -> None:
        # The first profile event of a new thread: replace this Python-level hook
        # with a C-level profiler for the rest of the thread's life.
        name = thread_group(threading.current_thread().name)
        # Per-thread CPU as the timer: wall time would charge GIL waits to whatever
        # function a thread was preempted in.
        p = cProfile.Profile(time.thread_time)
        with self._lock:
            self.by_group.setdefault(name, []).append(p)
        p.enable()


def thread_group(name: str) -> str:
    """Pool threads count as one."""
    return "chronoq-job (pool, all)" if name.startswith("chronoq-job") else name


class GcPauses:
    """The longest and total pause of each GC generation while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.longest = [0.0, 0.0, 0.0]
        self.total = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        gen, took = info["generation"], time.perf_counter() - self._t0
        self.count[gen] += 1
        self.total[gen] += took
        self.longest[gen] = max(self.longest[gen], took)


def thread_cpu() -> dict[str, float]:
    """User + system CPU seconds per live thread of this process, by thread name."""
    import psutil  # type: ignore[import-untyped]

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = thread_group(names.get(t.id, f"tid-{t.id}"))
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def thread_switches() -> dict[str, tuple[int, int]]:
    """Voluntary and involuntary context switches per live thread of this process,
    by thread name (``/proc/self/task/<tid>/status``; Linux): a voluntary switch is
    the thread blocking (a wait, or a wake-up that found the GIL taken)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, tuple[int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
                text = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        name = thread_group(names.get(int(tid), f"tid-{tid}"))
        vol, inv = out.get(name, (0, 0))
        vol += int(fields.get("voluntary_ctxt_switches", "0"))
        inv += int(fields.get("nonvoluntary_ctxt_switches", "0"))
        out[name] = (vol, inv)
    return out


def stage_rows(
    dues: list[int],
    ids: list[str],
    body: Body,
    stamps: StageStamps,
    worst: list[tuple[float, int, list[float]]],
) -> dict[str, list[float]]:
    """Per stage, its duration per job (ms), from the timestamps; appends each started
    job's (lateness, due, per-stage split) to ``worst``."""
    log = fire_log()
    assert log is not None
    rows: dict[str, list[float]] = {s: [] for s in (*STAGES, "lateness")}
    for jid, (due, mid) in enumerate(zip(dues, ids, strict=True)):
        fired = log.fire_time(mid)
        t = {
            "fire": fired,
            "pulled": stamps.pulled.get(mid),
            "submitted": stamps.submitted.get(mid),
            "started": body.started[jid] or None,
            "acked": stamps.acked.get(mid),
        }
        prev = due / 1000
        split: list[float] = []
        for stage in STAGES:
            now = t[stage]
            if now is None:
                break
            split.append((now - prev) * 1000)
            rows[stage].append(split[-1])
            prev = now
        started = t["started"]
        if started is not None:
            rows["lateness"].append(started * 1000 - due)
            worst.append((started * 1000 - due, due, split))
    return rows


def print_band(worst: list[tuple[float, int, list[float]]], dues: list[int]) -> None:
    """What the jobs around the P99 (lateness between P98.5 and P99.5) spend per stage,
    median (ms), and how many jobs were due in the same ms as each, median."""
    ranked = sorted(worst)
    if len(ranked) < 200:
        return
    band = ranked[int(len(ranked) * 0.985) : int(len(ranked) * 0.995)]
    per_ms: dict[int, int] = {}
    for due in dues:
        per_ms[due] = per_ms.get(due, 0) + 1
    cols = []
    for i, stage in enumerate(STAGES):
        xs = sorted(split[i] for _, _, split in band if len(split) > i)
        cols.append(f"{stage} {xs[len(xs) // 2]:.2f}" if xs else f"{stage} -")
    same = sorted(per_ms[due] for _, due, _ in band)
    print(
        f"around the P99 ({len(band)} jobs), median per stage (ms): "
        + ", ".join(cols)
        + f"; jobs due in the same ms: {same[len(same) // 2]} (all jobs: "
        + f"{sorted(per_ms[d] for d in dues)[len(dues) // 2]})"
    )


def print_profile(title: str, profiles: Sequence[cProfile.Profile], top: int) -> None:
    if not profiles:
        return
    out = io.StringIO()
    stats = pstats.Stats(profiles[0], stream=out)
    for p in profiles[1:]:
        stats.add(p)
    stats.sort_stats("tottime").print_stats(top)
    print(f"-- cProfile, {title}, top {top} by own time --")
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    print("\n".join(lines[start:]).rstrip())


def print_stage_table(rows: dict[str, list[float]], labels: Sequence[tuple[str, str]]) -> None:
    """One line per ``(stage, label)``: P50/P99/P99.9/max (ms) of ``rows[stage]`` and its count."""
    print(f"{'stage (ms since previous)':<28}" + "".join(f"{p:>8}" for p in PCTS) + "   n")
    for stage, label in labels:
        pct = percentiles(rows[stage], (50.0, 99.0, 99.9))
        print(f"{label:<28}" + "".join(f"{ms(pct[p]):>8}" for p in PCTS) + f"   {len(rows[stage])}")


def print_worst(worst: list[tuple[float, int, list[float]]], dues: list[int], k: int) -> None:
    """The ``k`` latest starts: lateness, due (s after the first due), each stage (ms)."""
    if not k:
        return
    first = min(dues)
    print(f"the {k} latest starts: due (s after the first), then each stage (ms)")
    for late, due, split in sorted(worst, reverse=True)[:k]:
        parts = " ".join(f"{x:7.2f}" for x in split)
        print(f"  late {late:7.2f}  due +{(due - first) / 1000:7.3f}s  {parts}")


def schedule_spread(
    job: Any, n: int, due_from: float, due_to: float, seed: int
) -> tuple[int, list[int], list[str], float]:
    """Schedule jobs ``0..n-1`` of ``job`` at whole-ms due times uniform in
    ``[due_from, due_to]`` s from now, with ``schedule_many`` in batches of 1,000
    (scheduling is not what these benches measure).

    :returns: the start (epoch ms), the due times, the message ids, and the
        seconds scheduling took.
    """
    from scheduler import Call  # after CHRONOQ_FIRE_LOG is set (see the top)

    start_ms = int(time.time() * 1000)
    rng = random.Random(seed)
    lo, hi = start_ms + due_from * 1000, start_ms + due_to * 1000
    dues = [int(rng.uniform(lo, hi)) for _ in range(n)]
    t0 = time.perf_counter()
    ids: list[str] = []
    for i in range(0, n, 1000):
        calls = [
            Call((jid,), at=EPOCH + timedelta(milliseconds=dues[jid]))
            for jid in range(i, min(i + 1000, n))
        ]
        ids += [r.msg_id for r in job.schedule_many(calls)]
    return start_ms, dues, ids, time.perf_counter() - t0


def breakdown_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every job-start breakdown bench takes (``--n``, ``--due-from``,
    ``--due-to``, ``--seed``, ``--profile``); each adds its own."""
    assert doc is not None
    p = argparse.ArgumentParser(
        description=doc.split("\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, default=20_000, help="jobs (default 20,000)")
    p.add_argument("--due-from", type=float, default=3.0, help="s after start (default 3)")
    p.add_argument("--due-to", type=float, default=13.0, help="s after start (default 13)")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N")
    return p


def run(args: argparse.Namespace) -> int:
    import psutil

    from scheduler import Scheduler
    from workers import Dispatcher
    from workers.gc_tuning import tune_gc
    from workers.job_metrics import JobMetrics

    tmp = tempfile.mkdtemp(prefix="chronoq-breakdown-")
    body = Body(args.n)
    profiles = ThreadProfiles()
    if args.profile:
        profiles.install()
    stamps = StageStamps()
    try:
        app = Scheduler(f"rocksdb://{os.path.join(tmp, 'db')}", topic="bench.breakdown")
        job = app.job(name="bench.breakdown.job")(body)
        hooks: list[DispatchHook] = [stamps]
        if args.metrics:
            hooks.insert(0, JobMetrics(app, stats=True))
        dispatcher = Dispatcher(app, hooks=hooks)
        dispatcher.open()
        if not args.no_gc_tuning:
            tune_gc()  # as chronoq run does once the dispatcher joined
        thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
        thread.start()
        try:
            start_ms, dues, ids, sched_s = schedule_spread(
                job, args.n, args.due_from, args.due_to, args.seed
            )
            proc = psutil.Process()
            c0 = proc.cpu_times()
            th0 = thread_cpu()
            sw0 = thread_switches()
            pauses = GcPauses()
            gc.callbacks.append(pauses)
            deadline = start_ms / 1000 + args.due_to + 30
            while len(stamps.acked) < args.n and time.time() < deadline:
                time.sleep(0.01)
            c1 = proc.cpu_times()
            th1 = thread_cpu()
            sw1 = thread_switches()
            gc.callbacks.remove(pauses)
            tracked = len(gc.get_objects())  # before this script's own analysis below
        finally:
            dispatcher.stop()
            thread.join()
            app.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    worst: list[tuple[float, int, list[float]]] = []
    rows = stage_rows(dues, ids, body, stamps, worst)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"== job_start_breakdown: N={args.n:,} due {args.due_from:g}-{args.due_to:g} s, "
        f"scheduled at {args.n / sched_s:,.0f}/s, metrics hook {'on' if args.metrics else 'off'}, "
        f"gc tuning {'off' if args.no_gc_tuning else 'on'}, "
        f"load {load} =="
    )
    print_stage_table(
        rows,
        (
            ("fire", "fire (wheel) - due"),
            ("pulled", "pulled - fire"),
            ("submitted", "submitted - pulled"),
            ("started", "body start - submitted"),
            ("acked", "ack done - body start"),
            ("lateness", "= job start - due"),
        ),
    )
    print_worst(worst, dues, args.worst)
    print_band(worst, dues)
    lost = args.n - len(rows["lateness"])
    print(f"lost {lost}, early {sum(1 for x in rows['lateness'] if x < 0)}")
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    print(f"CPU per job (process, scheduling excluded): {cpu * 1e6 / args.n:.1f} us")
    print(f"  {'thread':<32} {'CPU':>8}        {'switches/job voluntary / not':>28}")
    for name in sorted(th1, key=lambda k: -(th1[k] - th0.get(k, 0.0))):
        d = th1[name] - th0.get(name, 0.0)
        if d > 0.0005:
            v1, i1 = sw1.get(name, (0, 0))
            v0, i0 = sw0.get(name, (0, 0))
            print(
                f"  {name:<32} {d * 1e6 / args.n:8.1f} us/job "
                f"{(v1 - v0) / args.n:14.2f} / {(i1 - i0) / args.n:.2f}"
            )
    print(
        "GC meanwhile, gen 0/1/2: collections "
        + " / ".join(str(c) for c in pauses.count)
        + ", longest pause "
        + " / ".join(f"{x * 1000:.2f}" for x in pauses.longest)
        + " ms, total "
        + " / ".join(f"{x * 1000:.0f}" for x in pauses.total)
        + f" ms; objects tracked at the end {tracked:,}"
    )
    for group, profs in sorted(profiles.by_group.items()):
        print_profile(group, profs, args.profile)
    return 1 if lost else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = breakdown_parser(__doc__)
    p.add_argument("--metrics", action="store_true", help="add the JobMetrics hook")
    p.add_argument("--no-gc-tuning", action="store_true", help="skip workers.gc_tuning")
    p.add_argument("--worst", type=int, default=0, metavar="K", help="list the K latest")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
