"""kill -9 soaks of every process kind (issue 18 §6), under a keyed send + abort load.

Kinds (``--kind``, or ``all``), each killed ``--cycles`` times, ``--cycle-s`` apart
(jittered 0.5-1.5x so kills land at every phase), then started once more and left
to drain:

``embedded``
    a process owning a ``rocksdb://`` directory that sends, aborts, fires and
    consumes (``bench/soak_child.py``), restarted on the same directory;
``server``
    ``python -m broker_adapter.server`` (what ``chronoq broker serve`` runs),
    restarted on the same directory and port; this process's producer and consumer
    go on through one ``RemoteBroker``, which reconnects by itself;
``run``
    a ``chronoq run bench.soak_app:app`` dispatcher, a shared client of the
    directory this process owns and sends to;
``celery``
    a Celery-executor dispatcher (``bench/soak_child.py celery``) publishing to two
    real ``celery worker`` processes on a real ``redis-server``.

The producer side keeps a ledger (``bench/soak_ledger.py``): every acknowledged
send (id, key), every abort and its answer, every delivery or run, every kill.
Printed per kind: acknowledged sends, lost (acknowledged, not aborted, never
delivered), aborted-but-delivered, duplicates and whether each was in flight at a
kill. Exit 1 if anything was lost or an aborted message was delivered, 2 if a kind
did not drain.

Run from the project root::

    .venv/bin/python bench/soak_kill9.py --kind all --cycles 20
    .venv/bin/python bench/soak_kill9.py --kind server --cycles 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.soak_child import GROUP, INVISIBLE_MS, TOPIC
from bench.soak_ledger import Ledger, LedgerFile, account, expected_ids
from bench.soak_load import Producer, Recorder
from bench.stats import print_block
from broker_adapter import BrokerAdapter, Message, MessageState, open_broker
from scheduler.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("embedded", "server", "run", "celery")
#: How long the last incarnation gets to deliver everything (a killed dispatcher's
#: messages come back after its invisible time: 60 s for ``chronoq run``).
DRAIN_S = 240.0


class Soak:
    """One kind's soak: its work directory, ledger, kills and drain."""

    def __init__(self, kind: str, work: Path, args: argparse.Namespace) -> None:
        self.kind, self.work, self.args = kind, work, args
        self.data = work / "data"
        self.ledger_dir = work / "ledger"
        self.ledger_dir.mkdir(parents=True)
        self.kills = LedgerFile(self.ledger_dir / "kills.log")
        self.rng = random.Random(args.seed)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "SOAK_LEDGER": str(self.ledger_dir)}
        self.drained = False

    def pause(self) -> None:
        """Let the load run for one jittered cycle."""
        time.sleep(self.args.cycle_s * self.rng.uniform(0.5, 1.5))

    def kill(self, kill: Callable[[], None]) -> None:
        """Run ``kill`` (a ``kill -9`` that also reaps) and record it."""
        t0 = time.time()
        kill()
        self.kills.kill(t0, time.time())

    def kill_child(self, proc: subprocess.Popen[str]) -> None:
        """``kill -9`` a child, reap it, record it."""
        t0 = time.time()
        proc.kill()
        proc.wait(30)
        self.kills.kill(t0, time.time())

    def child(self, argv: list[str], name: str) -> subprocess.Popen[str]:
        """Start a child, its output appended to ``work/NAME.out``."""
        with (self.work / f"{name}.out").open("a") as out:
            return subprocess.Popen(
                argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True
            )

    def drain(self, ran: Callable[[], set[str]]) -> None:
        """Wait until every acknowledged, unaborted id ran (or :data:`DRAIN_S`), then
        one invisible time more for late duplicates (those of a ``chronoq run``,
        whose invisible time is 60 s, may come later and are then not counted)."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            led = Ledger.read(self.ledger_dir)
            unknown = led.abort_asked - set(led.abort_answers)
            if expected_ids(led) - unknown <= ran():
                self.drained = True
                time.sleep(INVISIBLE_MS / 1000 + 1)
                return
            time.sleep(0.5)

    def figures(self, broker: BrokerAdapter) -> dict[str, Any]:
        """The accounting, settling unanswered aborts with ``broker.query``."""

        def aborted_now(ids: Iterable[str]) -> set[str]:
            out = set()
            for msg_id in ids:
                view = broker.query(msg_id)
                if view is not None and view.state is MessageState.ABORTED:
                    out.add(msg_id)
            return out

        led = Ledger.read(self.ledger_dir)
        fig = account(led, aborted_now)
        fig["kind"], fig["drained"] = self.kind, self.drained
        return fig


def ran_ids(ledger_dir: Path) -> Callable[[], set[str]]:
    """The ids the ledger shows delivered or run."""
    return lambda: set(Ledger.read(ledger_dir).runs)


def wait_ready(
    proc: subprocess.Popen[str], out: Path, marker: str = "ready", timeout: float = 60.0
) -> None:
    """Wait for a child's ``marker`` (its ``ready`` line) in its output file."""
    deadline = time.monotonic() + timeout
    while marker not in (out.read_text() if out.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"child not ready: {out.read_text()[-2000:]}")
        time.sleep(0.05)
    out.write_text("")  # the next incarnation's "ready" is its own


