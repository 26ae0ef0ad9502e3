"""Fixtures of the Celery suite: real redis-server, real Celery worker subprocesses,
and a chronoq dispatcher (embedded broker, system clock) publishing to them.

The session's redis-server comes from ``tests/conftest.py`` (``redis_url``, flushed
per test); a test that stops and restarts its broker gets its own
:class:`~tests.redis_server.RedisServer`. Locally a missing ``redis-server`` skips,
with ``CI=true`` it fails (STYLE rule 3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler.scheduler import Scheduler
from tests.celery import jobs
from tests.helpers import eventually, stop_process
from workers import Dispatcher
from workers.celery import celery_app_for

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after
    ``timeout_s`` (a deadline for a hung test, not a timing assertion)."""
    return eventually(check, timeout=timeout_s, what=what)


def runs(url: str, job: str | None = None) -> list[dict[str, Any]]:
    """The run records the jobs pushed to Redis, oldest first."""
    client = redis.Redis.from_url(url)
    try:
        recs = [json.loads(r) for r in client.lrange(jobs.RUNS, 0, -1)]
    finally:
        client.close()
    return [r for r in recs if job is None or r["job"] == job]


class CeleryWorker:
    """``celery -A tests.celery.jobs worker`` as a subprocess; waits for `` ready.``.

    :param url: broker and result backend.
    :param visibility_s: the Redis transport's ``visibility_timeout``.
    :param concurrency: worker threads.
    """

    def __init__(self, url: str, *, visibility_s: float = 3600, concurrency: int = 2) -> None:
        self.url = url
        self.visibility_s = visibility_s
        self.concurrency = concurrency
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self) -> CeleryWorker:
        env = dict(
            os.environ,
            CHRONOQ_CELERY_BROKER_URL=self.url,
            CQ_VISIBILITY=str(self.visibility_s),
            PYTHONPATH=str(ROOT),
        )
        self.proc = subprocess.Popen(
            [CELERY, "-A", "tests.celery.jobs", "worker", "--pool=threads", "-c", str(self.concurrency),
             "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(30):
            self.stop()
            pytest.fail("celery worker not ready in 30 s:\n" + "".join(self.lines[-40:]))
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if " ready." in line:
                self._ready.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-task, acking nothing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM (warm shutdown), SIGKILL after 10 s."""
        stop_process(self.proc)
        self._close_pipe()


class Chronoq:
    """The chronoq side: a Scheduler with the test jobs, its Celery app, and a
    dispatcher thread that publishes due jobs.

    :param data_dir: the embedded broker's directory.
    :param url: the Celery broker and result backend.
    :param max_workers: and ``prefetch``: the dispatcher's slots are their sum.
    :param invisible_ms: the dispatcher's invisible time (default: its own).
    :param publish_script: the executor's ``publish_script`` (``False``: the general
        publish path, as with a result backend apart from the broker).
    """

    def __init__(
        self,
        data_dir: Path,
        url: str,
        *,
        visibility_s: float = 3600,
        max_workers: int = 4,
        prefetch: int = 64,
        invisible_ms: int | None = None,
        publish_script: bool = True,
    ) -> None:
        self.invisible_ms = invisible_ms
        self.scheduler = Scheduler(
            f"rocksdb://{data_dir}", max_workers=max_workers, prefetch=prefetch
        )
        jobs.define(self.scheduler)
        self.celery = celery_app_for(
            self.scheduler,
            url,
            executor_options={"publish_script": publish_script},
            **jobs.celery_conf(visibility_s),
        )
        self.dispatcher: Dispatcher | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def handle(self, name: str) -> Any:
        return self.scheduler.handle(name)

    def start(self) -> Chronoq:
        self.dispatcher = Dispatcher(
            self.scheduler, drain_timeout_s=2, invisible_ms=self.invisible_ms
        )
        self._thread = threading.Thread(
            target=self.dispatcher.run_forever,
            kwargs={"stop_event": self._stop, "poll_ms": 50},
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.scheduler.close()
        self.celery.close()


#: Runs a test once per publish path of the executor: the one-round-trip script
#: (broker and result backend are one Redis database here) and the general path.
_PATHS, _PATH_IDS = [True, False], ["script-publish", "kombu-publish"]
BOTH_PUBLISH_PATHS = pytest.mark.parametrize("publish_script", _PATHS, ids=_PATH_IDS)
#: The same, for the fault and restart tests of several seconds each: their general
#: path runs with ``-m slow`` only (the suite's budget).
BOTH_PUBLISH_PATHS_SLOW_GENERAL = pytest.mark.parametrize(
    "publish_script",
    [
        pytest.param(True, id="script-publish"),
        pytest.param(False, id="kombu-publish", marks=pytest.mark.slow),
    ],
)


@pytest.fixture(params=_PATHS, ids=_PATH_IDS)
def chronoq(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str) -> Iterator[Chronoq]:
    """A running chronoq dispatcher publishing to the session's Redis."""
    side = Chronoq(tmp_path / "data", redis_url, publish_script=request.param).start()
    try:
        yield side
    finally:
        side.close()


@pytest.fixture
def worker(redis_url: str) -> Iterator[CeleryWorker]:
    """A Celery worker subprocess on the session's Redis."""
    w = CeleryWorker(redis_url).start()
    try:
        yield w
    finally:
        w.stop()
