"""One run of the namespaced-hosts scenario: a broker on ``R``, two ``chronoq run``
dispatchers on each of ``A`` and ``B``, the producer on ``A``, and one fault.

:func:`run_scenario` starts everything inside a :class:`~tests.netns.lab.Lab`,
strikes the fault at ``fault_at_s`` after the first job is due, waits until every
expected job ran (or a deadline: the last due time, plus the invisible time after
which a vanished dispatcher's messages come back, plus a margin), stops the
processes and returns the :class:`~tests.netns.ledger.Verdict` of the ledgers.
``tests/netns/test_faults.py`` and ``bench/netns_faults.py`` both call it.

Brokers: ``redis`` is ``redis-server`` bound to ``R``'s address with AOF on
(``appendfsync always``); ``server`` is ``chronoq broker serve --host <R> --token``
(a non-loopback bind needs the token). Faults: ``none``; ``kill_b`` (``kill -9``
of both dispatchers on ``B``, not restarted); ``partition_b`` (``B`` cut off for
``cut_s``, then healed); ``slow_a`` (50 ms each way and 5 % loss on ``A``'s link,
from before the producer starts to the end); ``restart_r`` (``kill -9`` of the
broker, started again on the same data ``restart_gap_s`` later).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tests.netns.lab import Lab
from tests.netns.ledger import Fault, Verdict, judge, read_runs

ROOT = Path(__file__).resolve().parents[2]
CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
REDIS_PORT = 6379
SERVER_PORT = 7420
TOKEN = "netns-test-token"
#: The dispatchers' invisible time (``chronoq run``'s default): a message pulled by
#: a dispatcher that vanished comes back after it.
INVISIBLE_S = 60.0
START_TIMEOUT_S = 60.0
FAULTS = ("none", "kill_b", "partition_b", "slow_a", "restart_r")
#: Which hosts' unacknowledged runs each fault may repeat.
FAULT_HOSTS = {"kill_b": ("b",), "partition_b": ("b",), "restart_r": ("a", "b")}
_JOINED = re.compile(r"dispatcher joined group")


@dataclass(frozen=True)
class Plan:
    """One scenario.

    :param broker: ``redis`` or ``server``.
    :param fault: one of :data:`FAULTS`.
    :param count: keyed jobs the producer schedules (every 10th is cancelled).
    :param window_s: they fall due uniformly over this many seconds...
    :param lead_s: ...starting this long after the producer starts.
    :param fault_at_s: when the fault strikes, after the first job is due.
    :param cut_s: how long ``partition_b`` lasts.
    :param restart_gap_s: how long ``restart_r`` leaves the broker down.
    :param per_host: dispatchers on each of ``A`` and ``B``.
    :param job_ms: how long each keyed job works after it recorded its start.
    """

    broker: str
    fault: str
    count: int = 4_000
    window_s: float = 40.0
    lead_s: float = 8.0
    fault_at_s: float = 8.0
    cut_s: float = 20.0
    restart_gap_s: float = 3.0
    per_host: int = 2
    job_ms: int = 100


class Scenario:
    """The processes of one :class:`Plan` in ``lab``, logs and ledgers under ``root``."""

    def __init__(self, lab: Lab, root: Path, plan: Plan) -> None:
        self.lab, self.root, self.plan = lab, root, plan
        self.runs = root / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.broker: subprocess.Popen[bytes] | None = None
        self.dispatchers: dict[str, list[subprocess.Popen[bytes]]] = {"a": [], "b": []}
        r = lab.addr("r")
        self.url = (
            f"redis://{r}:{REDIS_PORT}/0"
            if plan.broker == "redis"
            else f"chronoq://{r}:{SERVER_PORT}?token={TOKEN}"
        )

    def env(self, host: str) -> dict[str, str]:
        """The environment of a chronoq process on ``host``."""
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": str(ROOT),
            "CHRONOQ_BROKER_URL": self.url,
            "NETNS_RUNS": str(self.runs),
            "NETNS_HOST": host,
            "NETNS_JOB_MS": str(self.plan.job_ms),
        }

    def start_broker(self) -> None:
        """Start the broker on ``R`` and wait until a client on ``R`` reaches it."""
        r, log = self.lab.addr("r"), self.root / "broker.log"
        if self.plan.broker == "redis":
            data = self.root / "redis"
            data.mkdir(exist_ok=True)
            argv = ["redis-server", "--bind", r, "--port", str(REDIS_PORT), "--dir", str(data),
                    "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                    "--protected-mode", "no", "--daemonize", "no"]  # fmt: skip
            self.broker = self.lab.spawn("r", argv, self.env("r"), log)
            ping = ["redis-cli", "-h", r, "-p", str(REDIS_PORT), "ping"]
            self._until(
                lambda: self._in("r", ping).startswith("PONG"), "redis-server on R", self.broker
            )
        else:
            argv = [CHRONOQ, "broker", "serve", "--data-dir", str(self.root / "broker"),
                    "--host", r, "--port", str(SERVER_PORT), "--token", TOKEN,
                    "--drain-timeout", "2"]  # fmt: skip
            self.broker = self.lab.spawn("r", argv, self.env("r"), log, cwd=ROOT)
            self._until(
                lambda: "listening on" in log.read_text(), "chronoq broker serve on R", self.broker
            )

    def kill_broker(self) -> None:
        """``kill -9`` the broker."""
        assert self.broker is not None
        self.lab.kill(self.broker)

    def start_dispatchers(self) -> None:
        """Start ``per_host`` dispatchers on ``A`` and ``B``; wait until each joined."""
        started = []
        for host in ("a", "b"):
            for n in range(self.plan.per_host):
                log = self.root / f"run-{host}{n}.log"
                argv = [CHRONOQ, "run", "--drain-timeout", "5", "tests.netns.app:app"]
                proc = self.lab.spawn(host, argv, self.env(host), log, ROOT)
                self.dispatchers[host].append(proc)
                started.append((log, proc))
        for log, proc in started:
            self._until(partial(_joined, log), log.name, proc)

    def produce(self) -> subprocess.Popen[bytes]:
        """Start the producer on ``A``."""
        p = self.plan
        argv = [sys.executable, "-m", "tests.netns.producer", "--count", str(p.count),
                "--window-s", str(p.window_s), "--lead-s", str(p.lead_s),
                "--out", str(self.root / "producer.json")]  # fmt: skip
        return self.lab.spawn("a", argv, self.env("a"), self.root / "producer.log", ROOT)

    def _in(self, host: str, argv: list[str]) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", self.lab.ns(host), *argv],
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return done.stdout

    def _until(
        self, ready: Callable[[], object], what: str, proc: subprocess.Popen[bytes] | None
    ) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if ready():
                    return
            except FileNotFoundError:  # no log line yet
                pass
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; logs in {self.root}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what} did not start in {START_TIMEOUT_S} s; logs in {self.root}"
                )
            time.sleep(0.2)

    def run(self) -> Verdict:
        """Run the plan (see the module docstring) and judge its ledgers."""
        p, lab = self.plan, self.lab
        self.start_broker()
        self.start_dispatchers()
        degraded_ms = _now_ms()
        if p.fault == "slow_a":
            lab.degrade("a", delay_ms=50, loss_pct=5)
        producer = self.produce()
        first_due_ms = int(time.time() * 1000) + int(p.lead_s * 1000)
        fault_ms = first_due_ms + int(p.fault_at_s * 1000)
        fault = Fault(p.fault, hosts=FAULT_HOSTS.get(p.fault, ()))
        if p.fault in ("kill_b", "partition_b", "restart_r"):
            _sleep_until(fault_ms)
            start = _now_ms()
            end = start
            if p.fault == "kill_b":
                for proc in self.dispatchers["b"]:
                    lab.kill(proc)
                end = _now_ms()
            elif p.fault == "partition_b":
                lab.partition("b")
                time.sleep(p.cut_s)
                lab.heal("b")
                end = _now_ms()
            else:
                self.kill_broker()
                time.sleep(p.restart_gap_s)
                self.start_broker()
                end = _now_ms()
            fault = Fault(p.fault, start, end, fault.hosts)
        if producer.wait(p.lead_s + p.window_s + 600) != 0:
            raise RuntimeError(f"the producer failed; see {self.root / 'producer.log'}")
        answers = json.loads((self.root / "producer.json").read_text())
        # A producer behind its plan sends late jobs due just after it sends them.
        last_due = max(answers["start_ms"] + int((p.lead_s + p.window_s) * 1000),
                       answers["end_ms"] + 1_000)  # fmt: skip
        deadline = last_due + int((INVISIBLE_S + 30) * 1000)
        if p.fault == "partition_b":
            deadline += int(p.cut_s * 1000)
        self._wait_for_all(answers, fault, max(last_due + 3_000, fault.end_ms + 3_000), deadline)
        if p.fault == "slow_a":
            lab.heal("a")
            fault = Fault(p.fault, degraded_ms, _now_ms())
        for proc in self.dispatchers["a"] + self.dispatchers["b"]:
            proc.terminate()
        for proc in self.dispatchers["a"] + self.dispatchers["b"]:
            proc.wait(30)
        return judge(answers, read_runs(self.runs), fault)

    def _wait_for_all(
        self, answers: dict[str, Any], fault: Fault, at_least: int, until: int
    ) -> None:
        # Past the last due time (and the fault's end), wait until nothing is missing
        # (an occurrence held by a dead host comes back after the invisible time);
        # then one more tick, so a late repeat of a run would still be seen.
        _sleep_until(at_least)
        while _now_ms() < until:
            verdict = judge(answers, read_runs(self.runs), fault)
            if not verdict.lost and not verdict.tick_gaps:
                break
            time.sleep(1.0)
        time.sleep(2.5)


def _joined(log: Path) -> bool:
    return _JOINED.search(log.read_text()) is not None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _sleep_until(epoch_ms: int) -> None:
    delay = epoch_ms / 1000 - time.time()
    if delay > 0:
        time.sleep(delay)


def run_scenario(lab: Lab, root: Path, plan: Plan) -> Verdict:
    """Run ``plan`` in ``lab`` (already started); the processes stay in ``lab`` for
    its :meth:`~tests.netns.lab.Lab.close`."""
    return Scenario(lab, root, plan).run()
