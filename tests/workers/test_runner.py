"""``run_app`` and the ``chronoq`` command: stop events, SIGTERM, ops commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from broker_adapter import open_broker
from scheduler.scheduler import Scheduler
from tests.helpers import eventually
from workers import on_start, run_app, stop_app
from workers.cli import main

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
ROOT = Path(__file__).resolve().parents[2]

SIGAPP = textwrap.dedent(
    """
    import os
    import time

    from scheduler.scheduler import Scheduler
    from workers import on_start

    app = Scheduler()  # CHRONOQ_BROKER_URL from the environment
    OUT = os.environ["SIGAPP_OUT"]


    @app.job(name="sigapp.work")
    def work(n: int) -> None:
        time.sleep(0.1)
        with open(OUT, "a") as f:
            f.write(f"{n}\\n")


    @on_start(app)
    def seed() -> None:
        if os.environ.get("SIGAPP_SEED") == "1":
            work.schedule_many([((n,), {}) for n in range(40)])
            work.schedule_many([((n,), {}) for n in range(40, 50)], delay=1.0)
    """
)


def test_run_app_stops_on_its_event_and_runs_start_hooks(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=2)
    done = threading.Event()

    @app.job
    def hello() -> None:
        done.set()

    @on_start(app)
    def kick_off() -> None:
        hello.schedule()

    stop = threading.Event()
    thread = threading.Thread(target=run_app, args=(app,), kwargs={"stop_event": stop})
    thread.start()
    assert done.wait(10)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert app.broker.stats().groups[app.settings.group].acked_total == 1
    app.close()


def test_stop_app_from_a_job_and_exit_when_idle(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path / 'data'}", max_workers=2)
    ran: list[str] = []

    @app.job
    def last() -> None:
        ran.append("last")
        assert stop_app(app)

    last.schedule()
    assert run_app(app) == 1
    assert ran == ["last"]
    assert not stop_app(app)  # no longer running

    @app.job
    def more(n: int) -> None:
        ran.append(str(n))

    more.schedule_many([((n,), {}) for n in range(3)])
    assert run_app(app, exit_when_idle=True) == 3
    assert sorted(ran[1:]) == ["0", "1", "2"]
    app.close()


def _run(tmp_path: Path, *extra: str, seed: bool) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'data'}",
        CHRONOQ_MAX_WORKERS="2",
        CHRONOQ_PREFETCH="4",
        SIGAPP_OUT=str(tmp_path / "out"),
        SIGAPP_SEED="1" if seed else "0",
        PYTHONPATH=str(ROOT),
    )
    return subprocess.Popen(
        [CHRONOQ, "run", "sigapp:app", *extra],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_sigterm_exits_cleanly_and_loses_nothing(tmp_path: Path) -> None:
    (tmp_path / "sigapp.py").write_text(SIGAPP)
    out = tmp_path / "out"
    proc = _run(tmp_path, seed=True)
    try:
        eventually(
            lambda: out.exists() and len(out.read_text().split()) >= 4,
            timeout=30,
            what="first jobs ran",
        )
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, log
    assert "SIGTERM: stopping" in log and "dispatcher stopped" in log
    first = out.read_text().split()
    assert len(first) < 50, "the run was not interrupted; the test proves nothing"
    proc = _run(tmp_path, "--exit-when-idle", seed=False)
    log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log
    done = out.read_text().split()
    assert set(map(int, done)) == set(range(50))  # at least once: nothing lost


def test_ops_commands_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"rocksdb://{tmp_path / 'data'}"
    assert (
        main(
            [
                "send",
                "--url",
                url,
                "--topic",
                "t1",
                "--key",
                "k1",
                "--delay-ms",
                "60000",
                "--job",
                "some.job",
                "--args",
                "[1, 2]",
                "--json",
            ]
        )
        == 0
    )
    sent = json.loads(capsys.readouterr().out)
    assert sent["status"] == "OK"
    assert main(["query", "--url", url, sent["msg_id"], "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["state"] == "PENDING" and view["key"] == "k1"
    assert main(["pending", "--url", url, "--topic", "t1"]) == 0
    assert sent["msg_id"] in capsys.readouterr().out
    assert main(["stats", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["topics"]["t1"]["pending"] == 1
    assert main(["abort", "--url", url, "--key", "k1", "--topic", "t1"]) == 0
    assert capsys.readouterr().out.startswith("ABORTED")
    assert main(["abort", "--url", url, "--key", "other", "--topic", "t1"]) == 1  # NOT_FOUND
    assert main(["query", "--url", url, "nope"]) == 1
    with open_broker(url) as broker:
        assert broker.stats().pending == 0


def test_chronoq_bench_lists_runs_and_refuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["bench"]) == 0
    listed = capsys.readouterr().out
    assert "timer-load" in listed and "remote-send" in listed and "loadgen" not in listed
    assert main(["bench", "no-such-bench"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    # A real (small) run: a broker server child, sync and batched sends, figures printed.
    assert main(["bench", "remote-send", "--single", "50", "--batched", "2000", "-p", "1"]) == 0
    out = capsys.readouterr().out
    assert "single sync sends" in out and "batched (1000)" in out
    monkeypatch.chdir(tmp_path)
    assert main(["bench"]) == 2
    assert "run it from a chronoq checkout" in capsys.readouterr().err
