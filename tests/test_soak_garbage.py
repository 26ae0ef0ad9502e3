"""Garbage at a real broker server while a good client works (``-m slow``):
``bench/soak_garbage.py`` at a tenth of its size, 10,000 garbage frames and 1,000
malformed-but-framed requests, each on its own connection. The server stays up and
closes every such connection, answers no malformed request with OK, its state
(stats and pending, the good client's topic and group aside) is unchanged, and the
good client saw no error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_garbage_leaves_the_server_up_unchanged_and_the_good_client_served() -> None:
    done = subprocess.run(
        [sys.executable, "bench/soak_garbage.py", "--frames", "10000", "--requests", "1000",
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    fig = json.loads(done.stdout.strip().splitlines()[-1])
    assert fig["server_alive"], done.stdout
    assert fig["state_unchanged"], done.stdout
    assert fig["good_errors"] == [] and fig["good_round_trips"] > 0, done.stdout
    assert fig["frames"] == 10_000 and fig["requests"] == 1_000
    assert fig["frames_answers"] == {"closed by the server": 10_000}, done.stdout
    answers = fig["requests_answers"]
    assert answers["closed by the server"] == 1_000 and "left open" not in answers, answers
    assert "answered OK" not in answers, answers
    assert sum(n for k, n in answers.items() if k.startswith("error ")) > 0, answers
    assert done.returncode == 0, done.stdout
