"""Small helpers shared by the test suites: polling instead of sleeping.

Brokers fire messages on their own thread shortly after a ``ManualClock``
advance, so tests wait for a *condition* (with a generous real-time bound)
rather than for a fixed time. None of these helpers asserts how fast anything is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from broker_adapter.base import Consumer
from broker_adapter.results import ReceivedMessage

T = TypeVar("T")

#: Real-time bound for anything asynchronous to happen (not a performance claim).
EVENTUALLY_S = 5.0


#: The ``chronoq`` console script of this venv.
CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
#: The project root.
ROOT = Path(__file__).resolve().parents[1]


def chronoq(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``chronoq ARGV`` (the real console script) from the project root without the
    caller's ``CHRONOQ_*`` variables; its output captured, its exit status not checked."""
    return subprocess.run(
        [CHRONOQ, *argv],
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")},
        capture_output=True,
        text=True,
        timeout=60,
    )


def eventually(
    predicate: Callable[[], T], timeout: float = EVENTUALLY_S, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that value.

    :raises AssertionError: when it is still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} still false after {timeout} s (last value {value!r})")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def pull_until(
    consumer: Consumer, count: int, timeout: float = 10.0, max_messages: int = 32
) -> list[ReceivedMessage]:
    """Pull until ``count`` messages arrived (or ``timeout`` s passed); return them all.

    The caller asserts on the result; this helper never asserts.
    """
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.pull(max_messages=min(max_messages, count - len(got)), wait_ms=200))
    return got


def pull_one(consumer: Consumer, timeout: float = 10.0) -> ReceivedMessage:
    """Pull exactly one message, failing the test if none comes."""
    got = pull_until(consumer, 1, timeout=timeout, max_messages=1)
    assert len(got) == 1, f"expected one message, got {got!r}"
    return got[0]


def assert_nothing(consumer: Consumer, wait_ms: int = 300) -> None:
    """Assert that a short long-poll brings no message (nothing is due for this consumer)."""
    got = consumer.pull(max_messages=32, wait_ms=wait_ms)
    assert got == [], f"expected no message, got {[(m.msg_id, m.attempts) for m in got]}"


def stop_process(
    proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None, timeout: float = 10.0
) -> int | None:
    """SIGTERM a child and reap it, SIGKILL when it outlives ``timeout``; its exit status
    (``None`` without a child)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


#: Prepended to a child's code by :func:`python_without`: ``{module}`` looks uninstalled.
_BLOCKER = """
import sys


class _Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} or name.startswith({module!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
"""


def python_without(module: str, code: str, *argv: str) -> str:
    """Run ``code`` in a child Python (from the project root) in which ``module`` cannot
    be imported, as if its extra were not installed; its stripped standard output.

    :raises subprocess.CalledProcessError: when the child fails.
    """
    out = subprocess.run(
        [sys.executable, "-c", _BLOCKER.format(module=module) + code, *argv],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()
