"""A real Spark standalone cluster for tests and benchmarks: one master, one worker.

Both daemons run from the pip pyspark installation (``SPARK_HOME`` is the
``pyspark`` package directory, whose ``bin/spark-class`` starts them), bound to
127.0.0.1, on ports they pick themselves (``--port 0``, ``--webui-port 0``; read
back from their logs, so no port is ever raced for), with everything they write
(logs, the worker's ``work`` directory with one ``<app id>/<executor id>``
directory per executor, shuffle files) under one root directory. The master's
REST submission server (a fixed port, 6066) is off.

Kept small for a shared 2-core machine: 256 MiB heaps for the daemons, a worker
offering 1 core and 1 GiB, executors of 512 MiB (:meth:`StandaloneCluster.driver_env`).
With 1 core, one application at a time holds the worker: run drivers one after
another (an application waits in the master's queue until the one before exits).

Every process is stopped by :meth:`StandaloneCluster.stop` (:func:`stop_group`:
the leader, then its whole process group, which holds the executors and their
Python workers, then SIGKILL), which the :func:`spark_cluster` fixture calls even
when a test failed; the daemons also get SIGKILL if the process that started them
dies first (``PR_SET_PDEATHSIG``, through ``setpriv`` where util-linux has it), so
a killed test run leaves no JVM behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import pytest

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: Real-time bound for a daemon to start or the worker to register (not a claim on speed).
START_TIMEOUT_S = 120.0
#: ``spark.*`` settings every driver of the cluster gets (small executors, no UI,
#: nothing downloaded, driver on loopback).
DRIVER_CONF: Mapping[str, str] = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "512m",
}

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_UI_PORT = re.compile(r"Successfully started service '(?:MasterUI|WorkerUI)' on port (\d+)")


def spark_home() -> Path:
    """The pip pyspark installation (its ``bin/spark-class`` and ``jars/``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed: pip install chronoq[spark]")
    return Path(spec.origin).parent


def require_java() -> None:
    """Skip the calling test without ``java`` (fail under ``CI=true``)."""
    if shutil.which("java") is None:
        if os.environ.get("CI"):
            pytest.fail("java is not installed: the Spark cluster tests need it")
        pytest.skip("java is not installed")


def _with_pdeathsig(argv: list[str]) -> list[str]:
    # util-linux's setpriv sets PR_SET_PDEATHSIG, then execs: the signal survives the
    # exec of spark-class and of its java (no preexec_fn, unsafe in a threaded
    # parent). Bound to the thread that started the child: start clusters from the
    # main thread (pytest's fixtures do).
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def start_group(
    argv: list[str], env: Mapping[str, str], log: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a process group of its own, output to ``log``, killed
    when this process dies (see the module docstring)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            _with_pdeathsig(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )


def stop_group(proc: subprocess.Popen[Any], timeout: float = 20.0) -> int | None:
    """Stop ``proc`` and everything in its process group; the leader's exit status.

    SIGTERM to the leader first, so it shuts down in order (a worker stops its
    executors; a chronoq worker drains and stops its SparkContext, and the master
    records the application FINISHED); after ``timeout`` s, or once the leader is
    gone, SIGTERM to what is left of the group (a driver's JVM, executors), then
    SIGKILL to whatever still runs 10 s later.
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _group_alive(proc) and time.monotonic() < deadline:
        proc.poll()  # reap the leader: a zombie still counts as a member of the group
        time.sleep(0.1)
    _signal_group(proc, signal.SIGKILL)
    return proc.wait(10)


def _group_alive(proc: subprocess.Popen[Any]) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(proc: subprocess.Popen[Any], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group id is the leader's pid (start_new_session)
    except ProcessLookupError:
        pass


def wait_for_line(
    proc: subprocess.Popen[Any], log: Path, pattern: re.Pattern[str], what: str
) -> re.Match[str]:
    """Poll ``log`` until ``pattern`` matches; raise with the log's tail if the
    process exits or :data:`START_TIMEOUT_S` passes first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = pattern.search(text)
        if found:
            return found
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(text.splitlines()[-30:])
            raise RuntimeError(f"{what} did not start (exit {proc.poll()}); log {log}:\n{tail}")
        time.sleep(0.1)


class StandaloneCluster:
    """A master and one worker under ``root``; see the module docstring.

    :param root: directory for logs (``master.log``, ``worker.log``), the worker's
        ``work`` directory, ``local`` (shuffle files) and ``conf`` (empty).
    :param worker_memory: what the worker offers to executors (``--memory``).
    :param worker_cores: what the worker offers (``--cores``).
    :param daemon_memory: heap of the master and worker JVMs.
    """

    def __init__(
        self,
        root: Path,
        *,
        worker_memory: str = "1g",
        worker_cores: int = 1,
        daemon_memory: str = "256m",
    ) -> None:
        self.root = root
        self.worker_memory = worker_memory
        self.worker_cores = worker_cores
        self.daemon_memory = daemon_memory
        self.work_dir = root / "work"
        self.master_url = ""
        self.webui_url = ""
        self._master: subprocess.Popen[bytes] | None = None
        self._worker: subprocess.Popen[bytes] | None = None

    def daemon_env(self) -> dict[str, str]:
        """The environment of ``spark-class`` for both daemons."""
        for sub in ("conf", "local", "work"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.root / "conf"),  # empty: no stray spark-defaults.conf
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,
        }

    def _spark_class(self, cls: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), cls, *args]

    def start(self) -> Self:
        """Start the master, then the worker; return once the worker registered.

        :raises RuntimeError: if a daemon exits or does not come up in time (with
            its log's tail); whatever started is stopped again.
        """
        env = self.daemon_env()
        try:
            master_log = self.root / "master.log"
            self._master = start_group(
                self._spark_class(
                    MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"
                ),
                env,
                master_log,
            )
            self.master_url = wait_for_line(self._master, master_log, _MASTER_URL, "master")[1]
            ui_port = wait_for_line(self._master, master_log, _UI_PORT, "master web UI")[1]
            self.webui_url = f"http://127.0.0.1:{ui_port}"
            self._worker = start_group(
                self._spark_class(
                    WORKER_CLASS,
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(self.work_dir),
                ),
                env,
                self.root / "worker.log",
            )
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._worker is not None
            if self._worker.poll() is not None:
                tail = (self.root / "worker.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the worker exited ({self._worker.returncode}):\n{tail}")
            try:
                if self.state().get("aliveworkers", 0) >= 1:
                    return
            except OSError:
                pass  # the web UI may still be starting
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker registered with {self.master_url}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the worker (and with it its executors), then the master. Idempotent."""
        for proc in (self._worker, self._master):
            if proc is not None:
                stop_group(proc)
        self._worker = self._master = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the cluster shows ------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master's JSON status (``GET <web UI>/json/``): workers, apps, cores."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as resp:
            state: dict[str, Any] = json.load(resp)
        return state

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master knows, running (``activeapps``) or not
        (``completedapps``); each has ``id``, ``name``, ``state``, ``cores``..."""
        state = self.state()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def applications_named(self, name: str) -> list[dict[str, Any]]:
        """The applications called ``name`` (``spark.app.name``)."""
        return [a for a in self.applications() if a.get("name") == name]

    def executor_dirs(self, app_id: str) -> list[Path]:
        """The worker's directories of ``app_id``'s executors (``work/<app>/<n>``)."""
        app_dir = self.work_dir / app_id
        return sorted(p for p in app_dir.iterdir() if p.is_dir()) if app_dir.is_dir() else []

    def executor_log(self, app_id: str) -> str:
        """The ``stderr`` of every executor of ``app_id`` (the executor's log4j output)."""
        return "".join(
            (d / "stderr").read_text(errors="replace")
            for d in self.executor_dirs(app_id)
            if (d / "stderr").exists()
        )

    def executor_log_with(self, app_id: str, pattern: re.Pattern[str]) -> str | None:
        """:meth:`executor_log` once ``pattern`` occurs in it, else ``None``."""
        text = self.executor_log(app_id)
        return text if pattern.search(text) else None

    def driver_env(self, app_name: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a chronoq process to drive this cluster:
        ``CHRONOQ_SPARK_MASTER`` set to it, and in ``SPARK_CONF`` the
        :data:`DRIVER_CONF`, ``spark.app.name`` and ``conf``."""
        settings = {**DRIVER_CONF, "spark.app.name": app_name, **(conf or {})}
        return {
            **os.environ,
            "CHRONOQ_SPARK_MASTER": self.master_url,
            "SPARK_CONF": ",".join(f"{k}={v}" for k, v in settings.items()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def __repr__(self) -> str:
        return f"<StandaloneCluster {self.master_url or 'stopped'} ui={self.webui_url}>"


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A running :class:`StandaloneCluster` for the module, stopped at its end (also
    after a failure). Skips without ``java`` (fails under ``CI=true``)."""
    require_java()
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    with cluster:
        yield cluster
