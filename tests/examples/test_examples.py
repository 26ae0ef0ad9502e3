"""Smoke test: every ``examples/*.py`` runs to its end by itself and prints its summary.

Each runs as a subprocess on its own data directory (``CHRONOQ_BROKER_URL``); the
two scheduler examples also run the way the README shows, ``chronoq run module:app``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Examples smoke-tested in their own suite (``celery_orders.py``: with Redis and a
#: Celery worker, in ``tests/celery/``; ``order_workflow.py``: with the broker's state
#: checked after, in ``tests/examples/test_order_workflow.py``).
ELSEWHERE = {"__init__.py", "celery_orders.py", "order_workflow.py"}
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name not in ELSEWHERE)
CHRONOQ = str(Path(sys.executable).with_name("chronoq"))

#: What each example prints when it did its job.
EXPECTED = {
    "broker_demo.py": ["closed [1, 3, 4, 6, 8, 10], paid [2, 5, 7, 9]"],
    "order_timeout.py": ["summary: 6 closed, 4 paid, 1 refused\n", "ALREADY_DELIVERED"],
    "cron_jobs.py": ["summary: heartbeat ran", "cleanup next runs at", "armed cron:demo.cleanup"],
    "spark_nightly.py": ["summary: 7 days, ", "nightly run msg="],
}


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'data'}",
        PYTHONPATH=str(ROOT),
        CRON_DEMO_SECONDS="3.5",
    )


def _check(name: str, proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in EXPECTED[name]:
        assert text in proc.stdout, proc.stdout + proc.stderr
    assert "UNEXPECTED" not in proc.stdout


def test_every_example_has_an_expectation() -> None:
    assert {p.name for p in EXAMPLES} == set(EXPECTED)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_as_a_script(path: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(path)],
        check=False,
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check(path.name, proc)


@pytest.mark.parametrize("name", ["order_timeout", "cron_jobs"])
def test_example_runs_under_chronoq_run(name: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [CHRONOQ, "run", f"examples.{name}:app"],
        check=False,
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check(f"{name}.py", proc)
    assert "dispatcher stopped" in proc.stderr
