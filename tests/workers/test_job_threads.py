"""JobThreads, the local executor's pool: bounded threads, futures, shutdown, exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.helpers import eventually
from workers.executors.local import JobThreads

ROOT = Path(__file__).resolve().parents[2]


def test_calls_run_on_at_most_max_workers_threads() -> None:
    pool = JobThreads(3, "tj")
    names: set[str] = set()
    lock = threading.Lock()
    gate = threading.Event()

    def job(i: int) -> int:
        gate.wait(5)
        with lock:
            names.add(threading.current_thread().name)
        return i * 2

    futures = [pool.submit(job, (i,)) for i in range(20)]
    gate.set()
    assert [f.result(10) for f in futures] == [i * 2 for i in range(20)]
    assert names <= {"tj_0", "tj_1", "tj_2"}
    pool.shutdown()


def test_an_error_lands_in_the_future_and_the_thread_goes_on() -> None:
    pool = JobThreads(1, "tj")

    def boom() -> None:
        raise ValueError("boom")

    failed = pool.submit(boom, ())
    with pytest.raises(ValueError, match="boom"):
        failed.result(5)
    assert pool.submit(lambda: 7, ()).result(5) == 7
    pool.shutdown()


def test_shutdown_cancels_the_queued_lets_the_running_finish_and_refuses_more() -> None:
    pool = JobThreads(1, "tj")
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "done"

    running = pool.submit(slow, ())
    assert started.wait(5)
    queued = pool.submit(lambda: "never", ())
    stopper = threading.Thread(target=pool.shutdown)
    stopper.start()
    eventually(queued.cancelled, timeout=5)
    release.set()
    stopper.join(5)
    assert running.result(1) == "done"
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: 1, ())


def test_an_interpreter_that_never_shuts_the_pool_down_still_exits(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from workers.executors.local import JobThreads
            pool = JobThreads(2, "tj")
            fut = pool.submit(time.sleep, (0.3,))
            print("submitted", flush=True)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "submitted"