def soak_embedded(s: Soak) -> dict[str, Any]:
    """The embedded owner, killed and restarted on its directory."""
    argv = [sys.executable, "-m", "bench.soak_child", "embedded", str(s.data), str(s.ledger_dir)]
    out = s.work / "embedded.out"
    proc = None
    try:
        for cycle in range(s.args.cycles + 1):
            last = cycle == s.args.cycles
            proc = s.child([*argv, str(cycle), *(["drain"] if last else [])], "embedded")
            wait_ready(proc, out)
            if last:
                s.drain(ran_ids(s.ledger_dir))
                proc.terminate()
                proc.wait(60)
            else:
                s.pause()
                s.kill_child(proc)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    with open_broker(f"rocksdb://{s.data}?share=0") as broker:
        return s.figures(broker)


def soak_server(s: Soak) -> dict[str, Any]:
    """The broker server, killed and restarted on the same directory and port."""
    from broker_adapter.server.client import RemoteBroker
    from tests.server.serverproc import ServerProcess

    server = ServerProcess(s.data, log_path=s.work / "server.out").start()
    broker = RemoteBroker.from_url(server.url)
    ledger = LedgerFile(s.ledger_dir / "server.log")
    consumer = broker.consumer(GROUP, [TOPIC], invisible_ms=INVISIBLE_MS)

    def send(key: str, delay_ms: int) -> str:
        return broker.send(Message(TOPIC, b"x", key=key, delay_ms=delay_ms)).msg_id

    def abort(msg_id: str, key: str | None) -> str:
        res = broker.abort(key=key, topic=TOPIC) if key else broker.abort(msg_id=msg_id)
        return res.status.value

    producer = Producer(ledger, send, abort, "srv", seed=s.args.seed)
    recorder = Recorder(ledger, consumer)
    producer.start()
    recorder.start()
    try:
        for _ in range(s.args.cycles):
            s.pause()
            s.kill(server.kill)
            restart(server)
        s.pause()
        producer.stop.set()
        producer.join(30)
        s.drain(ran_ids(s.ledger_dir))
        recorder.stop.set()
        recorder.join(30)
        return s.figures(broker)
    finally:
        producer.stop.set()
        recorder.stop.set()
        broker.close()
        server.stop()


def restart(server: Any) -> None:
    """Start a killed server again on its port (which may linger a moment)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            server.start()
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def soak_dispatcher(
    s: Soak,
    argv: list[str],
    scheduler: Scheduler,
    job: str,
    ran: Callable[[], set[str]],
    ready: str,
    collect: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Kill and restart the dispatcher ``argv`` while this process (the directory's
    owner, through ``scheduler``) schedules and cancels runs of ``job``; ``ran``
    tells which ids ran, ``ready`` is what the dispatcher's output says once it
    works, ``collect`` writes runs recorded elsewhere to the ledger."""
    handle = scheduler.handle(job)
    ledger = LedgerFile(s.ledger_dir / "producer.log")

    def send(key: str, delay_ms: int) -> str:
        return str(handle.schedule(key, key=key, delay=delay_ms / 1000).msg_id)

    def abort(msg_id: str, key: str | None) -> str:
        status = handle.cancel(key=key) if key else handle.cancel(msg_id=msg_id)
        return str(status.value)

    producer = Producer(ledger, send, abort, s.kind, rate=s.args.rate / 2, seed=s.args.seed)
    producer.start()
    proc = None
    out = s.work / f"{s.kind}.out"
    try:
        for _ in range(s.args.cycles):
            proc = s.child(argv, s.kind)
            # The pause counts from the dispatcher's start of work, not its spawn: under
            # load `chronoq run` takes ~1 s to join (0.3 s quiet), the pause 0.75-2.25 s.
            wait_ready(proc, out, ready)
            s.pause()
            s.kill_child(proc)
        proc = s.child(argv, s.kind)
        wait_ready(proc, out, ready)
        s.pause()
        producer.stop.set()
        producer.join(30)
        s.drain(ran)
        collect()
        return s.figures(scheduler.broker)
    finally:
        producer.stop.set()
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(60)


