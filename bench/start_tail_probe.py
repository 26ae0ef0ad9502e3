"""Why the embedded dispatcher's P99 jobs start late: a timeline per thread (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/start_tail_probe.py                          # N=20,000 over 3-13 s
    .venv/bin/python bench/start_tail_probe.py --n 100000 --due-to 35

The workload of ``bench/job_start_breakdown.py`` (one process, default settings,
``schedule_many`` at whole-ms due times), with probes wrapped around public
methods of the broker and the pool (this script only; nothing of the library
changes): every ``ReadySignal.wait`` (planned end, actual end, whether a notify
ended it, and the thread's run-queue delay meanwhile from
``/proc/self/task/<tid>/schedstat``: time it was runnable but not on a core),
every ``GroupRegistry.fire_due`` (thread, start, end, messages), every
``TimingWheel.refill``, every ``QueuedCall.run`` (a pool thread's whole Python
work for one job: the body, the settle, the ack), the GC's pauses
(``gc.callbacks``), and what the pool's threads were doing.

For the jobs in a lateness band (default P98.5-P99.5, and P40-P60 to compare) it
prints, median and P90 in ms: the fire's start after the due time, split into
"the firing thread was waiting at the due time and woke late" (overshoot past
the planned end; of it, run-queue delay: no core free; the rest: waiting for the
GIL or the timer) and "the firing thread was busy at the due time" (with what:
dispatching the previous chunk, another fire, GC), who fired (a pull or the
wheel thread), and whether a pool thread held a job's Python work at the wake.
"""

from __future__ import annotations

import bisect
import collections
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.job_start_breakdown import (  # sets CHRONOQ_FIRE_LOG first
    Body,
    StageStamps,
    breakdown_parser,
    print_stage_table,
    schedule_spread,
    stage_rows,
)
from broker_adapter.embedded.consumer import ReadySignal
from broker_adapter.embedded.fire_log import fire_log
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.store import RocksStore
from broker_adapter.embedded.timing_wheel import TimingWheel
from workers.executors.local import QueuedCall

Span = tuple[float, float]  # epoch s


class Probes:
    """The recorded intervals, per kind; appends only (list.append is atomic)."""

    def __init__(self) -> None:
        # (thread name, start, planned end, actual end, notified, run-queue delay s)
        self.waits: list[tuple[str, float, float, float, bool, float]] = []
        self.fires: list[tuple[str, float, float, int]] = []
        self.refills: list[tuple[str, float, float, int]] = []
        self.jobs: list[tuple[str, float, float]] = []
        self.gcs: list[tuple[float, float, int]] = []
        self.scans: list[tuple[str, str, float, float, int]] = []  # thread, cf, start, end, rows
        self._fds: dict[int, int] = {}
        self._gc0 = 0.0

    def run_delay(self) -> float:
        """This thread's run-queue delay so far (s): runnable, no core given."""
        tid = threading.get_native_id()
        fd = self._fds.get(tid)
        if fd is None:
            fd = self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        return int(os.pread(fd, 64, 0).split()[1]) / 1e9

    def gc_callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc0 = time.time()
        else:
            self.gcs.append((self._gc0, time.time(), info["generation"]))

    def install(self) -> None:
        probes = self
        wait0 = ReadySignal.wait
        fire0 = GroupRegistry.fire_due
        refill0 = TimingWheel.refill
        run0 = QueuedCall.run
        scan0 = RocksStore.scan

        def scan(
            self: RocksStore, cf: str, lower: bytes, upper: bytes, limit: int
        ) -> list[tuple[bytes, bytes]]:
            t0 = time.time()
            rows = scan0(self, cf, lower, upper, limit)
            name = threading.current_thread().name
            probes.scans.append((name, cf, t0, time.time(), len(rows)))
            return rows

        def wait(self: ReadySignal, epoch: int, timeout_s: float) -> None:
            name = threading.current_thread().name
            d0 = probes.run_delay()
            t0 = time.time()
            wait0(self, epoch, timeout_s)
            t1 = time.time()
            notified = self.epoch != epoch
            probes.waits.append((name, t0, t0 + timeout_s, t1, notified, probes.run_delay() - d0))

        def fire_due(self: GroupRegistry) -> int:
            t0 = time.time()
            n = fire0(self)
            if n:
                probes.fires.append((threading.current_thread().name, t0, time.time(), n))
            return n

        def refill(self: TimingWheel, now_ms: int, *args: Any, **kwargs: Any) -> int:
            t0 = time.time()
            n = refill0(self, now_ms, *args, **kwargs)
            if n:
                probes.refills.append((threading.current_thread().name, t0, time.time(), n))
            return n

        def run(self: QueuedCall) -> None:
            t0 = time.time()
            run0(self)
            probes.jobs.append((threading.current_thread().name, t0, time.time()))

        ReadySignal.wait = wait  # type: ignore[method-assign]
        GroupRegistry.fire_due = fire_due  # type: ignore[method-assign]
        TimingWheel.refill = refill  # type: ignore[method-assign]
        QueuedCall.run = run  # type: ignore[method-assign]
        RocksStore.scan = scan  # type: ignore[method-assign]
        gc.callbacks.append(self.gc_callback)


