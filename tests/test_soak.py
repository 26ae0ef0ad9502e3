"""Soak runs (``-m slow``; not in the default suite): ``bench/timer_load.py`` at a steady
rate for 30 s against each adapter, checking exact delivery accounting only (no timing
is asserted: machines here are noisy). Run with ``.venv/bin/pytest -m slow``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import RedisServer
from tests.server.serverproc import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def soak(url: str | None, rate: int = 3_000) -> dict[str, Any]:
    """Run ``timer_load.py --rate`` (due 2-32 s ahead) and return its JSON figures."""
    cmd = [
        sys.executable,
        "bench/timer_load.py",
        "--rate",
        str(rate),
        "--due-from",
        "2",
        "--due-to",
        "32",
        "--single",
        "5000",
        "--json",
    ]
    if url is not None:
        cmd += ["--broker", url]
    done = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def check(fig: dict[str, Any]) -> None:
    assert fig["expected"] > 80_000 and fig["complete"], fig
    assert (fig["lost"], fig["duplicated"], fig["aborted_delivered"], fig["unexpected"]) == (
        0,
        0,
        0,
        0,
    )
    assert fig["received"] == fig["expected"]


def test_soak_embedded() -> None:
    check(soak(None))


def test_soak_through_the_broker_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        check(soak(server.url))
    finally:
        server.stop()


def test_soak_on_redis(redis_server: RedisServer) -> None:
    check(soak(redis_server.url.rstrip("/") + "/3"))
