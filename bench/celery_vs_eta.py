"""chronoq + CeleryExecutor against Celery's own ``apply_async(countdown=...)``.

N jobs due uniformly 5-35 s after scheduling starts, on the same Redis and the
same Celery worker command (a fresh worker per path), once scheduled through
chronoq (embedded broker; the dispatcher publishes each job when due, with the
default ``Settings``: prefetch 32, 8 slots) and once through Celery's ETA::

    .venv/bin/python bench/celery_vs_eta.py                 # N = 20,000
    .venv/bin/python bench/celery_vs_eta.py --n 100000
    .venv/bin/python bench/celery_vs_eta.py --n 2000,20000 --only chronoq   # RSS flat in N?

The worker is what gets the most tasks a second out of this 2-core machine: one
worker process per core with the ``solo`` pool (``2 x celery worker --pool=solo``;
the capacity probe measured about 1,030 tasks/s, against 620-750 for the default
``--pool=prefork -c 2``, whose parent process is the bottleneck, and 590 for
``--pool=threads -c 2``; about 1,400 since the app uses chronoq's cheaper Redis
transport and result backend, :mod:`workers.celery.redis_transport` and
:mod:`workers.celery.redis_backend`, on both paths);
Celery's default prefetch (multiplier 4), Redis broker and result backend, and
the two INFO lines Celery logs per task ("received", "succeeded") off, as one
does at hundreds of tasks a second. ``--pool``,
``--concurrency`` and ``--processes`` choose another worker. Both paths' tasks
store their result; ``task_track_started`` is off (Celery's default; chronoq's
redelivery check uses its own ``SENT`` state).

Printed per path: schedule throughput (one call per job), lateness at task
start (start in the worker minus the asked-for due time) P50/P99/P99.9/max,
the workers' own peak RSS (``VmHWM`` of the worker processes and their pool
children), lost and duplicated runs (every run appends its job number to a
file of its worker process), CPU seconds per job of the worker and of the scheduling process
(for chronoq: scheduling, firing, publishing and outcome tracking), and the
load average; then the ratios chronoq / Celery ETA. For chronoq also the
fire-to-publish lateness inside chronoq (the ``late=`` of the dispatcher's job
lines): the part chronoq controls, as opposed to the worker's queueing, and
its CPU per job by thread. A redis-server is started on a free loopback port unless ``--redis-url`` is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.stats import mb, ms, num, percentiles, proc_status
from scheduler.scheduler import Scheduler
from workers import Dispatcher
from workers.celery import celery_app_for

# The worker logs two INFO lines per task ("received", "succeeded"): at hundreds of
# tasks a second that costs it more than the task; keep its INFO start-up lines.
for _name in ("celery.app.trace", "celery.worker.strategy"):
    logging.getLogger(_name).setLevel(logging.WARNING)

URL_ENV = "BENCH_CELERY_URL"
#: Where each worker process appends its runs (one file per process).
RUNS_ENV = "BENCH_RUNS_DIR"
EXEC_OPTS: dict[str, Any] = {}
_runs_file: list[Any] = []


def _hit(path: str, i: int, due_ms: float) -> None:
    """The task body of both paths: append ``path,i,start_ms,due_ms`` to this
    process's runs file (one small ``O_APPEND`` write: a Redis round trip per task
    cost the worker about a tenth of its CPU, and the measurement should not load
    what it measures)."""
    start = time.time() * 1000
    if not _runs_file:
        runs_dir = Path(os.environ[RUNS_ENV])
        _runs_file.append((runs_dir / f"runs-{os.getpid()}.csv").open("a", buffering=1))
    _runs_file[0].write(f"{path},{i},{start:.3f},{due_ms:.3f}\n")


def define(scheduler: Scheduler) -> None:
    """The chronoq job (run on the worker through the generic task)."""

    @scheduler.job(name="bench.hit", executor="celery")
    def hit(i: int, due_ms: float) -> None:
        _hit("chronoq", i, due_ms)


scheduler = Scheduler("rocksdb://./unused-by-the-worker")
define(scheduler)
app = celery_app_for(
    scheduler,
    os.environ.get(URL_ENV),
    worker_hijack_root_logger=False,
)


@app.task(name="bench.hit_eta")  # type: ignore[untyped-decorator]
def hit_eta(i: int, due_ms: float) -> None:
    """The Celery-ETA path's task: the same body."""
    _hit("eta", i, due_ms)


# -- the driver -----------------------------------------------------------------------------


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not installed (apt-get install redis-server)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    client.close()
    return proc, f"redis://127.0.0.1:{port}/0"


