"""Several client processes on one server at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from broker_adapter.results import GroupStats
from broker_adapter.server.client import RemoteBroker
from tests.helpers import eventually
from tests.server.serverproc import ROOT, ServerProcess

N = 1_000


def _lines(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x]


def test_two_client_processes_send_and_consume_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.server.client_child", server.url, name, str(N), str(out)],
            cwd=ROOT,
        )
        for name in ("a", "b")
    ]
    try:
        with RemoteBroker.from_url(server.url) as watcher:
            eventually(
                lambda: (out / "a.sent").exists() and (out / "b.sent").exists(),
                timeout=120,
                what="both children sent",
            )
            eventually(
                lambda: watcher.stats().groups.get("shared", GroupStats()).acked_total >= 2 * N,
                timeout=120,
                what="every message acked",
            )
            stats = watcher.stats()
        (out / "stop").write_text("")
        for child in children:
            assert child.wait(120) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    sent = _lines(out / "a.sent") + _lines(out / "b.sent")
    received = _lines(out / "a.recv") + _lines(out / "b.recv")
    assert len(set(sent)) == 2 * N
    assert sorted(received) == sorted(sent)  # each exactly once, across the two processes
    assert stats.topics["two"].fired_total == 2 * N
    assert stats.groups["shared"].inflight == 0
