"""Where a job's start lateness goes on ``chronoq://``, stage by stage (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/remote_start_breakdown.py                    # N=20,000 over 3-13 s
    .venv/bin/python bench/remote_start_breakdown.py --n 100000 --due-to 35
    .venv/bin/python bench/remote_start_breakdown.py --profile 25       # + cProfile, both sides
    .venv/bin/python bench/remote_start_breakdown.py --unix             # chronoq+unix://
    .venv/bin/python bench/remote_start_breakdown.py --plain            # CPU only, no logs

``bench/job_start_breakdown.py`` across a process boundary: a broker server child
(``chronoq broker serve``'s own :func:`~broker_adapter.server.cli.serve_main`, on a
free loopback port and a fresh data directory, plus a control thread that answers
this script on stdin/stdout) and, in this process, a ``Scheduler`` on its
``chronoq://`` URL with a ``Dispatcher`` on a thread (default settings, with
:func:`workers.gc_tuning.tune_gc`, as ``chronoq run`` does). ``N`` jobs are
scheduled with ``schedule_many`` (batches of 1,000) at whole-ms due times uniform
in ``[--due-from, --due-to]`` s after the start. Stages, each from ``time.time()``
stamps (``CHRONOQ_FIRE_LOG=1`` and ``CHRONOQ_STAGE_LOG=1`` are set in both
processes before chronoq is imported):

* server ``fire``: the chunk's fire write returned (the wheel thread's, or a
  parked pull's that took the fire duty);
* server ``written``: the pull answer carrying it was written to the socket
  (:mod:`broker_adapter.server.stage_log`);
* client ``read``: a link reader decoded that answer (the pulling thread itself,
  or another that then wakes it: the share read by the puller is printed);
* ``pulled``, ``submitted``, ``started``, ``acked``: as in ``job_start_breakdown``.

Then CPU per job from the end of scheduling to the last ack: each process, and
per thread of each (grouped by name: a pool's threads together); GC collections
and their longest pauses in each process; with ``--profile N`` the top ``N``
functions by own CPU of each thread group, client and server. psutil comes with
the ``bench`` extra.

``--plain`` turns the stage logs and the client's stamping hook off (in both
processes) and prints only the CPU per job of each process and thread, with
context switches per thread: the figures without the instrumentation's own cost,
for paired A/B runs of a change.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

PLAIN = "--plain" in sys.argv  # no stage logs: decided before chronoq is imported
if not PLAIN:
    os.environ["CHRONOQ_FIRE_LOG"] = "1"  # before chronoq is imported: read once there
    os.environ["CHRONOQ_STAGE_LOG"] = "1"

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.job_start_breakdown import (
    Body,
    GcPauses,
    StageStamps,
    ThreadProfiles,
    breakdown_parser,
    print_profile,
    print_stage_table,
    schedule_spread,
)

CLIENT_STAGES = ("pulled", "submitted", "started", "acked")
LABELS = {
    "fire": "server fire - due",
    "written": "answer written - fire",
    "read": "client read - written",
    "pulled": "pulled - read",
    "submitted": "submitted - pulled",
    "started": "body start - submitted",
    "acked": "ack done - body start",
    "lateness": "= job start - due",
}


def group_name(name: str) -> str:
    """A pool's or a kind's threads count as one (``chronoq-pull_3`` -> ``chronoq-pull``)."""
    if name.startswith("chronoq-job"):
        return "chronoq-job (pool, all)"
    return re.sub(r"[-_]\d+$", "", name)


def thread_cpu() -> dict[str, float]:
    """User + system CPU seconds per live thread group of this process."""
    import psutil  # type: ignore[import-untyped]

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = group_name(names.get(t.id, f"tid-{t.id}"))
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def thread_switches() -> dict[str, float]:
    """Voluntary context switches per live thread group of this process (Linux):
    a thread blocking, i.e. one wake-up each."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
                n = next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt"))
        except (OSError, StopIteration):  # the thread ended meanwhile
            continue
        name = group_name(names.get(int(tid), f"tid-{tid}"))
        out[name] = out.get(name, 0.0) + n
    return out


