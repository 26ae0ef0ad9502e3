"""Processes of the shared-directory tests: the ``chronoq`` command, the test app
(``shared_app.py``), its environment, starting a child, reading the runs it records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
ROOT = Path(__file__).resolve().parents[2]
APP_FILE = Path(__file__).with_name("shared_app.py")
APP = "tests.broker_adapter.shared_app:app"
MAX_WORKERS, PREFETCH = 2, 4


def run_env(data: Path, runs: Path) -> dict[str, str]:
    """The environment of a process of ``shared_app.py`` on ``data``, recording runs
    to ``runs``."""
    return dict(
        os.environ,
        CHRONOQ_BROKER_URL=f"rocksdb://{data}",
        CHRONOQ_TEST_RUNS=str(runs),
        CHRONOQ_MAX_WORKERS=str(MAX_WORKERS),
        CHRONOQ_PREFETCH=str(PREFETCH),
        PYTHONPATH=str(ROOT),
    )


def python_env() -> dict[str, str]:
    """This environment with the project root as ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run_script_json(code: str, *argv: str) -> Any:
    """Run ``python -c code argv`` from the project root to its end (2 min at most);
    what it printed, as JSON. Fails the test with its stderr's tail if it failed."""
    child = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        env=python_env(),
        cwd=ROOT,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout)


def start_script(
    procs: list[subprocess.Popen[str]], code: str, *argv: str
) -> subprocess.Popen[str]:
    """Start ``python -c code argv`` from the project root, its stdin and stdout piped
    (a script that waits on stdin lives until :func:`kill_script`); added to ``procs``."""
    p = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=python_env(),
        cwd=ROOT,
    )
    procs.append(p)
    return p


def kill_script(p: subprocess.Popen[str]) -> None:
    """``kill -9`` a script of :func:`start_script`, reap it and close its stdin."""
    p.kill()
    p.wait(10)
    assert p.stdin is not None
    p.stdin.close()


def start(
    procs: list[subprocess.Popen[str]],
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log: Path | None = None,
) -> subprocess.Popen[str]:
    """Start ``argv``; its output goes to ``log`` (a `chronoq run` logs every job: an
    unread pipe would fill and stall it), else to a pipe the test reads."""
    if log is None:
        out: int | TextIO = subprocess.PIPE
    else:
        out = open(log, "w")  # noqa: SIM115 - the child holds it; closed below
    try:
        p = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    procs.append(p)
    return p


def runs_of(path: Path) -> list[tuple[str, int]]:
    """The ``(key, pid)`` of every job run recorded in ``path``."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        key, _, pid = line.partition(" ")
        out.append((key, int(pid)))
    return out
