"""Where a job's start lateness goes on ``redis://``, stage by stage (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/redis_job_start.py                        # N=20,000 over 3-13 s
    .venv/bin/python bench/redis_job_start.py --n 100000 --due-to 35 --worst 10
    .venv/bin/python bench/redis_job_start.py --profile 25           # + cProfile top 25

The ``redis://`` counterpart of ``bench/job_start_breakdown.py`` (which times the
embedded broker; its hook, job body, GC and thread-CPU helpers are reused): one
process, as ``bench/vs_apscheduler.py --broker redis``'s child, with a ``Scheduler``
on a fresh ``redis-server`` child (loopback, no persistence) and a ``Dispatcher``
(default settings) on a thread; ``N`` jobs scheduled with ``job.schedule_many``
(batches of 1,000) at whole-ms due times uniform in ``[--due-from, --due-to]`` s after
the start. Stages, each a ``time.time()`` stamp:

* ``fire``: the end of the firing pass that moved the message (a pass of the
  firer thread or of a pull, :meth:`Firer.fire_once
  <broker_adapter.redis.firer.Firer.fire_once>` and the pull's own firing wrapped
  here: a message due at ``d`` fired in the first pass that started at or after
  ``d`` and moved anything; a pass that fires and claims in one call stamps both
  ``fire`` and ``pulled`` with its end);
* ``pulled``, ``submitted``, ``started``, ``acked``: as in ``job_start_breakdown``
  (``acked``: the ack call returned; the write follows in the ack batcher).

Prints per stage P50 / P99 / P99.9 / max (ms), the latest starts with their split
(``--worst K``), CPU per job of the process and of the ``redis-server`` child (from
the end of scheduling to the last ack) and per thread, and GC pauses.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis

from bench.async_client import redis_server
from bench.job_start_breakdown import (
    Body,
    GcPauses,
    StageStamps,
    ThreadProfiles,
    breakdown_parser,
    print_profile,
    print_stage_table,
    print_worst,
    schedule_spread,
    thread_group,
)
from broker_adapter.redis import firer as firer_module
from broker_adapter.redis.scripts import Scripts

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STAGES = ("fire", "pulled", "submitted", "started", "acked")


class PassLog:
    """Start and end (epoch s) of every firing pass that moved messages."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._lock = threading.Lock()

    def wrap(
        self, fn: Callable[..., Any], moved_of: Callable[..., int] = int
    ) -> Callable[..., Any]:
        """``fn`` (a firing pass), timed into this log when ``moved_of(args, result)``
        says it moved anything (default: the result is that count)."""
        clock = time.time

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            result = fn(*args, **kwargs)
            moved = result if moved_of is int else moved_of(args, result)
            if moved:
                t1 = clock()
                with self._lock:
                    i = bisect.bisect_right(self.starts, t0)
                    self.starts.insert(i, t0)
                    self.ends.insert(i, t1)
            return result

        return timed

    def fire_time(self, due_ms: int) -> float | None:
        """The end of the first pass that started in or after ``due_ms``'s millisecond."""
        i = bisect.bisect_left(self.starts, due_ms / 1000)
        return self.ends[i] if i < len(self.ends) else None

    def instrument(self) -> None:
        """Time every firing pass of this process: the firing threads'
        (``Firer.fire_once``) and the pulls' (``Scripts.fan_steps`` starting with fire)."""
        firer_module.Firer.fire_once = self.wrap(firer_module.Firer.fire_once)  # type: ignore[method-assign]
        Scripts.fan_steps = self.wrap(Scripts.fan_steps, _steps_moved)  # type: ignore[method-assign]


def _steps_moved(args: tuple[Any, ...], result: list[list[Any]]) -> int:
    """How many a ``fan_steps(keys, steps)`` call fired (0 without a fire step)."""
    names = [step[0] for step in args[2]]
    if "fire" not in names:
        return 0
    return sum(int(r[0]) for r in result[names.index("fire")])


