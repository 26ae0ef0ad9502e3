"""A clean close of a shared directory's owner drains its clients before handing over.

Real processes: an owner script (it schedules slow jobs and closes on SIGTERM) and
a client `chronoq run` that runs them (see shared_app.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from broker_adapter.shared.broker import SOCKET_NAME
from broker_adapter.shared.options import HANDOVER_DRAIN_ENV
from tests.broker_adapter.shared_procs import APP, CHRONOQ, run_env, runs_of, start
from tests.helpers import eventually

OWNER = """
import logging, signal, sys, threading, time
from tests.broker_adapter.shared_app import app, slow
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
broker = app.broker
print("role", broker.role.value, flush=True)
while not broker.stats().groups:  # the client dispatcher joined its group
    time.sleep(0.05)
for i in range(int(sys.argv[1])):
    slow.schedule(f"s-{i}", key=f"s-{i}")
print("scheduled", flush=True)
stop.wait()
app.close()
print("closed", flush=True)
"""

LATER = """
import sys
from tests.broker_adapter.shared_app import app, record
broker = app.broker
print(broker.role.value, broker.owner_pid, flush=True)
for i in range(int(sys.argv[1])):
    record.schedule(f"later-{i}", key=f"later-{i}")
app.close()
"""


def _ended(runs: Path) -> Counter[str]:
    return Counter(k for k, _pid in runs_of(runs) if k.startswith("s-"))


def _begun(runs: Path) -> Counter[str]:
    return Counter(k for k, _pid in runs_of(runs) if k.startswith("begin-s-"))


def _owner_and_client(
    tmp_path: Path,
    procs: list[subprocess.Popen[str]],
    jobs: int,
    owner_env: dict[str, str],
    client_env: dict[str, str],
) -> tuple[subprocess.Popen[str], subprocess.Popen[str], Path]:
    """An owner script that schedules ``jobs`` slow jobs once a client `chronoq run`
    joined; returns when the client began one."""
    data, runs = tmp_path / "data", tmp_path / "runs"
    env = run_env(data, runs)
    owner = start(
        procs,
        [sys.executable, "-c", OWNER, str(jobs)],
        {**env, **owner_env},
        tmp_path,
        tmp_path / "owner.log",
    )
    eventually(lambda: (data / SOCKET_NAME).exists(), timeout=30, what="the owner serves")
    client = start(
        procs, [CHRONOQ, "run", APP], {**env, **client_env}, tmp_path, tmp_path / "client.log"
    )
    eventually(lambda: _begun(runs), timeout=60, what="the client runs a slow job")
    return owner, client, runs


def test_a_clean_owner_exit_waits_for_the_client_dispatcher_and_no_job_runs_twice(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # Given an owner and a client dispatcher running slow jobs (2 at a time, more prefetched)
    jobs = 6
    owner, client, runs = _owner_and_client(tmp_path, procs, jobs, {}, {})
    # When the owner is closed cleanly while the client holds jobs in flight
    owner.send_signal(signal.SIGTERM)
    assert len(_ended(runs)) < jobs, "every job ended before the close: it proves nothing"
    assert owner.wait(timeout=60) == 0, (tmp_path / "owner.log").read_text()[-3000:]
    # Then every job ran once, the client owns the directory and later jobs still run
    expected = {f"s-{i}" for i in range(jobs)}
    eventually(lambda: set(_ended(runs)) >= expected, timeout=60, what="every slow job ran")
    later = subprocess.run(
        [sys.executable, "-c", LATER, "3"],
        env=run_env(tmp_path / "data", runs),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert later.returncode == 0, later.stdout + later.stderr
    assert later.stdout.split() == ["client", str(client.pid)], later.stdout
    eventually(
        lambda: {f"later-{i}" for i in range(3)} <= {k for k, _pid in runs_of(runs)},
        timeout=60,
        what="jobs scheduled after the handover ran",
    )
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=60) == 0, (tmp_path / "client.log").read_text()[-3000:]
    assert _begun(runs) == Counter({f"begin-{k}": 1 for k in expected}), runs_of(runs)
    assert _ended(runs) == Counter(dict.fromkeys(expected, 1)), runs_of(runs)
    owner_log = (tmp_path / "owner.log").read_text()
    assert "unsettled" not in owner_log, owner_log[-3000:]


def test_a_job_stuck_past_the_handover_drain_is_delivered_again_with_a_warning(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # Given a drain of 300 ms and a client dispatcher stuck 3 s in its only job
    owner, client, runs = _owner_and_client(
        tmp_path, procs, 1, {HANDOVER_DRAIN_ENV: "300"}, {"CHRONOQ_TEST_SLOW_S": "3"}
    )
    # When the owner is closed cleanly while the job runs
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=60) == 0, (tmp_path / "owner.log").read_text()[-3000:]
    # Then the owner warned of the 1 message still in flight, and it is delivered again
    owner_log = (tmp_path / "owner.log").read_text()
    assert "WARNING" in owner_log and "hold 1 unsettled message(s)" in owner_log, owner_log
    eventually(
        lambda: _begun(runs)["begin-s-0"] >= 2, timeout=60, what="the job is delivered again"
    )
    eventually(lambda: _ended(runs)["s-0"] >= 2, timeout=60, what="the second run ends")
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=60) == 0, (tmp_path / "client.log").read_text()[-3000:]