def process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def process_counts() -> dict[str, float]:
    """This process's system CPU (s) and context switches (all its live threads) so far."""
    out = {"system": os.times().system, "voluntary": 0.0, "involuntary": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                        kind = "voluntary" if line[0] == "v" else "involuntary"
                        out[kind] += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            pass
    return out


# --------------------------------------------------------------------------- server child


def serve_child(argv: list[str]) -> int:
    """The server process: ``serve_main`` on the main thread, a control thread on stdin.

    Commands (one line each, answered with one JSON line): ``snap`` (process and
    per-thread CPU, GC counts and longest pauses so far), ``dump IDS OUT`` (fire and
    write times of the ids listed in file ``IDS`` into ``OUT``), ``profile N OUT``.
    """
    from broker_adapter.server.cli import configure_parser, serve_main

    p = argparse.ArgumentParser()
    configure_parser(p)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--plain", action="store_true")
    args = p.parse_args(argv)
    profiles = ThreadProfiles()
    if args.profile:
        profiles.install()
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    out = sys.stdout
    control = threading.Thread(
        target=_control, args=(sys.stdin, out, pauses, profiles), daemon=True, name="bench-control"
    )
    control.start()
    return serve_main(args)


def _control(inp: IO[str], out: IO[str], pauses: GcPauses, profiles: ThreadProfiles) -> None:
    from broker_adapter.embedded.fire_log import fire_log
    from broker_adapter.server.stage_log import stage_log

    for line in inp:
        cmd, *rest = line.split()
        answer: Any = None
        if cmd == "snap":
            answer = {
                "counts": process_counts(),
                "process": process_cpu(),
                "threads": thread_cpu(),
                "switches": thread_switches(),
                "gc_count": pauses.count,
                "gc_longest": pauses.longest,
                "tracked": len(gc.get_objects()),
            }
        elif cmd == "dump":
            fires, stages = fire_log(), stage_log()
            assert fires is not None and stages is not None
            with open(rest[0], encoding="ascii") as f:
                ids = f.read().split()
            written = stages.write_times()
            with open(rest[1], "w", encoding="ascii") as f:
                json.dump(
                    {
                        "fire": [fires.fire_time(i) for i in ids],
                        "written": [written.get(i) for i in ids],
                    },
                    f,
                )
        elif cmd == "answers":
            stages = stage_log()
            assert stages is not None
            answer = stages.answers[0]
        elif cmd == "profile":
            import contextlib
            import io

            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                groups: dict[str, list[Any]] = {}
                for group, profs in profiles.by_group.items():
                    groups.setdefault(group_name(group), []).extend(profs)
                for group, profs in sorted(groups.items()):
                    print_profile(f"server {group}", profs, int(rest[0]))
            with open(rest[1], "w", encoding="utf-8") as f:
                f.write(buf.getvalue())
        out.write(json.dumps(answer) + "\n")
        out.flush()


class ServerChild:
    """The server child process, and its control commands."""

    def __init__(self, data_dir: str, profile: bool, unix: bool = False) -> None:
        # (--plain reaches the child through PLAIN, which reads sys.argv there too)
        argv = [sys.executable, os.path.abspath(__file__), "--serve-child", "--data-dir", data_dir]
        if unix:  # chronoq+unix:// on a socket next to the data directory
            argv += ["--unix", os.path.join(os.path.dirname(data_dir), "broker.sock")]
        else:
            argv += ["--host", "127.0.0.1", "--port", "0"]
        argv += ["--profile"] if profile else []
        argv += ["--plain"] if PLAIN else []
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._line()
        if not line.startswith("chronoq broker listening on"):
            self.stop()
            raise SystemExit(f"the broker server did not start: {line!r}")
        self.url = line.split()[-1] if unix else "chronoq://" + line.split()[4]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def ask(self, *words: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(words) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# --------------------------------------------------------------------------- the client


def stage_rows(
    dues: list[int],
    ids: list[str],
    server: dict[str, list[float | None]],
    read: dict[str, tuple[float, bool]],
    body: Body,
    stamps: StageStamps,
) -> dict[str, list[float]]:
    """Per stage, its duration per job (ms), from the timestamps of both processes."""
    rows: dict[str, list[float]] = {s: [] for s in LABELS}
    for jid, (due, mid) in enumerate(zip(dues, ids, strict=True)):
        got = read.get(mid)
        t = {
            "fire": server["fire"][jid],
            "written": server["written"][jid],
            "read": None if got is None else got[0],
            "pulled": stamps.pulled.get(mid),
            "submitted": stamps.submitted.get(mid),
            "started": body.started[jid] or None,
            "acked": stamps.acked.get(mid),
        }
        prev = due / 1000
        for stage, now in t.items():
            if now is None:
                break
            rows[stage].append((now - prev) * 1000)
            prev = now
        if t["started"] is not None:
            rows["lateness"].append(t["started"] * 1000 - due)
    return rows


def print_cpu(title: str, n: int, before: dict[str, Any], after: dict[str, Any]) -> None:
    cpu = after["process"] - before["process"]
    d = {k: after["counts"][k] - before["counts"][k] for k in after["counts"]}
    print(
        f"CPU per job, {title}: {cpu * 1e6 / n:.1f} us ({d['system'] * 1e6 / n:.1f} us system); "
        f"context switches per job {d['voluntary'] / n:.2f} voluntary, "
        f"{d['involuntary'] / n:.2f} involuntary"
    )
    th0, th1 = before["threads"], after["threads"]
    sw0, sw1 = before.get("switches", {}), after.get("switches", {})
    for name in sorted(th1, key=lambda k: -(th1[k] - th0.get(k, 0.0))):
        d = th1[name] - th0.get(name, 0.0)
        if d > 0.0005:
            wakes = ""
            if name in sw1:
                wakes = f"  {(sw1[name] - sw0.get(name, 0.0)) / n:6.2f} wake-ups/job"
            print(f"  {name:<32} {d * 1e6 / n:8.1f} us/job{wakes}")
    count = [a - b for a, b in zip(after["gc_count"], before["gc_count"], strict=True)]
    print(
        f"  GC gen 0/1/2 collections {' / '.join(map(str, count))}, longest pause (whole run) "
        + " / ".join(f"{x * 1000:.2f}" for x in after["gc_longest"])
        + f" ms, objects tracked {after['tracked']:,}"
    )


class CountingBody(Body):
    """The job of ``--plain``: notes its start and counts starts (no hook needed)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.count: list[None] = []  # list.append is atomic; len() is the count

    def __call__(self, jid: int) -> None:
        self.started[jid] = time.time()
        self.count.append(None)


@contextmanager
def dispatched(
    url: str, body: Any, hooks: list[Any], args: argparse.Namespace
) -> Iterator[tuple[int, list[int], list[str], float]]:
    """A dispatcher of ``body``'s job running on ``url`` (with ``hooks``) and the
    workload scheduled: yields ``schedule_spread``'s answer; stops it all after."""
    from scheduler import Scheduler
    from workers import Dispatcher
    from workers.gc_tuning import tune_gc

    app = Scheduler(url, topic="bench.breakdown")
    job = app.job(name="bench.breakdown.job")(body)
    dispatcher = Dispatcher(app, hooks=hooks)
    dispatcher.open()
    tune_gc()  # as chronoq run does once the dispatcher joined
    thread = threading.Thread(target=dispatcher.run_forever, name="bench-dispatcher")
    thread.start()
    try:
        yield schedule_spread(job, args.n, args.due_from, args.due_to, args.seed)
    finally:
        dispatcher.stop()
        thread.join()
        app.close()


def run_plain(args: argparse.Namespace) -> int:
    """``--plain``: the workload without stage logs or hooks; CPU per process and thread."""

    tmp = tempfile.mkdtemp(prefix="chronoq-remote-breakdown-")
    body = CountingBody(args.n)
    server = ServerChild(os.path.join(tmp, "server"), False, args.unix)
    try:
        with dispatched(server.url, body, [], args) as (start_ms, dues, _ids, sched_s):
            s0 = server.ask("snap")
            c0: dict[str, Any] = {"process": process_cpu(), "threads": thread_cpu()}
            c0 |= {"switches": thread_switches(), "gc_count": [0, 0, 0]}
            c0["counts"] = process_counts()
            deadline = start_ms / 1000 + args.due_to + 30
            while len(body.count) < args.n and time.time() < deadline:
                time.sleep(0.05)
            s1 = server.ask("snap")
            c1: dict[str, Any] = {"process": process_cpu(), "threads": thread_cpu()}
            c1 |= {"switches": thread_switches(), "gc_count": [0, 0, 0]}
            c1 |= {"counts": process_counts(), "gc_longest": [0.0, 0.0, 0.0]}
            c1["tracked"] = len(gc.get_objects())
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    lates = sorted(t * 1000 - d for t, d in zip(body.started, dues, strict=True) if t)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"== remote_start_breakdown --plain: N={args.n:,} due {args.due_from:g}-{args.due_to:g} s, "
        f"{'chronoq+unix://' if args.unix else 'chronoq:// on loopback'}, "
        f"scheduled at {args.n / sched_s:,.0f}/s, load {load} =="
    )
    if lates:
        pick = [lates[min(len(lates) - 1, int(q * len(lates)))] for q in (0.5, 0.99, 0.999)]
        print("job start - due P50 / P99 / P99.9 ms: " + " / ".join(f"{x:.2f}" for x in pick))
    lost = args.n - len(lates)
    print(f"lost {lost}, early {sum(1 for x in lates if x < 0)}")
    print_cpu("server process", args.n, s0, s1)
    print_cpu("client process (scheduling excluded)", args.n, c0, c1)
    total = (s1["process"] - s0["process"]) + (c1["process"] - c0["process"])
    print(f"CPU per job, both processes: {total * 1e6 / args.n:.1f} us")
    return 1 if lost else 0


def run(args: argparse.Namespace) -> int:
    if args.plain:
        return run_plain(args)
    from broker_adapter.server.stage_log import stage_log

    tmp = tempfile.mkdtemp(prefix="chronoq-remote-breakdown-")
    body = Body(args.n)
    profiles = ThreadProfiles()
    if args.profile:
        profiles.install()
    stamps = StageStamps()
    pauses = GcPauses()
    server = ServerChild(os.path.join(tmp, "server"), bool(args.profile), args.unix)
    try:
        with dispatched(server.url, body, [stamps], args) as (start_ms, dues, ids, sched_s):
            s0 = server.ask("snap")
            gc.callbacks.append(pauses)
            c0: dict[str, Any] = {"process": process_cpu(), "threads": thread_cpu()}
            c0["gc_count"] = [0, 0, 0]
            c0["counts"] = process_counts()
            deadline = start_ms / 1000 + args.due_to + 30
            while len(stamps.acked) < args.n and time.time() < deadline:
                time.sleep(0.01)
            s1 = server.ask("snap")
            c1: dict[str, Any] = {"process": process_cpu(), "threads": thread_cpu()}
            c1["gc_count"] = pauses.count
            c1["counts"] = process_counts()
            c1 |= {"gc_longest": pauses.longest, "tracked": len(gc.get_objects())}
            gc.callbacks.remove(pauses)
            ids_path = os.path.join(tmp, "ids.txt")
            with open(ids_path, "w", encoding="ascii") as f:
                f.write("\n".join(ids))
            times_path = os.path.join(tmp, "server-times.json")
            server.ask("dump", ids_path, times_path)
            answers_written = server.ask("answers")
            with open(times_path, encoding="ascii") as f:
                server_times = json.load(f)
            if args.profile:
                server.ask("profile", str(args.profile), os.path.join(tmp, "profile.txt"))
                with open(os.path.join(tmp, "profile.txt"), encoding="utf-8") as f:
                    server_profile = f.read()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    log = stage_log()
    assert log is not None
    read = log.read_times()
    rows = stage_rows(dues, ids, server_times, read, body, stamps)
    by_caller = sum(1 for _t, by in read.values() if by)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"== remote_start_breakdown: N={args.n:,} due {args.due_from:g}-{args.due_to:g} s, "
        f"{'chronoq+unix://' if args.unix else 'chronoq:// on loopback'}, "
        f"scheduled at {args.n / sched_s:,.0f}/s, load {load} =="
    )
    print_stage_table(rows, list(LABELS.items()))
    print(
        f"pull answers with messages: {answers_written:,} written "
        f"({args.n / max(1, answers_written):.2f} messages each), {log.answers[1]:,} read"
    )
    if read:
        print(
            f"pull answers read by the pulling thread itself: {by_caller / len(read):.1%} of messages"
        )
    lost = args.n - len(rows["lateness"])
    print(f"lost {lost}, early {sum(1 for x in rows['lateness'] if x < 0)}")
    print_cpu("server process", args.n, s0, s1)
    print_cpu("client process (scheduling excluded)", args.n, c0, c1)
    total = (s1["process"] - s0["process"]) + (c1["process"] - c0["process"])
    print(f"CPU per job, both processes: {total * 1e6 / args.n:.1f} us")
    if args.profile:
        print(server_profile.rstrip())
        for group, profs in sorted(profiles.by_group.items()):
            print_profile(f"client {group}", profs, args.profile)
    return 1 if lost else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve-child"]:
        return serve_child(argv[1:])
    p = breakdown_parser(__doc__)
    p.add_argument(
        "--unix", action="store_true", help="serve on a Unix socket (chronoq+unix://), not TCP"
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="no stage logs or hooks: CPU per process and thread only (for A/B runs)",
    )
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