def stage_rows(
    dues: list[int],
    ids: list[str],
    body: Body,
    stamps: StageStamps,
    passes: PassLog,
    worst: list[tuple[float, int, list[float]]],
) -> dict[str, list[float]]:
    """Per stage, its duration per job (ms), from the stamps (see the module doc)."""
    rows: dict[str, list[float]] = {s: [] for s in (*STAGES, "lateness")}
    for jid, (due, mid) in enumerate(zip(dues, ids, strict=True)):
        pulled = stamps.pulled.get(mid) or None
        fired = passes.fire_time(due)
        if fired is not None and pulled is not None and fired > pulled:
            fired = pulled  # the pass that fired it ended after its claim returned
        t = {
            "fire": fired,
            "pulled": pulled,
            "submitted": stamps.submitted.get(mid) or None,
            "started": body.started[jid] or None,
            "acked": stamps.acked.get(mid) or None,
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


def thread_cpu() -> dict[str, float]:
    """User + system CPU seconds per live thread of this process, by thread name."""
    import psutil  # type: ignore[import-untyped]

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = thread_group(names.get(t.id, f"tid-{t.id}"))
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def redis_pid(url: str) -> int | None:
    """The pid of the ``redis-server`` child serving ``url`` (psutil), if found."""
    import psutil

    port = url.rsplit(":", 1)[1].split("/")[0]
    for child in psutil.Process().children():
        if "redis-server" in child.name() and port in " ".join(child.cmdline()):
            return int(child.pid)
    return None


def run(args: argparse.Namespace) -> int:
    import psutil

    from scheduler import Scheduler
    from workers import Dispatcher
    from workers.gc_tuning import tune_gc

    passes = PassLog()
    passes.instrument()  # bench-only: wraps the public firing entry points
    body = Body(args.n)
    profiles = ThreadProfiles()
    if args.profile:
        profiles.install()
    stamps = StageStamps()
    with redis_server() as url:
        rpid = redis_pid(url)
        rproc = psutil.Process(rpid) if rpid else None
        watch = redis.Redis.from_url(url)
        watch.config_set("slowlog-log-slower-than", 2000)  # us: calls of 2 ms or more
        app = Scheduler(url, topic="bench.redis")
        job = app.job(name="bench.redis.job")(body)
        dispatcher = Dispatcher(app, hooks=[stamps])
        dispatcher.open()
        if not args.no_gc_tuning:
            tune_gc()
        thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
        thread.start()
        try:
            start_ms, dues, ids, sched_s = schedule_spread(
                job, args.n, args.due_from, args.due_to, args.seed
            )
            # Filled ahead: a dict growing past 87,381 entries mid-run stops every thread
            # for a few ms to resize (a bench artifact at the same job count every run).
            for table in (stamps.pulled, stamps.submitted, stamps.acked):
                table.update(dict.fromkeys(ids, 0.0))
            proc = psutil.Process()
            c0 = proc.cpu_times()
            r0 = rproc.cpu_times() if rproc else None
            th0 = thread_cpu()
            pauses = GcPauses()
            gc.callbacks.append(pauses)
            deadline = start_ms / 1000 + args.due_to + 30
            time.sleep(max(0.0, max(dues) / 1000 - time.time()))
            while not all(stamps.acked.values()) and time.time() < deadline:
                time.sleep(0.02)
            c1 = proc.cpu_times()
            r1 = rproc.cpu_times() if rproc else None
            slow = watch.slowlog_get(128)
            th1 = thread_cpu()
            gc.callbacks.remove(pauses)
        finally:
            dispatcher.stop()
            thread.join()
            app.close()
            watch.close()

    worst: list[tuple[float, int, list[float]]] = []
    rows = stage_rows(dues, ids, body, stamps, passes, worst)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"== redis_job_start: N={args.n:,} due {args.due_from:g}-{args.due_to:g} s, "
        f"scheduled at {args.n / sched_s:,.0f}/s, load {load} =="
    )
    print_stage_table(
        rows,
        (
            ("fire", "fire (pass end) - due"),
            ("pulled", "pulled - fire"),
            ("submitted", "submitted - pulled"),
            ("started", "body start - submitted"),
            ("acked", "ack returned - body start"),
            ("lateness", "= job start - due"),
        ),
    )
    print_worst(worst, dues, args.worst)
    lost = args.n - len(rows["lateness"])
    print(f"lost {lost}, early {sum(1 for x in rows['lateness'] if x < 0)}")
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    print(f"CPU per job (this process, scheduling excluded): {cpu * 1e6 / args.n:.1f} us")
    if r0 is not None and r1 is not None:
        rcpu = (r1.user + r1.system) - (r0.user + r0.system)
        print(f"CPU per job (redis-server): {rcpu * 1e6 / args.n:.1f} us")
    for name in sorted(th1, key=lambda k: -(th1[k] - th0.get(k, 0.0))):
        d = th1[name] - th0.get(name, 0.0)
        if d > 0.0005:
            print(f"  {name:<32} {d * 1e6 / args.n:8.1f} us/job")
    print(
        "GC meanwhile, gen 0/1/2: collections "
        + " / ".join(str(c) for c in pauses.count)
        + ", longest pause "
        + " / ".join(f"{x * 1000:.2f}" for x in pauses.longest)
        + " ms"
    )
    print(f"Redis calls of 2 ms or more (SLOWLOG): {len(slow)}")
    for entry in slow[:8]:
        cmd = entry["command"][:60]
        print(f"  {entry['duration'] / 1000:6.2f} ms  at {entry['start_time']}  {cmd!r}")
    for group, profs in sorted(profiles.by_group.items()):
        print_profile(group, profs, args.profile)
    return 1 if lost else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = breakdown_parser(__doc__)
    p.add_argument("--no-gc-tuning", action="store_true", help="skip workers.gc_tuning")
    p.add_argument("--worst", type=int, default=0, metavar="K", help="list the K latest")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
