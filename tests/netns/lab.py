"""Hosts as Linux network namespaces, joined by a bridge, with faults between them.

:class:`Lab` creates one namespace per host (``R``, ``A``, ``B`` by default) and
a hub namespace holding a bridge ``br0``. Each host gets a veth pair made
*inside* the hub (``ip -n HUB link add r0 type veth peer name eth0 netns HOST``),
so no interface ever appears in the machine's own namespace, and an address from
``198.51.100.0/24`` (TEST-NET-2, :data:`SUBNET`): ``R`` is ``.1``, ``A`` ``.2``,
``B`` ``.3``. There is no default route: a host reaches the other hosts and its
own loopback, nothing else. Names are unique per run (``cq<pid>r``, ``cq<pid>h``).

Processes run inside a host with ``ip netns exec`` (it execs, it does not fork),
each in a process group of its own with ``PR_SET_PDEATHSIG`` (``setpriv
--pdeathsig KILL``, as in :mod:`tests.spark.standalone`): they die with the test
process even when it is killed. :meth:`Lab.close` stops every group, then deletes
the namespaces (which removes their interfaces and qdiscs); the :func:`lab`
fixture calls it also when a test fails.

Faults act on the hub's side of a host's link: :meth:`Lab.partition` sets the
port down (the host keeps its address and routes, its packets vanish: no reset,
what a cut cable looks like to TCP), :meth:`Lab.degrade` adds delay and loss
with :mod:`tests.netns.wire` (this VM's kernel has no ``sch_netem`` nor any
``tc`` classifier or action, only ``tbf``/``htb``), :meth:`Lab.heal` undoes both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import pytest

from tests.spark.standalone import start_group, stop_group

_ROOT = Path(__file__).resolve().parents[2]
#: The only addresses the lab uses (RFC 5737 TEST-NET-2).
SUBNET = "198.51.100"
#: Host name -> last octet of its address.
HOST_OCTETS: Mapping[str, int] = {"r": 1, "a": 2, "b": 3}


def _ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _skip_or_fail(reason: str) -> None:
    # A missing service fails under CI=true (tests/redis_server.py does the same).
    if _ci():
        pytest.fail(reason)
    pytest.skip(reason)


def require_netns() -> None:
    """Skip (fail under ``CI=true``) unless ``ip`` and ``setpriv`` exist and
    this process may create a network namespace."""
    missing = [tool for tool in ("ip", "setpriv") if shutil.which(tool) is None]
    if missing:
        _skip_or_fail(f"{', '.join(missing)} not installed (apt-get install iproute2 util-linux)")
    probe = f"cq{os.getpid()}p"
    made = subprocess.run(
        ["ip", "netns", "add", probe], check=False, capture_output=True, text=True
    )
    if made.returncode != 0:
        _skip_or_fail(f"ip netns add is not permitted here (root needed): {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _namespaces() -> set[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=30
    )
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


class Lab:
    """Namespaced hosts on one bridge; see the module docstring.

    :param root: directory for the processes' logs.
    :param hosts: host names (keys of :data:`HOST_OCTETS`).
    """

    def __init__(self, root: Path, hosts: tuple[str, ...] = ("r", "a", "b")) -> None:
        self.root = root
        self.tag = f"cq{os.getpid()}"
        self.hosts = hosts
        self.hub = f"{self.tag}h"
        self.procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        self._wires: dict[str, subprocess.Popen[bytes]] = {}

    def ns(self, host: str) -> str:
        """The namespace name of ``host``."""
        return f"{self.tag}{host}"

    @staticmethod
    def addr(host: str) -> str:
        """The address of ``host`` (in :data:`SUBNET`)."""
        return f"{SUBNET}.{HOST_OCTETS[host]}"

    def start(self) -> Self:
        """Create the hub, its bridge and the hosts; each host's link is up."""
        for ns in (self.hub, *(self.ns(h) for h in self.hosts)):
            subprocess.run(
                ["ip", "netns", "del", ns], check=False, capture_output=True
            )  # a stale one
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for host in self.hosts:
            port, ns = f"{host}0", self.ns(host)
            _ip(
                "-n",
                self.hub,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", self.hub, "link", "set", port, "master", "br0")
            _ip("-n", self.hub, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(host)}/24", "dev", "eth0")
            # One TCP segment per packet: the userspace wire (see degrade) cannot split
            # a GSO super-frame into frames of the MTU.
            _ip("-n", ns, "link", "set", "eth0", "gso_max_segs", "1")
            _ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def spawn(
        self, host: str, argv: list[str], env: Mapping[str, str], log: Path, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` inside ``host`` as a process group (output to ``log``)."""
        return self._spawn_in(self.ns(host), argv, env, log, cwd)

    def _spawn_in(
        self, ns: str, argv: list[str], env: Mapping[str, str], log: Path, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        proc = start_group(["ip", "netns", "exec", ns, *argv], env, log, cwd)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """``kill -9`` the process group of ``proc`` and reap its leader."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)

    def partition(self, host: str) -> None:
        """Cut ``host`` off: its port on the bridge goes down. Its own ``eth0`` keeps
        its address and routes; what it sends is dropped, silently (no reset)."""
        _ip("-n", self.hub, "link", "set", f"{host}0", "down")

    def degrade(self, host: str, delay_ms: int, loss_pct: float) -> None:
        """Delay each frame to and from ``host`` by ``delay_ms`` and drop ``loss_pct`` %
        of them, in each direction (a round trip gains twice the delay): its port
        leaves the bridge and :mod:`tests.netns.wire` forwards between it and a new
        port ``<host>1``."""
        port, wire_end, bridge_end = f"{host}0", f"{host}w", f"{host}1"
        _ip("-n", self.hub, "link", "add", wire_end, "type", "veth", "peer", "name", bridge_end)
        for dev in (wire_end, bridge_end):
            _ip("-n", self.hub, "link", "set", dev, "gso_max_segs", "1")
        _ip("-n", self.hub, "link", "set", bridge_end, "master", "br0")
        _ip("-n", self.hub, "link", "set", port, "nomaster")
        for dev in (port, wire_end, bridge_end):
            _ip("-n", self.hub, "link", "set", dev, "promisc", "on", "up")
        argv = [sys.executable, "-m", "tests.netns.wire", port, wire_end,
                "--delay-ms", str(delay_ms), "--loss", str(loss_pct)]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(_ROOT)}
        self._wires[host] = self._spawn_in(
            self.hub, argv, env, self.root / f"wire-{host}.log", _ROOT
        )

    def heal(self, host: str) -> None:
        """Remove the faults of ``host``'s link: its port is up and on the bridge again."""
        wire = self._wires.pop(host, None)
        if wire is not None:
            self.kill(wire)
            _ip("-n", self.hub, "link", "del", f"{host}w")
            _ip("-n", self.hub, "link", "set", f"{host}0", "master", "br0")
        _ip("-n", self.hub, "link", "set", f"{host}0", "up")

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL), then delete the namespaces."""
        for proc in reversed(self.procs):
            try:
                stop_group(proc, timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                pass
        self.procs.clear()
        deadline = time.monotonic() + 10
        for ns in reversed(self._made):
            # A namespace whose last process is still exiting may refuse once.
            while subprocess.run(
                ["ip", "netns", "del", ns], check=False, capture_output=True
            ).returncode:
                if ns not in _namespaces() or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        self._made.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
