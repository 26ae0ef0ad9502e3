"""What only the embedded RocksDB broker promises: one owner per directory,
durability across close and process death, far-future messages, its own limits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.errors import (
    BrokerClosed,
    BrokerLocked,
    InvalidArgument,
    InvalidDelay,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import MessageState, SendStatus
from tests.conftest import START_MS
from tests.helpers import assert_nothing, eventually, pull_one

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
YEAR_MS = 365 * 24 * 3600 * 1000


@pytest.fixture
def broker(data_dir: Path, manual_clock: ManualClock) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(str(data_dir), clock=manual_clock)
    try:
        yield b
    finally:
        b.close()


def run_child(code: str, *args: str, **popen: object) -> subprocess.Popen[str]:
    """Start a Python child that can import the project."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        cwd=REPO,
        text=True,
        **popen,
    )


# ------------------------------------------------------------------- one owner


def test_second_open_in_the_same_process_is_locked_and_names_the_holder(
    broker: EmbeddedBroker, data_dir: Path, manual_clock: ManualClock
) -> None:
    with pytest.raises(BrokerLocked) as info:
        EmbeddedBroker(str(data_dir), clock=manual_clock)
    assert info.value.path and Path(info.value.path).resolve() == data_dir.resolve()
    assert str(os.getpid()) in str(info.value)
    broker.send(Message("t", b"x"))  # the first owner is not disturbed


