"""kill -9 soaks of every process kind (``-m slow``): ``bench/soak_kill9.py`` with 5
kills per kind under a keyed send + abort load. Asserted from its ledger (never a
timing): nothing acknowledged and not aborted was lost, nothing answered ``ABORTED``
ran, and every duplicate delivery had a kill between it and the delivery before
(at-least-once across a crash, never without one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import require_redis_server

ROOT = Path(__file__).resolve().parents[1]
CYCLES = 5
pytestmark = pytest.mark.slow


def soak(kind: str) -> dict[str, Any]:
    """Run ``soak_kill9.py --kind KIND --cycles 5 --json``; its figures for ``kind``."""
    done = subprocess.run(
        [sys.executable, "bench/soak_kill9.py", "--kind", kind, "--cycles", str(CYCLES), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (fig,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert fig["kind"] == kind
    return fig  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["embedded", "server", "run", "celery"])
def test_kill_9_loses_nothing_and_duplicates_only_across_a_kill(kind: str) -> None:
    if kind == "celery":
        require_redis_server()  # skips locally without it, fails on CI=true
    fig = soak(kind)
    assert fig["drained"] and fig["kills"] == CYCLES, fig
    assert fig["acked_sends"] > 500 and fig["aborted"] > 0 and fig["ran"] > 0, fig
    assert fig["lost"] == 0, fig["examples"]
    assert fig["aborted_but_delivered"] == 0, fig["examples"]
    assert fig["dup_unexplained"] == 0, fig["examples"]
    assert fig["duplicates"] == fig["dup_in_flight_at_kill"] + fig["dup_acked_before_kill"]