class Worker:
    """``celery -A bench.celery_vs_eta worker`` as ``processes`` subprocesses (one
    worker each, all consuming the same queue)."""

    def __init__(
        self, url: str, concurrency: int, pool: str = "prefork", processes: int = 1
    ) -> None:
        self.runs_dir = Path(tempfile.mkdtemp(prefix="runs-"))
        env = dict(
            os.environ, **{URL_ENV: url, RUNS_ENV: str(self.runs_dir), "PYTHONPATH": str(ROOT)}
        )
        self.procs: list[subprocess.Popen[str]] = []
        self.tail: list[str] = []
        readies: list[threading.Event] = []
        for k in range(processes):
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("celery")), "-A", "bench.celery_vs_eta",
                 "worker", f"--pool={pool}", "-c", str(concurrency), "--loglevel=INFO",
                 "-n", f"bench{k}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
            ready = threading.Event()
            threading.Thread(target=self._read, args=(proc, ready), daemon=True).start()
            self.procs.append(proc)
            readies.append(ready)
        if not all(r.wait(60) for r in readies):
            self.stop()
            raise SystemExit("celery worker not ready:\n" + "".join(self.tail))
        self.idle_rss = sum(proc_status(p.pid).get("VmRSS", 0) for p in self.procs)

    def _read(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.tail = (self.tail + [line])[-20:]
            if " ready." in line:
                ready.set()

    def _pids(self) -> list[int]:
        pids = []
        for proc in self.procs:
            pids.append(proc.pid)
            try:
                for task in Path(f"/proc/{proc.pid}/task").iterdir():
                    pids += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return pids

    def peak_rss(self) -> int:
        """``VmHWM`` of the worker processes (plus their children's, for ``prefork``)."""
        return sum(proc_status(pid).get("VmHWM", 0) for pid in self._pids())

    def cpu_s(self) -> float:
        """User + system CPU seconds of the worker processes and their pool children."""
        total = 0
        for pid in self._pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def runs(self) -> list[str]:
        """The complete run lines the worker processes appended so far."""
        out: list[str] = []
        for f in self.runs_dir.glob("runs-*.csv"):
            text = f.read_text()
            out += text[: text.rfind("\n") + 1].splitlines()
        return out

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.runs_dir, ignore_errors=True)


def _dues(n: int, t0_ms: float, seed: int) -> list[float]:
    rnd = random.Random(seed)
    return [t0_ms + 5000 + rnd.random() * 30000 for _ in range(n)]


def _collect(worker: Worker, path: str, n: int, last_due_ms: float, patience_s: float) -> list[str]:
    """Wait for all ``n`` runs (or ``patience_s`` after the last due time with no progress)."""
    seen, stall_since = -1, time.monotonic()
    while True:
        count = len(worker.runs())
        now = time.monotonic()
        if count != seen:
            seen, stall_since = count, now
        past_due = time.time() * 1000 > last_due_ms
        if count >= n and past_due:
            time.sleep(3)  # room for duplicates to show up
            break
        if past_due and now - stall_since > patience_s:
            break
        time.sleep(0.25)
    return [r for r in worker.runs() if r.startswith(path + ",")]


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _summary(
    path: str,
    n: int,
    sched_s: float,
    recs: list[str],
    worker: Worker,
    cpu0: tuple[float, float, float],
) -> dict[str, Any]:
    ids: dict[int, int] = {}
    late: list[float] = []
    for rec in recs:
        _, i, start, due = rec.split(",")
        ids[int(i)] = ids.get(int(i), 0) + 1
        late.append(float(start) - float(due))
    return {
        "path": path,
        "n": n,
        "sched_rate": n / sched_s,
        "late": percentiles(late),
        "peak_rss": worker.peak_rss(),
        "idle_rss": worker.idle_rss,
        "lost": n - len(ids),
        "dup": len(recs) - len(ids),
        "worker_cpu": (worker.cpu_s() - cpu0[0]) / n,
        "own_cpu": (_own_cpu_s() - cpu0[1]) / n,
        "load": (cpu0[2], os.getloadavg()[0]),
        "recs": recs,
    }


