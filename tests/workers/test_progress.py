"""Progress on long command-line work: ``chronoq cancel --key-prefix`` over 20,000
keys of a real ``rocksdb://`` directory shows a progress bar on a terminal (a
pseudo-terminal here) and the same result as without it; piped, or with
``--quiet``, it writes nothing to stderr. The chunk plan covers every key once."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import random
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from broker_adapter import Message, open_broker
from scheduler.progress import progress, show_progress
from tests.helpers import python_without
from workers.prefix_cancel import plan_chunks

pytestmark = pytest.mark.timeout(180)

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
ROOT = Path(__file__).resolve().parents[2]
TOPIC = "shop.jobs"


def _fill(path: Path, n: int) -> str:
    """``n`` pending messages keyed ``order:<i>:close`` plus 3 others; the URL."""
    url = f"rocksdb://{path}"
    due = int(time.time() * 1000) + 3_600_000
    with open_broker(url) as broker:
        for lo in range(0, n, 5000):
            batch = [
                Message(TOPIC, b"{}", f"order:{i}:close", deliver_at_ms=due + i)
                for i in range(lo, min(n, lo + 5000))
            ]
            broker.send_batch(batch)
        broker.send_batch(
            [Message(TOPIC, b"{}", f"other:{i}", deliver_at_ms=due) for i in range(3)]
        )
    return url


def _pending(url: str, prefix: str) -> int:
    with open_broker(url) as broker:
        n, cursor = 0, None
        while True:
            page = broker.find_pending(TOPIC, key_prefix=prefix, limit=1000, cursor=cursor)
            n += len(page.messages)
            if (cursor := page.cursor) is None:
                return n


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, TERM="xterm")


def on_a_terminal(
    argv: list[str], env: dict[str, str], timeout_s: float = 120
) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal (120 columns) and stdout on a
    pipe: its status, what the terminal showed, its stdout."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env
    )
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, shown.decode(errors="replace"), out.decode()


def _cancel_on_a_terminal(url: str, *extra: str) -> tuple[int, str, str]:
    """``chronoq cancel --key-prefix order:`` with stderr on a terminal."""
    argv = [CHRONOQ, "cancel", "--url", url, "--key-prefix", "order:", *extra]
    return on_a_terminal(argv, _env())


def test_cancel_on_a_terminal_shows_progress_and_the_same_result(tmp_path: Path) -> None:
    # Given: 20,000 pending runs under order: (and 3 others)
    url = _fill(tmp_path / "d", 20_000)
    # When: cancelled with stderr on a terminal
    status, shown, out = _cancel_on_a_terminal(url)
    # Then: the terminal showed a bar that counted the keys up to all of them
    assert status == 0, (shown, out)
    assert "cancelling 'order:'" in shown and "100%" in shown, shown[-2000:]
    assert "20.0k/20.0k" in shown and "chunk" in shown, shown[-2000:]
    assert "\r" in shown  # redrawn in place, not a line per update
    # And: the result on stdout is the plain one; nothing under the prefix is left
    assert out.strip() == "aborted 20000; already fired 0"
    assert _pending(url, "order:") == 0 and _pending(url, "other:") == 3


def test_quiet_or_not_a_terminal_writes_nothing_to_stderr(tmp_path: Path) -> None:
    # Given: --quiet on a terminal
    url = _fill(tmp_path / "q", 3000)
    status, shown, out = _cancel_on_a_terminal(url, "--quiet")
    assert (status, shown, out.strip()) == (0, "", "aborted 3000; already fired 0")
    # Given: stderr on a pipe
    url = _fill(tmp_path / "p", 3000)
    argv = [CHRONOQ, "cancel", "--url", url, "--key-prefix", "order:"]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=_env(), timeout=120, check=False
    )
    assert (done.returncode, done.stderr, done.stdout.strip()) == (
        0,
        "",
        "aborted 3000; already fired 0",
    )
    assert _pending(url, "order:") == 0 and _pending(url, "other:") == 3


def test_the_chunk_plan_covers_every_key_once() -> None:
    rng = random.Random(7)
    cases = [
        [f"order:{i}:close" for i in range(2000)],
        [f"order:{rng.getrandbits(64):x}" for _ in range(3000)],
        ["order:", "order:a", "order:aa", *[f"order:aa{i}" for i in range(1200)]],
        ["order:x" * 3] * 1,
        [],
    ]
    for keys in cases:
        keys = sorted(set(keys))
        plan = plan_chunks("order:", keys, chunk=100)
        # Every key is under exactly one chunk (a prefix chunk or its own key)
        for key in keys:
            under = [p for p, _n, exact in plan if (key == p if exact else key.startswith(p))]
            assert len(under) == 1, (key, under)
        assert sum(n for _p, n, _e in plan) == len(keys)
        assert all(n <= 100 for _p, n, _e in plan)
        assert [p for p, _n, _e in plan] == sorted(p for p, _n, _e in plan)


def test_the_decision_is_terminal_and_not_quiet() -> None:
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert show_progress(stream=tty) is True
            assert show_progress(quiet=True, stream=tty) is False
        assert show_progress(stream=io.StringIO()) is False
        bar = progress("x", total=3, stream=io.StringIO())
        assert bar.shown is False
        bar.update(3)  # does nothing, raises nothing
        bar.close()
    finally:
        os.close(master)
        os.close(slave)


#: With ``tqdm`` unimportable, on a terminal: no bar, and the work still goes on.
CHILD = r"""
import os
import pty
import sys

from scheduler.progress import progress

master, slave = pty.openpty()
with open(slave, "w", closefd=False) as tty:
    with progress("x", total=2, stream=tty) as bar:
        bar.update(2)
    print(bar.shown, "tqdm" in sys.modules)
"""


def test_without_tqdm_there_is_no_bar_and_no_error() -> None:
    assert python_without("tqdm", CHILD).splitlines()[-1] == "False False"
