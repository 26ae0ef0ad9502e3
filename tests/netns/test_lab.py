"""The lab itself: hosts reach each other only on 198.51.100.0/24, faults cut and
heal, and nothing is left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.netns.lab import SUBNET, Lab, _namespaces, require_netns

pytestmark = [pytest.mark.slow, pytest.mark.external_service]


PORT = 8765
_CONNECT = (
    "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1.5).close()"
)


def _reaches(lab: Lab, src: str, dst: str) -> bool:
    """Whether a TCP connect from ``src`` to the listener on ``dst`` succeeds."""
    argv = [sys.executable, "-c", _CONNECT, lab.addr(dst), str(PORT)]
    done = subprocess.run(
        ["ip", "netns", "exec", lab.ns(src), *argv], check=False, capture_output=True, timeout=30
    )
    return done.returncode == 0


def _addresses(lab: Lab, host: str) -> str:
    return subprocess.run(
        ["ip", "-n", lab.ns(host), "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout


def test_hosts_partition_heal_and_cleanup(lab: Lab, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "http.server", "--bind", lab.addr("r"), str(PORT)]
    lab.spawn("r", argv, {"PATH": "/usr/bin:/bin"}, tmp_path / "http.log", tmp_path)
    deadline = time.monotonic() + 30
    while not _reaches(lab, "a", "r"):
        assert time.monotonic() < deadline, "the listener on R did not start"
        time.sleep(0.2)
    assert _reaches(lab, "b", "r")
    for host in lab.hosts:
        for line in _addresses(lab, host).splitlines():
            if " inet " in line:
                address = line.split(" inet ")[1].split("/")[0]
                assert address == "127.0.0.1" or address.startswith(SUBNET + "."), line
        routes = subprocess.run(
            ["ip", "-n", lab.ns(host), "route"], capture_output=True, text=True, check=True
        ).stdout
        assert "default" not in routes
    lab.partition("b")
    assert not _reaches(lab, "b", "r")
    assert _reaches(lab, "a", "r")
    lab.heal("b")
    assert _reaches(lab, "b", "r")
    lab.degrade("a", delay_ms=50, loss_pct=0)  # the frames now pass the userspace wire
    assert _reaches(lab, "a", "r")
    lab.heal("a")
    assert _reaches(lab, "a", "r")


def test_wire_delays_and_drops(lab: Lab, tmp_path: Path) -> None:
    # Given a listener on R, when A's link drops every frame, nothing gets through;
    # with a delay only, data crosses (echoed through a real TCP connection)
    argv = [sys.executable, "-m", "http.server", "--bind", lab.addr("r"), str(PORT)]
    lab.spawn("r", argv, {"PATH": "/usr/bin:/bin"}, tmp_path / "http.log", tmp_path)
    deadline = time.monotonic() + 30
    while not _reaches(lab, "a", "r"):
        assert time.monotonic() < deadline, "the listener on R did not start"
        time.sleep(0.2)
    lab.degrade("a", delay_ms=1, loss_pct=100)
    assert not _reaches(lab, "a", "r")
    lab.heal("a")
    lab.degrade("a", delay_ms=50, loss_pct=5)
    fetch = "import urllib.request, sys; print(len(urllib.request.urlopen(sys.argv[1], timeout=20).read()))"
    url = f"http://{lab.addr('r')}:{PORT}/"
    done = subprocess.run(
        ["ip", "netns", "exec", lab.ns("a"), sys.executable, "-c", fetch, url],
        check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def test_close_removes_namespaces_and_processes(tmp_path: Path) -> None:
    require_netns()
    with Lab(tmp_path) as lab:
        proc = lab.spawn("r", ["sleep", "600"], {"PATH": "/usr/bin:/bin"}, tmp_path / "sleep.log")
        names = {lab.ns(h) for h in lab.hosts} | {lab.hub}
        assert names <= _namespaces()
    assert proc.poll() is not None
    assert not names & _namespaces()
