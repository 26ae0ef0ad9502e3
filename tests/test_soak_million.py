"""200,000 messages through send -> fire -> pull -> ack in one process (``-m slow``):
``bench/soak_million.py`` samples RSS, open descriptors and OS threads every 20,000
acked; the growth from the first sample to the last stays within the script's
tolerances (a resource property, not a timing; see the script's docstring for why
each tolerance is what it is), and every message was acked exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_resources_stay_flat_over_200k_messages() -> None:
    done = subprocess.run(
        [sys.executable, "bench/soak_million.py", "--messages", "200000", "--every", "20000",
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    fig = json.loads(done.stdout.strip().splitlines()[-1])
    assert fig["errors"] == [] and fig["acked"] == fig["broker_acked_total"] == 200_000, fig
    assert fig["left"] == 0, fig
    assert len(fig["samples"]) == 10
    growth = fig["growth"]
    assert growth["rss"] <= 64e6 and fig["second_half_rss"] <= 32e6, done.stdout
    assert growth["fds"] <= 24, done.stdout
    assert growth["threads"] <= 2, done.stdout
    assert fig["flat"] and fig["ok"] and done.returncode == 0, done.stdout
