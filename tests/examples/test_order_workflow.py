"""``examples/order_workflow.py`` runs as a script on a real ``rocksdb://`` directory,
tells the story in order, and leaves the broker in the state the story says:
order 42's two timers and order 43's auto-close aborted, order 43's reminder fired,
nothing pending; a second run on the same directory tells the same story."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker_adapter import AbortStatus, open_broker

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "order_workflow.py"

#: The story's lines, in this order (the minutes are those of the script).
STORY = [
    "order 42: placed; reminder in 15 min, auto-close in 30 min",
    "order 43: placed; reminder in 15 min, auto-close in 30 min",
    "[+10 min] order 42: the customer asks for 20 more minutes",
    "    order:42:remind: RESCHEDULED, 20 min later",
    "    order:42:close: RESCHEDULED, 20 min later",
    "order 43: reminder sent to the customer",
    "order 42: paid; cancel_all aborted=2, already fired: none",
    "order 43: paid; cancel_all aborted=1, already fired: order:43:remind",
    (
        "summary: order 42 moved 2, cancelled 2, 0 fired; order 43 cancelled 1, 1 fired; "
        "0 left pending"
    ),
]


def _run(tmp_path: Path, data: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        check=False,
        cwd=tmp_path,
        env=dict(os.environ, CHRONOQ_BROKER_URL=f"rocksdb://{data}", PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _assert_story(out: str) -> None:
    lines = out.splitlines()
    at = 0
    for expected in STORY:
        found = [i for i, line in enumerate(lines) if expected in line]
        assert len(found) == 1, f"{expected!r} once in:\n{out}"
        assert found[0] >= at, f"{expected!r} out of order in:\n{out}"
        at = found[0]
    assert "closed, unpaid" not in out  # every auto-close was cancelled
    assert "order 42: reminder sent" not in out
    assert "UNEXPECTED" not in out


def test_the_order_workflow_example_runs_and_leaves_the_broker_as_it_says(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _assert_story(_run(tmp_path, data))
    with open_broker(f"rocksdb://{data}") as broker:
        assert broker.pending() == []
        assert broker.stats().fired_total == 1  # only order 43's reminder fired
        topic = "chronoq.jobs"
        assert broker.abort(key="order:43:remind", topic=topic).status is (
            AbortStatus.ALREADY_DELIVERED
        )
        for key in ("order:42:remind", "order:42:close", "order:43:close"):
            # Aborting again answers ABORTED again: these never ran and never will.
            assert broker.abort(key=key, topic=topic).status is AbortStatus.ABORTED, key
    # A rerun on the same directory tells the same story.
    _assert_story(_run(tmp_path, data))