def covering(
    spans: Sequence[Any], starts: Sequence[float], t: float, end: Callable[[Any], float]
) -> Any:
    """The latest-starting of the few spans before ``t`` (``spans`` sorted by start,
    ``starts`` their starts) with ``start <= t < end``, or None."""
    i = bisect.bisect_right(starts, t)
    for k in range(i - 1, max(-1, i - 9), -1):
        if t < end(spans[k]):
            return spans[k]
    return None


def med(xs: list[float], q: float = 0.5) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(len(xs) * q))] * 1000:.2f}"


def explain(
    label: str, band: list[tuple[float, int, float]], probes: Probes, dispatcher: str
) -> None:
    """Per job of ``band`` ((lateness ms, due ms, fire end s)): why its fire came late."""
    fires = sorted(probes.fires, key=lambda f: f[1])
    waits = sorted(probes.waits, key=lambda w: w[1])
    jobs = sorted(probes.jobs, key=lambda j: j[1])
    gcs = sorted(probes.gcs)
    refills = sorted(probes.refills, key=lambda r: r[1])
    fire_at, wait_at, job_at = [f[1] for f in fires], [w[1] for w in waits], [j[1] for j in jobs]
    gc_at, refill_at = [g[0] for g in gcs], [r[1] for r in refills]
    cats: dict[str, list[float]] = {}
    over: list[float] = []
    rq: list[float] = []
    to_fire: list[float] = []
    fire_len: list[float] = []
    after_fire: list[float] = []
    pool_busy = gc_hit = refill_hit = notified = 0
    for late, due_ms, fire_end in band:
        due = due_ms / 1000
        fire = covering(fires, fire_at, fire_end - 1e-9, lambda f: f[2] + 1e-6)
        if fire is None:
            cats.setdefault("fire not matched", []).append(late / 1000)
            continue
        who, f0, f1, _n = fire
        to_fire.append(f0 - due)
        fire_len.append(f1 - f0)
        after_fire.append(late / 1000 - (f1 - due))
        w = covering(waits, wait_at, due, lambda x: x[3])
        if w is not None and w[0] == who:
            over.append(w[3] - max(w[2], due))
            rq.append(w[5])
            notified += w[4]
            kind = f"{'pull' if who == dispatcher else who}: waiting at due, woke late"
            wake = w[3]
        else:
            kind = f"{'pull' if who == dispatcher else who}: busy at due"
            wake = due
        cats.setdefault(kind, []).append(f0 - due)
        if covering(jobs, job_at, wake, lambda j: j[2]) is not None:
            pool_busy += 1
        k = bisect.bisect_right(gc_at, f0)
        if any(gcs[x][1] >= due for x in range(max(0, k - 3), k)):
            gc_hit += 1
        k = bisect.bisect_left(refill_at, f1)
        if any(refills[x][2] > due for x in range(max(0, k - 3), k)):
            refill_hit += 1
    print(f"-- {label}: {len(band)} jobs; ms median / P90 --")
    print(
        f"  due -> fire starts {med(to_fire)} / {med(to_fire, 0.9)}; fire write "
        f"{med(fire_len)} / {med(fire_len, 0.9)}; fire end -> body start "
        f"{med(after_fire)} / {med(after_fire, 0.9)}"
    )
    for kind, xs in sorted(cats.items(), key=lambda kv: -len(kv[1])):
        print(f"  {kind:<44} {len(xs):>5} jobs, due -> fire start {med(xs)} / {med(xs, 0.9)}")
    print(
        f"  woke late: overshoot {med(over)} / {med(over, 0.9)}, of it run-queue delay "
        f"{med(rq)} / {med(rq, 0.9)}; ended by a notify: {notified}"
    )
    print(
        f"  a pool thread in a job's Python work at the wake: {pool_busy}; "
        f"a GC pause in due..fire: {gc_hit}; a refill in due..fire end: {refill_hit}"
    )