class _PublishLateness(logging.Handler):
    """Collects ``late=`` of the dispatcher's job lines: fire to publish, in chronoq."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.values: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        at = text.find(" late=")
        if at >= 0:
            self.values.append(float(text[at + 6 :].split("ms", 1)[0]))


def run_chronoq(
    url: str, n: int, seed: int, concurrency: int, workdir: Path, pool: str, processes: int
) -> dict[str, Any]:
    worker = Worker(url, concurrency, pool, processes)
    handler = _PublishLateness()
    dlog = logging.getLogger("chronoq.workers.Dispatcher")
    dlog.addHandler(handler)
    dlog.setLevel(logging.INFO)
    sched = Scheduler(f"rocksdb://{workdir / f'chronoq-{n}'}")  # default Settings
    define(sched)
    cpu0 = (worker.cpu_s(), _own_cpu_s(), os.getloadavg()[0])
    threads_before = _threads_cpu_s()
    celery = celery_app_for(sched, url, worker_hijack_root_logger=False, executor_options=EXEC_OPTS)
    dispatcher = Dispatcher(sched)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run_forever, kwargs={"stop_event": stop})
    thread.start()
    try:
        hit = sched.handle("bench.hit")
        t0 = time.time() * 1000
        dues = _dues(n, t0, seed)
        start = time.perf_counter()
        for i, due in enumerate(dues):
            hit.schedule(i, due, delay=max(0.0, due - time.time() * 1000) / 1000)
        sched_s = time.perf_counter() - start
        recs = _collect(worker, "chronoq", n, max(dues), patience_s=30)
        threads = _thread_cpu(n, threads_before)
        out = _summary("chronoq", n, sched_s, recs, worker, cpu0)
        out["publish_late"] = percentiles(handler.values)
        out["threads"] = threads
        return out
    finally:
        dlog.removeHandler(handler)
        stop.set()
        thread.join(60)
        worker.stop()
        sched.close()
        celery.close()


def _threads_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each thread of this process, by native id."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = names.get(int(task.name)) or (task / "comm").read_text().strip()
        except OSError:
            continue
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        out[int(task.name)] = (name.split(" (")[0], cpu_s)
    return out


def _thread_cpu(n: int, before: dict[int, tuple[str, float]]) -> str:
    """CPU per job of this process's busiest threads since ``before`` (where
    chronoq's side goes)."""
    rows = [
        (cpu_s - before.get(tid, (name, 0.0))[1], name)
        for tid, (name, cpu_s) in _threads_cpu_s().items()
    ]
    return ", ".join(f"{name} {cpu_s / n * 1e6:.0f} µs" for cpu_s, name in sorted(rows)[::-1][:5])


def _eta_stub(i: int, due_ms: float) -> None:
    """Only its name matters here: the worker runs :func:`hit_eta`."""


def run_eta(
    url: str, n: int, seed: int, concurrency: int, pool: str, processes: int
) -> dict[str, Any]:
    worker = Worker(url, concurrency, pool, processes)
    celery = celery_app_for(Scheduler("rocksdb://./unused"), url, worker_hijack_root_logger=False)
    task = celery.task(name="bench.hit_eta", shared=False)(_eta_stub)
    cpu0 = (worker.cpu_s(), _own_cpu_s(), os.getloadavg()[0])
    try:
        t0 = time.time() * 1000
        dues = _dues(n, t0, seed)
        start = time.perf_counter()
        for i, due in enumerate(dues):
            task.apply_async((i, due), countdown=max(0.0, due - time.time() * 1000) / 1000)
        sched_s = time.perf_counter() - start
        recs = _collect(worker, "eta", n, max(dues), patience_s=60)
        return _summary("celery-eta", n, sched_s, recs, worker, cpu0)
    finally:
        worker.stop()
        celery.close()


def probe_capacity(url: str, n: int, concurrency: int, pool: str, processes: int) -> float:
    """Tasks/s the worker drains from a burst of ``n`` generic tasks due now."""
    from workers.celery import RUN_TASK
    from workers.celery.publish import publish

    worker = Worker(url, concurrency, pool, processes)
    celery = celery_app_for(Scheduler("rocksdb://./unused"), url)
    try:
        start = time.perf_counter()
        with celery.producer_or_acquire() as producer, producer.batch(max_size=1000):
            for i in range(n):
                args = ["bench.hit", [i, time.time() * 1000], {}]
                publish(celery, producer, RUN_TASK, args, {}, f"probe-{i}", {})
        while len(worker.runs()) < n:
            time.sleep(0.02)
        return n / (time.perf_counter() - start)
    finally:
        worker.stop()
        celery.close()


def _ratio(a: float | None, b: float | None, digits: int = 3) -> str:
    return f"x{a / b:.{digits}f}" if a is not None and b else "n/a"


