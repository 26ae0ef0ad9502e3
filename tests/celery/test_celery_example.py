"""Smoke test of ``examples/celery_orders.py``: the order-timeout shop with its close
job on a real Celery worker (the example starts the worker subprocess itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.external_service


def test_celery_orders_example_runs_to_its_summary(tmp_path: Path, redis_url: str) -> None:
    env = dict(
        os.environ,
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'data'}",
        CHRONOQ_CELERY_BROKER_URL=redis_url,
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "celery_orders.py")],
        check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "summary: 6 closed on Celery, 4 paid, 1 refused, 4 receipts\n" in proc.stdout, out
    assert "ALREADY_DELIVERED" in proc.stdout
    assert proc.stdout.count("closed on the Celery worker (pid") == 6  # ran in the worker
    assert "UNEXPECTED" not in proc.stdout
