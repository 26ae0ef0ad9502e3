"""workers.gc_tuning: run_app(freeze_gc=True), as chronoq run calls it, freezes the
start-up heap once per process; by default it does not.

Each case runs in a fresh interpreter (a real subprocess): freezing is process-wide,
and the test process must keep its own collector as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_child(code: str, tmp_path: Path) -> dict[str, object]:
    """Run ``code`` in a new interpreter at the project root; its last stdout line as JSON."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_tune_gc_freezes_once(tmp_path: Path) -> None:
    result = run_child(
        """
        import gc, json
        from workers.gc_tuning import tune_gc
        before = gc.get_freeze_count()
        first, frozen = tune_gc(), gc.get_freeze_count()
        second = tune_gc()
        print(json.dumps({"before": before, "first": first, "frozen": frozen,
                          "second": second, "after": gc.get_freeze_count()}))
        """,
        tmp_path,
    )
    assert result["before"] == 0
    assert result["first"] is True
    assert isinstance(result["frozen"], int) and result["frozen"] > 1000
    assert result["second"] is False
    assert result["after"] == result["frozen"]  # the second call froze nothing more


@pytest.mark.parametrize(
    ("url", "freeze"), [("memory", True), ("rocksdb", True), ("memory", False)]
)
def test_run_app_tunes_gc_and_jobs_still_run(tmp_path: Path, url: str, freeze: bool) -> None:
    broker = f"rocksdb://{tmp_path / 'db'}" if url == "rocksdb" else "memory://gc-tuning"
    result = run_child(
        f"""
        import gc, json
        from scheduler import Scheduler
        from workers.runner import run_app

        app = Scheduler({broker!r}, topic="gc.tuning")
        done = []

        @app.job(name="gc.tuning.job")
        def job(i: int) -> None:
            done.append(i)

        for i in range(50):
            job.schedule(i)
        run_app(app, exit_when_idle=True, freeze_gc={freeze!r})
        app.close()
        print(json.dumps({{"frozen": gc.get_freeze_count(), "done": sorted(done)}}))
        """,
        tmp_path,
    )
    frozen = result["frozen"]
    assert isinstance(frozen, int) and (frozen > 1000 if freeze else frozen == 0)
    assert result["done"] == list(range(50))