def test_open_while_another_process_owns_the_directory_is_locked(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    child = run_child(
        """
        import sys
        from broker_adapter.clock import ManualClock
        from broker_adapter.embedded import EmbeddedBroker
        b = EmbeddedBroker(sys.argv[1], clock=ManualClock())
        print("ready", flush=True)
        sys.stdin.read()
        b.close()
        """,
        str(data_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(BrokerLocked) as info:
            EmbeddedBroker(str(data_dir), clock=manual_clock)
        assert str(child.pid) in str(info.value)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        assert child.wait(30) == 0
        if child.stdout is not None:
            child.stdout.close()
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:  # free once it exited
        assert b.stats().pending == 0


def test_reopen_after_close_in_the_same_process_is_allowed(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    EmbeddedBroker(str(data_dir), clock=manual_clock).close()
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        assert b.send(Message("t", b"x")).status is SendStatus.OK


# ------------------------------------------------------------------ durability


def test_data_survives_close_and_reopen(data_dir: Path, manual_clock: ManualClock) -> None:
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        pending = b.send(Message("t", b"later", key="k", delay_ms=60_000))
        aborted = b.send(Message("t", b"gone", delay_ms=60_000))
        b.abort(aborted.msg_id)
        with b.consumer("g", ["t"]) as c:
            b.send(Message("t", b"done"))
            assert c.ack(pull_one(c))
        stats_before = b.stats()
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        view = b.query(pending.msg_id)
        assert view is not None and (view.state, view.key) == (MessageState.PENDING, "k")
        assert b.query(aborted.msg_id) is not None
        assert b.query(aborted.msg_id).state is MessageState.ABORTED  # type: ignore[union-attr]
        stats = b.stats()
        assert (stats.pending, stats.fired_total) == (stats_before.pending, 1)
        assert stats.groups["g"].acked_total == 1
        c = b.consumer("g", ["t"])
        assert_nothing(c)  # the acked one is not delivered again
        manual_clock.advance(60_000)
        got = pull_one(c)
        assert (got.msg_id, got.body) == (pending.msg_id, b"later")
        assert_nothing(c)  # the aborted one never comes


@pytest.mark.parametrize("durability", ["wal", "sync"])
def test_a_sent_message_survives_the_process_dying(
    data_dir: Path, manual_clock: ManualClock, durability: str
) -> None:
    """Once ``send`` returned, killing the process (no close) loses nothing."""
    child = run_child(
        """
        import os, sys
        from broker_adapter.clock import ManualClock
        from broker_adapter.embedded import EmbeddedBroker
        from broker_adapter.message import Message
        b = EmbeddedBroker(sys.argv[1], clock=ManualClock(int(sys.argv[3])),
                           durability=sys.argv[2])
        r = b.send(Message("t", b"survivor", key="k", delay_ms=10_000))
        print(r.msg_id, flush=True)
        os._exit(0)
        """,
        str(data_dir),
        durability,
        str(START_MS),
        stdout=subprocess.PIPE,
    )
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    msg_id = out.strip()
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        view = b.query(msg_id)
        assert view is not None
        assert (view.state, view.deliver_at_ms, view.key) == (
            MessageState.PENDING,
            START_MS + 10_000,
            "k",
        )
        c = b.consumer("g", ["t"])
        manual_clock.advance(10_000)
        got = pull_one(c)
        assert (got.msg_id, got.body) == (msg_id, b"survivor")


def test_messages_that_fell_due_while_closed_fire_on_reopen(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        r = b.send(Message("t", b"x", delay_ms=5_000))
    manual_clock.advance(3_600_000)  # an hour passes while nobody runs the broker
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        got = pull_one(b.consumer("g", ["t"]))
        assert got.msg_id == r.msg_id


# ----------------------------------------------------------------- far future


def test_a_message_three_years_ahead_is_pending_and_queryable(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    due = START_MS + 3 * YEAR_MS
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        r = b.send(Message("t", b"anniversary", deliver_at_ms=due))
        assert (r.status, r.deliver_at_ms) == (SendStatus.OK, due)
        assert [v.msg_id for v in b.pending()] == [r.msg_id]
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:
        view = b.query(r.msg_id)
        assert view is not None and (view.state, view.deliver_at_ms) == (MessageState.PENDING, due)
        c = b.consumer("g", ["t"])
        manual_clock.advance(3 * YEAR_MS - 1)
        assert_nothing(c)
        manual_clock.advance(1)
        assert pull_one(c).msg_id == r.msg_id


# -------------------------------------------------------------- configured limits


def test_max_body_bytes_is_inclusive_and_oversize_stores_nothing(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    with EmbeddedBroker(str(data_dir), clock=manual_clock, max_body_bytes=100) as b:
        assert b.send(Message("t", bytes(100), delay_ms=1_000)).status is SendStatus.OK
        with pytest.raises(MessageTooLarge) as info:
            b.send(Message("t", bytes(101), key="k", delay_ms=1_000))
        assert (info.value.size, info.value.limit) == (101, 100)
        assert len(b.pending()) == 1
        assert b.stats().pending == 1
        assert b.send(Message("t", b"", key="k", delay_ms=1_000)).status is SendStatus.OK


def test_max_delay_ms_is_inclusive_and_further_stores_nothing(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    with EmbeddedBroker(str(data_dir), clock=manual_clock, max_delay_ms=60_000) as b:
        assert b.send(Message("t", b"", delay_ms=60_000)).status is SendStatus.OK
        for bad in (
            Message("t", b"", key="k", delay_ms=60_001),
            Message("t", b"", key="k", deliver_at_ms=START_MS + 60_001),
            Message("t", b"", key="k", delay_level=6),  # 2 minutes
        ):
            with pytest.raises(InvalidDelay):
                b.send(bad)
        assert len(b.pending()) == 1
        assert b.send(Message("t", b"", key="k", delay_ms=1)).status is SendStatus.OK


def test_from_url_passes_limits(data_dir: Path, manual_clock: ManualClock) -> None:
    url = f"rocksdb://{data_dir}?durability=sync&max_body_bytes=10"
    with EmbeddedBroker.from_url(url, clock=manual_clock) as b, pytest.raises(MessageTooLarge):
        b.send(Message("t", bytes(11)))


@pytest.mark.parametrize(
    "kwargs",
    [{"durability": "sometimes"}, {"max_body_bytes": 0}, {"max_delay_ms": -1}, {"window_ms": 0}],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_bad_settings_are_invalid_arguments(
    data_dir: Path, manual_clock: ManualClock, kwargs: dict[str, object]
) -> None:
    with pytest.raises(InvalidArgument):
        EmbeddedBroker(str(data_dir), clock=manual_clock, **kwargs)  # type: ignore[arg-type]
    with EmbeddedBroker(str(data_dir), clock=manual_clock) as b:  # nothing left locked
        assert b.stats().pending == 0


# ----------------------------------------------------------------------- leaks


def test_close_leaves_no_threads_or_file_descriptors(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    proc = psutil.Process()
    threads_before = set(threading.enumerate())
    fds_before = proc.num_fds()
    for _ in range(3):
        b = EmbeddedBroker(str(data_dir), clock=manual_clock)
        c = b.consumer("g", ["t"])
        b.send(Message("t", b"x"))
        b.send_oneway(Message("t", b"y"))
        pull_one(c)
        b.close()
        with pytest.raises(BrokerClosed):
            b.stats()
    eventually(lambda: set(threading.enumerate()) <= threads_before, what="threads stopped")
    eventually(lambda: proc.num_fds() <= fds_before, what="file descriptors closed")