def print_refills(probes: Probes) -> None:
    """How long the wheel's refills and the store's scans took (ms), and where."""
    took = [r[2] - r[1] for r in probes.refills]
    rows = sorted(r[3] for r in probes.refills)
    print(
        f"refills: {len(took)}, rows median {rows[len(rows) // 2] if rows else 0}; took ms "
        f"P50 {med(took)} P90 {med(took, 0.9)} P99 {med(took, 0.99)} max {med(took, 1.0)}; "
        f"by thread {dict(sorted(collections.Counter(r[0] for r in probes.refills).items()))}"
    )
    by: dict[str, list[float]] = {}
    for who, cf, t0, t1, _n in probes.scans:
        by.setdefault(f"{cf} ({'pull' if who == 'bench-dispatcher' else who})", []).append(t1 - t0)
    for key, xs in sorted(by.items()):
        print(
            f"  scans of {key:<34} {len(xs):>7}: ms P50 {med(xs)} P99 {med(xs, 0.99)} max {med(xs, 1.0)}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = breakdown_parser(__doc__)
    p.add_argument("--band", type=float, nargs=2, default=(98.5, 99.5), metavar=("LO", "HI"))
    args = p.parse_args(argv)
    from scheduler import Scheduler
    from workers import Dispatcher
    from workers.gc_tuning import tune_gc

    probes = Probes()
    probes.install()
    tmp = tempfile.mkdtemp(prefix="chronoq-probe-")
    body = Body(args.n)
    stamps = StageStamps()
    try:
        app = Scheduler(f"rocksdb://{os.path.join(tmp, 'db')}", topic="bench.probe")
        job = app.job(name="bench.probe.job")(body)
        dispatcher = Dispatcher(app, hooks=[stamps])
        dispatcher.open()
        tune_gc()
        thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
        thread.start()
        try:
            start_ms, dues, ids, _ = schedule_spread(
                job, args.n, args.due_from, args.due_to, args.seed
            )
            deadline = start_ms / 1000 + args.due_to + 30
            while len(stamps.acked) < args.n and time.time() < deadline:
                time.sleep(0.01)
        finally:
            dispatcher.stop()
            thread.join()
            app.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        gc.callbacks.remove(probes.gc_callback)
    worst: list[tuple[float, int, list[float]]] = []
    rows = stage_rows(dues, ids, body, stamps, worst)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"== start_tail_probe: N={args.n:,} due {args.due_from:g}-{args.due_to:g} s, load {load} =="
    )
    print_stage_table(rows, (("fire", "fire - due"), ("lateness", "= job start - due")))
    log = fire_log()
    assert log is not None
    fired = {mid: log.fire_time(mid) for mid in ids}
    ranked: list[tuple[float, int, float]] = []
    for jid in range(args.n):
        f = fired[ids[jid]]
        if body.started[jid] and f is not None:
            ranked.append((body.started[jid] * 1000 - dues[jid], dues[jid], f))
    ranked.sort()
    n = len(ranked)
    by_thread: dict[str, int] = {}
    for who, *_ in probes.fires:
        by_thread[who] = by_thread.get(who, 0) + 1
    print(
        f"fires by thread: {by_thread}; waits {len(probes.waits)}, refills "
        f"{len(probes.refills)}, GC pauses {len(probes.gcs)}"
    )
    print_refills(probes)
    lo, hi = args.band
    for name, a, b in (
        ("P40-P60", 40.0, 60.0),
        (f"P{lo:g}-P{hi:g}", lo, hi),
        ("P99.9+", 99.9, 100.0),
    ):
        explain(name, ranked[int(n * a / 100) : int(n * b / 100)], probes, "bench-dispatcher")
    return 0


if __name__ == "__main__":
    sys.exit(main())
