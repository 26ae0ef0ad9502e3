"""Dashboard page loads on a broker with 1,000,000 pending messages.

1. **fill** an embedded broker (``rocksdb://TMP``, owned by this process) with
   ``--pending`` messages (default 1,000,000) in batches of 1,000: job calls of
   ten jobs (``job0`` ... ``job9``, each run tagged with its job), keyed
   ``tenant:<t>:order:<i>`` (100 tenants), due uniformly over the coming week;
   plus 20 dead letters of group ``bench-workers``, 50 interval schedules and a
   delivery trace of ``--trace-lines`` lines (default 200,000) in the directory's
   ``trace/`` (read by ``api/lateness``);
2. start ``chronoq dashboard`` on the same directory (a client of this process
   through the directory's socket, as next to a running ``chronoq run``;
   ``--dashboard-owns`` closes the broker here first, so the dashboard owns it);
3. time ``--requests`` (default 50) GETs of each API read the pages make, after 3
   warm-up requests: P50 / P99 / max in ms, one client, sequential.

Printed: the fill rate, each endpoint's figures and answer size, the dashboard
process's peak RSS, and the load average before and after (2 shared cores: the
machine's other work shows up in the figures).

Run from the project root::

    .venv/bin/python bench/dashboard_page.py                  # 1,000,000 pending
    .venv/bin/python bench/dashboard_page.py --pending 100000 --requests 100
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as a script: the checkout's root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stats import load_average, mb, ms, num, percentiles, print_block, proc_status
from broker_adapter import BrokerAdapter, Message, open_broker
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1000
WEEK_MS = 7 * 24 * 3600 * 1000
GROUP = "bench-workers"
LINE = re.compile(r"chronoq dashboard listening on (http://\S+)")


def fill(broker: object, n: int, now_ms: int) -> float:
    """Send ``n`` pending job runs in batches; the rate (msgs/s)."""
    rng = random.Random(7)
    start = time.perf_counter()
    for lo in range(0, n, BATCH):
        batch = []
        for i in range(lo, min(lo + BATCH, n)):
            job = f"job{i % 10}"
            body = JobCall(job, (i,), {"tenant": i % 100}).encode()
            due = now_ms + 3_600_000 + rng.randrange(WEEK_MS)
            key = f"tenant:{i % 100}:order:{i}"
            batch.append(Message("orders", body, key=key, tags=job, deliver_at_ms=due))
        broker.send_batch(batch)  # type: ignore[attr-defined]
    return n / (time.perf_counter() - start)


def dead_letters(broker: object, n: int) -> None:
    """``n`` messages due now, pulled by ``GROUP`` and dead-lettered."""
    for i in range(n):
        broker.send(Message("failing", JobCall("job0", (i,)).encode(), key=f"dead:{i}"))  # type: ignore[attr-defined]
    with broker.consumer(GROUP, ["failing"]) as consumer:  # type: ignore[attr-defined]
        left = n
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:
            for m in consumer.pull(max_messages=left, wait_ms=500):
                consumer.dead_letter(m, "bench: ValueError('boom')")
                left -= 1


def write_trace(directory: Path, lines: int, now_ms: int) -> None:
    """``lines`` delivery-trace lines (the dispatcher's compact form) finished within
    the last 30 minutes, lateness 0-50 ms."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(11)
    with (directory / "trace-1-00000.jsonl").open("w") as f:
        for i in range(lines):
            due = now_ms - 1_800_000 + i * 1_800_000 // max(lines, 1)
            start = due + rng.randrange(50)
            f.write(
                f'{{"v":1,"topic":"orders","job":"job{i % 10}","group":"chronoq","msg_id":"{i:016x}",'
                f'"key":"tenant:{i % 100}:order:{i}","attempt":1,"sent_ms":{due - 60_000},'
                f'"deliver_at_ms":{due},"fired_ms":{due},"dispatched_ms":{start},'
                f'"started_ms":{start},"finished_ms":{start + 3},"outcome":"ok","error":null}}\n'
            )


def start_dashboard(url: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    """``chronoq dashboard --url URL --port 0`` (the checkout's code); its base URL."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [str(Path(sys.executable).with_name("chronoq")), "dashboard", "--url", url]
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*argv, "--port", "0"], stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
    assert proc.stdout is not None
    m = LINE.match(proc.stdout.readline())
    if m is None:
        proc.kill()
        raise SystemExit(f"the dashboard did not start: {log.read_text()[-2000:]}")
    return proc, m.group(1) + "/"


def populate(broker: BrokerAdapter, n: int, now_ms: int) -> tuple[float, str]:
    """What the dashboard benches read: ``n`` pending runs (:func:`fill`), 20 dead
    letters of ``GROUP``, 50 stored schedules; the fill rate (msgs/s) and the id of
    one pending run."""
    rate = fill(broker, n, now_ms)
    dead_letters(broker, 20)
    app = Scheduler(broker)
    handle = app.job(name="job0")(lambda *a, **k: None)
    for s in range(50):
        app.schedules.add(f"tenant-{s}", handle, every=timedelta(minutes=5), args=(s,))
    app.close()
    some_id = broker.find_pending("orders", key_prefix="tenant:7:", limit=1).messages[0].msg_id
    return rate, some_id


def stop_dashboard(proc: subprocess.Popen[str]) -> None:
    """Stop a dashboard of :func:`start_dashboard` and close its stdout."""
    proc.terminate()
    proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def time_get(http: httpx.Client, url: str, n: int) -> tuple[dict[str, float | None], int, int]:
    """Percentiles (ms) of ``n`` GETs of ``url`` after 3 warm-ups, the answer's size
    and its status."""
    for _ in range(3):
        r = http.get(url)
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = http.get(url)
        took.append((time.perf_counter() - t0) * 1000)
    return percentiles(took, (50.0, 99.0)), len(r.content), r.status_code


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pending", type=int, default=1_000_000)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--trace-lines", type=int, default=200_000, help="delivery trace lines")
    p.add_argument("--dashboard-owns", action="store_true", help="the dashboard owns the dir")
    args = p.parse_args()
    load0 = load_average()
    tmp = Path(tempfile.mkdtemp(prefix="chronoq-dash-bench-"))
    url = f"rocksdb://{tmp / 'data'}"
    broker = open_broker(url)
    proc = None
    try:
        now = int(time.time() * 1000)
        rate, some_id = populate(broker, args.pending, now)
        if args.dashboard_owns:
            broker.close()
        print_block(
            "fill",
            [
                ("pending", num(args.pending)),
                ("batched sends", f"{num(rate)} msgs/s"),
                (
                    "owner",
                    "dashboard" if args.dashboard_owns else "this process (dashboard: client)",
                ),
            ],
        )
        write_trace(tmp / "data" / "trace", args.trace_lines, now)  # the URL's default
        proc, base = start_dashboard(url, tmp / "dashboard.log")
        minute = now + 2 * 3_600_000
        reads = [
            ("api/overview", "api/overview"),
            ("api/due?range=week", "api/due?range=week"),
            ("api/due?range=hour", "api/due?range=hour"),
            ("api/messages (first page)", "api/messages?limit=50"),
            ("api/messages?key_prefix=tenant:7:", "api/messages?key_prefix=tenant:7:&limit=50"),
            ("api/messages?job=job3", "api/messages?job=job3&limit=50"),
            (
                "api/messages?start&end (1 min)",
                f"api/messages?start={minute}&end={minute + 60_000}",
            ),
            ("api/messages/{id}", f"api/messages/{some_id}"),
            ("api/dead", "api/dead"),
            (f"api/dead?group={GROUP}", f"api/dead?group={GROUP}"),
            ("api/schedules (50)", "api/schedules"),
            ("api/rates", "api/rates?minutes=15"),
            ("api/lateness (then)", "api/lateness?minutes=60"),
        ]
        rows = []
        with httpx.Client(timeout=120) as http:
            t0 = time.perf_counter()  # the trace is read whole once, then only new lines
            http.get(base + "api/lateness?minutes=60").raise_for_status()
            first = (time.perf_counter() - t0) * 1000
            rows.append(
                (f"api/lateness, first read of {num(args.trace_lines)} lines", f"{ms(first)} ms")
            )
            for label, path in reads:
                try:
                    pct, size, status = time_get(http, base + path, args.requests)
                except httpx.HTTPError as e:  # e.g. a broker without that call yet
                    rows.append((label, f"failed: {e!r}"))
                    continue
                note = "" if status == 200 else f"  (HTTP {status})"
                rows.append(
                    (
                        label,
                        (
                            f"P50 {ms(pct['p50'])}  P99 {ms(pct['p99'])}  max {ms(pct['max'])} ms"
                            f"  {num(size)} B{note}"
                        ),
                    )
                )
        vm = proc_status(proc.pid)
        print_block(f"GET, {args.requests} requests each (ms)", rows)
        print_block(
            "machine",
            [
                ("dashboard peak RSS", mb(vm.get("VmHWM", 0))),
                ("load before", load0),
                ("load after", load_average()),
            ],
        )
    finally:
        if proc is not None:
            stop_dashboard(proc)
        broker.close()
        if sys.exc_info()[0] is not None:  # show why the dashboard failed
            sys.stderr.write((tmp / "dashboard.log").read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