def _print(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'path':<11} {'N':>8} {'sched/s':>9} {'late p50':>9} {'p99':>9} {'p99.9':>9} "
        f"{'max':>9} {'worker peak RSS':>16} {'idle RSS':>9} {'lost':>6} {'dup':>6} "
        f"{'worker cpu/job':>15} {'sched-side cpu/job':>19} {'load':>10}"
    )
    print(head)
    for r in rows:
        late = r["late"]
        load = f"{r['load'][0]:.1f}-{r['load'][1]:.1f}"
        print(
            f"{r['path']:<11} {num(r['n']):>8} {num(r['sched_rate']):>9} {ms(late['p50']):>9} "
            f"{ms(late['p99']):>9} {ms(late['p99.9']):>9} {ms(late['max']):>9} "
            f"{mb(r['peak_rss']):>16} {mb(r['idle_rss']):>9} {r['lost']:>6} {r['dup']:>6} "
            f"{r['worker_cpu'] * 1000:>12.2f} ms {r['own_cpu'] * 1000:>16.2f} ms {load:>10}"
        )
    print("(lateness in ms, at task start in the worker; MB = 10**6 bytes; load = 1-min "
          "load average at the path's start and end, 2 cores)")  # fmt: skip
    for r in rows:
        if "publish_late" in r:
            p = r["publish_late"]
            print(
                f"chronoq N={num(r['n'])}: fire-to-publish lateness in chronoq p50 {ms(p['p50'])} "
                f"p99 {ms(p['p99'])} p99.9 {ms(p['p99.9'])} max {ms(p['max'])} ms"
            )
            print(f"chronoq N={num(r['n'])}: CPU per job by thread: {r['threads']}")
    for n in sorted({r["n"] for r in rows}):
        c = next((r for r in rows if r["n"] == n and r["path"] == "chronoq"), None)
        e = next((r for r in rows if r["n"] == n and r["path"] == "celery-eta"), None)
        if c is None or e is None:
            continue
        lc, le = c["late"], e["late"]
        print(
            f"N={num(n)}: chronoq/ETA  schedule rate {_ratio(c['sched_rate'], e['sched_rate'], 1)}, "
            f"lateness P50 {_ratio(lc['p50'], le['p50'])} P99 {_ratio(lc['p99'], le['p99'])} "
            f"P99.9 {_ratio(lc['p99.9'], le['p99.9'])}, worker peak RSS "
            f"{_ratio(c['peak_rss'], e['peak_rss'], 2)} ({mb(c['peak_rss'])} vs {mb(e['peak_rss'])})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="20000", help="jobs per run; a comma list runs each")
    parser.add_argument("--only", choices=["chronoq", "eta"], help="run one path only")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--pool", default="solo", choices=["threads", "prefork", "solo"])
    parser.add_argument("--concurrency", type=int, default=1, help="-c of each worker")
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument("--probe", type=int, default=4000, help="capacity probe burst (0: skip)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--linger-ms", type=float, help="CeleryExecutor linger (default: its own)")
    parser.add_argument(
        "--dump", type=Path, help="write every run as path,n,i,due_ms,start_ms here"
    )
    args = parser.parse_args(argv)
    if args.linger_ms is not None:
        EXEC_OPTS["linger_ms"] = args.linger_ms
    workdir = Path(tempfile.mkdtemp(prefix="celery-vs-eta-"))
    server = None
    url = args.redis_url
    if url is None:
        server, url = start_redis(workdir)
    os.environ[URL_ENV] = url
    rows: list[dict[str, Any]] = []
    try:
        if args.probe:
            rate = probe_capacity(url, args.probe, args.concurrency, args.pool, args.processes)
            print(f"worker capacity ({args.processes} x {args.pool} -c {args.concurrency}): "
                  f"{num(rate)} tasks/s "
                  f"(a burst of {num(args.probe)} published at once)")  # fmt: skip
        print(f"worker: {args.processes} x celery worker --pool={args.pool} -c {args.concurrency} "
              "(prefetch multiplier 4, per-task INFO lines off); load average "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")  # fmt: skip
        for n in (int(x) for x in args.n.split(",")):
            if args.only != "eta":
                rows.append(
                    run_chronoq(
                        url, n, args.seed, args.concurrency, workdir, args.pool, args.processes
                    )
                )
                print(f"chronoq N={n} done", file=sys.stderr)
            if args.only != "chronoq":
                rows.append(run_eta(url, n, args.seed, args.concurrency, args.pool, args.processes))
                print(f"celery-eta N={n} done", file=sys.stderr)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    _print(rows)
    if args.dump is not None:
        with args.dump.open("w") as out:
            for r in rows:
                for rec in r["recs"]:
                    path, i, start, due = rec.split(",")
                    out.write(f"{path},{r['n']},{i},{due},{start}\n")
        print(f"runs written to {args.dump}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