def soak_run(s: Soak) -> dict[str, Any]:
    """A ``chronoq run`` dispatcher, killed and restarted."""
    from bench.soak_app import JOB, define

    s.env["CHRONOQ_BROKER_URL"] = f"rocksdb://{s.data}"
    scheduler = Scheduler(f"rocksdb://{s.data}")
    define(scheduler)
    scheduler.broker  # noqa: B018 - open it first: this process owns the directory
    chronoq = str(Path(sys.executable).with_name("chronoq"))
    try:
        return soak_dispatcher(
            s,
            [chronoq, "run", "bench.soak_app:app"],
            scheduler,
            JOB,
            ran_ids(s.ledger_dir),
            "dispatcher joined group",
        )
    finally:
        scheduler.close()


def soak_celery(s: Soak) -> dict[str, Any]:
    """A Celery-executor dispatcher, killed and restarted; two Celery workers run
    the jobs and record each run in Redis (``tests/celery/jobs.py``)."""
    from tests.celery import jobs
    from tests.celery.conftest import CeleryWorker, runs
    from tests.redis_server import RedisServer

    redis_server = RedisServer(s.work / "redis").start()
    url = redis_server.url
    workers = [CeleryWorker(url).start() for _ in range(2)]
    scheduler = Scheduler(f"rocksdb://{s.data}")
    jobs.define(scheduler)
    scheduler.broker  # noqa: B018 - open it first: this process owns the directory
    argv = [sys.executable, "-m", "bench.soak_child", "celery", str(s.data), url]
    argv.append(str(s.ledger_dir))

    def collect() -> None:  # the runs the workers recorded in Redis, into the ledger
        ledger = LedgerFile(s.ledger_dir / "celery-runs.log")
        for r in runs(url, "t.record"):
            ledger.run(r["task_id"], r["attempt"], r["start_ms"] / 1000)

    try:
        ran = lambda: {r["task_id"] for r in runs(url, "t.record")}
        return soak_dispatcher(s, argv, scheduler, "t.record", ran, "ready", collect)
    finally:
        scheduler.close()
        for w in workers:
            w.stop()
        redis_server.stop()


SOAKS: dict[str, Callable[[Soak], dict[str, Any]]] = {
    "embedded": soak_embedded,
    "server": soak_server,
    "run": soak_run,
    "celery": soak_celery,
}


def show(fig: dict[str, Any]) -> None:
    """Print one kind's figures."""
    rows = [
        (k.replace("_", " "), str(fig[k]))
        for k in (
            "kills",
            "acked_sends",
            "aborted",
            "abort_unknown_resolved_aborted",
            "ran",
            "unacknowledged_ran",
            "lost",
            "aborted_but_delivered",
            "pulled_again_after_kill",
            "duplicates",
            "dup_in_flight_at_kill",
            "dup_acked_before_kill",
            "dup_unexplained",
            "drained",
        )
    ]
    rows.append(("examples", json.dumps(fig["examples"])))
    print_block(f"kill -9 soak: {fig['kind']}", rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=[*KINDS, "all"], default="all")
    parser.add_argument("--cycles", type=int, default=20, help="kills per kind")
    parser.add_argument("--cycle-s", type=float, default=1.5, help="mean seconds between kills")
    parser.add_argument("--rate", type=float, default=400, help="keyed sends per second")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args(argv)
    kinds = KINDS if args.kind == "all" else (args.kind,)
    results = []
    with tempfile.TemporaryDirectory(prefix="chronoq-soak-") as tmp:
        for kind in kinds:
            fig = SOAKS[kind](Soak(kind, Path(tmp) / kind, args))
            show(fig)
            results.append(fig)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        print(json.dumps(results))
    if any(f["lost"] or f["aborted_but_delivered"] for f in results):
        return 1
    return 0 if all(f["drained"] for f in results) else 2


if __name__ == "__main__":
    sys.exit(main())
