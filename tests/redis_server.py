"""Real ``redis-server`` processes on 127.0.0.1 for tests (no mocks, no docker).

:func:`require_redis_server` skips a test locally when ``redis-server`` is not
installed and fails it when ``CI=true`` (STYLE rule 3). :class:`RedisServer` runs
one server on a free loopback port; :class:`RedisClusterProcs` runs a small
Redis Cluster of masters made by ``redis-cli --cluster create``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.helpers import stop_process


def require_redis_server() -> str:
    """The path of ``redis-server``; skip (or fail on CI) when it is missing."""
    path = shutil.which("redis-server")
    if path is None or shutil.which("redis-cli") is None:
        message = "redis-server/redis-cli not installed (apt-get install redis-server)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(cluster_bus: bool = False) -> int:
    """A TCP port free on 127.0.0.1 right now; with ``cluster_bus`` also port + 10000
    (Redis Cluster's bus port, which must stay below 65536)."""
    if not cluster_bus:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            return port
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 50_000)
        if _is_free(port) and _is_free(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """One ``redis-server`` on ``127.0.0.1:port``, data in ``workdir``.

    :param aof: ``appendonly yes`` with ``appendfsync always`` (every acknowledged
        write is on disk before the reply).
    :param cluster: ``cluster-enabled yes``.
    :param appendfsync: ``appendonly yes`` with this ``appendfsync`` (``always``,
        ``everysec``, ``no``) instead of what ``aof`` says.
    :param save: the ``save`` rules (``""``: no snapshots).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        aof: bool = False,
        cluster: bool = False,
        appendfsync: str | None = None,
        save: str = "",
    ) -> None:
        self.binary = require_redis_server()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port(cluster_bus=cluster)
        self.aof = aof
        self.cluster = cluster
        self.appendfsync = appendfsync
        self.save = save
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start and wait until it answers PING (at most 10 s)."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            self.save,
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        if self.appendfsync is not None:
            args += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        elif self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.workdir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
                except redis.BusyLoadingError:
                    time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed beyond what Redis already wrote."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 10 s)."""
        stop_process(self.proc)


class RedisSentinelProcs:
    """A master, one replica and one Sentinel (quorum 1) watching them as ``service``;
    ``redis+sentinel://`` URLs reach the master through it."""

    def __init__(self, workdir: Path, service: str = "chronoq") -> None:
        self.binary = require_redis_server()
        self.workdir = workdir
        self.service = service
        self.master = RedisServer(workdir / "master")
        self.replica = RedisServer(workdir / "replica")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}"

    def start(self) -> RedisSentinelProcs:
        """Start the master, the replica (synced) and the Sentinel (it knows the master)."""
        self.master.start()
        self.replica.start()
        replica = redis.Redis(host="127.0.0.1", port=self.replica.port)
        try:
            replica.replicaof("127.0.0.1", self.master.port)
            _wait(
                lambda: replica.info("replication").get("master_link_status") == "up",
                "the replica did not sync",
            )
        finally:
            replica.close()
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\n"
            f"dir {self.workdir}\nlogfile {self.workdir / 'sentinel.log'}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            f"sentinel failover-timeout {self.service} 5000\n"
        )
        self.proc = subprocess.Popen(
            [self.binary, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        sentinel = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)

        def knows_master() -> bool:
            try:
                return bool(sentinel.sentinel_get_master_addr_by_name(self.service))
            except redis.ConnectionError:
                return False

        try:
            _wait(knows_master, "the sentinel did not start")
        finally:
            sentinel.close()
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        self.replica.stop()
        self.master.stop()


def _wait(predicate: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class RedisClusterProcs:
    """``masters`` cluster-enabled servers joined by ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.nodes = [RedisServer(workdir / f"node{i}", cluster=True) for i in range(masters)]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> RedisClusterProcs:
        """Start the nodes, create the cluster, wait until it says ``cluster_state:ok``."""
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        for node in self.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port)
            try:
                while _cluster_state(client) != "ok":
                    assert time.monotonic() < deadline, "the cluster did not become ok"
                    time.sleep(0.05)
            finally:
                client.close()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _cluster_state(client: redis.Redis) -> str:
    info = client.cluster("INFO")  # typed; sends CLUSTER INFO
    if isinstance(info, dict):  # redis-py parses the reply
        return str(info.get("cluster_state", ""))
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "ok" if "cluster_state:ok" in text else "fail"
