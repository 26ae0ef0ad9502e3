"""``chronoq schedules`` through the installed console script, in subprocesses, on a
rocksdb:// directory: from the broker alone, and with ``--app`` for the code's cron jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scheduler import Scheduler

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
APP = "h5_cli_app:app"
APP_SOURCE = """
    from scheduler import Scheduler

    app = Scheduler()  # CHRONOQ_BROKER_URL

    @app.job(name="sync")
    def sync(tenant: int) -> None: ...

    @app.cron("0 3 * * *", name="nightly")
    def nightly() -> None: ...
"""


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    (tmp_path / "h5_cli_app.py").write_text(textwrap.dedent(APP_SOURCE))
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, CHRONOQ_BROKER_URL=f"rocksdb://{data_dir}", PYTHONPATH=path)


def chronoq(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHRONOQ, "schedules", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def listed(env: dict[str, str], *extra: str) -> dict[str, dict[str, object]]:
    done = chronoq(env, "list", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return {s["name"]: s for s in json.loads(done.stdout)}


def test_schedules_commands(env: dict[str, str], data_dir: Path) -> None:
    now = time.time() * 1000
    with Scheduler(f"rocksdb://{data_dir}") as app:
        app.job(name="sync")(lambda tenant: None)
        # anchored half a minute from now: no occurrence comes due while the test runs
        # (on the epoch anchor one did when a minute turned mid-test, with no dispatcher
        # to arm the next)
        anchor = int(now) + 30_000
        app.schedules.add("tenant-1", "sync", every=60, anchor=anchor, args=(1,))
        app.schedules.add("tenant-2", "sync", cron="*/5 * * * *", args=(2,))

    # from the broker alone: the stored schedules (the cron job never ran: not there yet)
    found = listed(env)
    assert sorted(found) == ["tenant-1", "tenant-2"]
    one = found["tenant-1"]
    assert (one["job"], one["paused"], one["version"], one["every_ms"], one["args"]) == (
        "sync",
        False,
        1,
        60_000,
        [1],
    )
    assert one["trigger"] == f"every 1m from {anchor} ms" and len(one["next_fire_ms"]) == 3  # type: ignore[arg-type]
    assert one["next_fire_ms"][0] > now  # type: ignore[index]
    text = chronoq(env, "list")
    assert text.returncode == 0 and "tenant-2  data  active  v1  cron '*/5 * * * *'" in text.stdout

    # --app adds the code's cron job
    assert listed(env, "--app", APP)["nightly"]["source"] == "decorator"

    paused = chronoq(env, "pause", "tenant-1")
    assert paused.returncode == 0 and "tenant-1  data  paused  v2" in paused.stdout
    assert chronoq(env, "pause", "nightly", "--app", APP).returncode == 0
    found = listed(env)  # the broker alone now knows the cron job, paused
    assert (found["tenant-1"]["paused"], found["tenant-1"]["next_fire_ms"]) == (True, [])
    assert (found["nightly"]["paused"], found["nightly"]["source"]) == (True, "decorator")

    resumed = chronoq(env, "resume", "tenant-1", "--json")
    assert resumed.returncode == 0
    assert json.loads(resumed.stdout)["paused"] is False

    run_now = chronoq(env, "run-now", "tenant-2", "--json")
    assert run_now.returncode == 0, run_now.stderr
    msg_id = json.loads(run_now.stdout)["msg_id"]

    removed = chronoq(env, "remove", "tenant-2")
    assert removed.returncode == 0 and "tenant-2: removed" in removed.stdout
    gone = chronoq(env, "remove", "tenant-2")
    assert gone.returncode == 1 and "no schedule named 'tenant-2'" in gone.stderr
    assert chronoq(env, "pause", "nope").returncode == 1
    refused = chronoq(env, "remove", "nightly", "--app", APP)
    assert refused.returncode == 2 and "remove it from the code" in refused.stderr
    assert sorted(listed(env)) == ["nightly", "tenant-1"]

    with Scheduler(f"rocksdb://{data_dir}") as app:
        view = app.broker.query(msg_id)
        assert view is not None and view.tags == "sync"
        keys = [v.key for v in app.broker.pending(topic=app.settings.topic)]
        assert [k for k in keys if k and k.startswith("cron:tenant-2:")] == []
        assert len([k for k in keys if k and k.startswith("cron:tenant-1:")]) == 1
