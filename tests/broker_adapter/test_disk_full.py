"""The embedded broker on a full disk: a real, small tmpfs filled by sends.

Root may mount a tmpfs here; where it may not, these tests skip with the reason
(and fail under ``CI=true``). Each test grows the tmpfs (``remount,size=``) to
free space, since RocksDB needs room for its WAL replay when it reopens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import ManualClock
from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.errors import BrokerError, StorageFull
from broker_adapter.message import Message
from broker_adapter.results import MessageState, SendStatus
from scheduler.scheduler import Scheduler
from scheduler.spec import RetryPolicy
from tests.helpers import eventually, pull_one
from workers import Dispatcher

HOUR_MS = 3_600_000
BODY = b"x" * 1000


def _mount(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MB tmpfs, unmounted at the end."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = _mount(["-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)])
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def grow(mnt: Path, size: str = "200m") -> None:
    """Free space by growing the tmpfs."""
    done = _mount(["-o", f"remount,size={size}", str(mnt)])
    assert done.returncode == 0, done.stderr


def fill(broker: BrokerAdapter, topic: str = "t") -> tuple[list[str], StorageFull]:
    """Send keyed 1 KB messages due in an hour until the disk is full; the accepted
    ids and the error."""
    accepted: list[str] = []
    for i in range(1_000_000):
        try:
            r = broker.send(Message(topic, BODY, key=f"k{i}", delay_ms=HOUR_MS))
        except StorageFull as e:
            return accepted, e
        assert r.status is SendStatus.OK
        accepted.append(r.msg_id)
    raise AssertionError("the disk never filled")


COUNT_CHILD = textwrap.dedent(
    """
    import sys
    from broker_adapter.embedded.broker import EmbeddedBroker
    from broker_adapter.results import MessageState
    b = EmbeddedBroker(sys.argv[1])
    ids = open(sys.argv[2]).read().split()
    pending = sum(1 for i in ids if (v := b.query(i)) and v.state is MessageState.PENDING)
    print(pending, b.stats().topics["t"].pending)
    b.close()
    """
)


def test_full_disk_refuses_writes_serves_reads_and_the_same_broker_resumes(
    small_disk: Path, tmp_path: Path
) -> None:
    # Given a broker on a 40 MB disk, filled with 1 KB sends
    data = small_disk / "db"
    broker = EmbeddedBroker(data)
    try:
        accepted, err = fill(broker)
        # Then the error is typed, names the directory and says what to do
        assert isinstance(err, BrokerError)
        assert str(data) in str(err) and "free space" in str(err)
        assert len(accepted) > 1000
        with pytest.raises(StorageFull):  # and later sends are refused too
            broker.send(Message("t", BODY, key="refused", delay_ms=HOUR_MS))
        # reads still answer
        view = broker.query(accepted[-1])
        assert view is not None and view.state is MessageState.PENDING
        assert len(broker.pending("t", limit=10)) == 10
        assert broker.find_pending(topic="t", limit=5).messages
        assert broker.stats().topics["t"].pending >= len(accepted)
        # When space is freed, the SAME broker writes again by itself
        grow(small_disk)

        def sent() -> bool:
            try:
                r = broker.send(Message("t", BODY, key="after", delay_ms=HOUR_MS))
            except StorageFull:
                return False
            accepted.append(r.msg_id)
            return True

        eventually(sent, timeout=15, what="a send after freeing space")
        # a refused keyed send was not stored: its retry is a fresh OK
        r = broker.send(Message("t", BODY, key="refused", delay_ms=HOUR_MS))
        assert r.status is SendStatus.OK
        accepted.append(r.msg_id)
        assert broker.stats().topics["t"].pending == len(accepted)
    finally:
        broker.close()
    # Then a new process finds every accepted message pending
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(accepted))
    out = subprocess.run(
        [sys.executable, "-c", COUNT_CHILD, str(data), str(ids)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(accepted)), str(len(accepted))]


def test_close_on_a_full_disk_releases_and_opening_says_storage_full(small_disk: Path) -> None:
    # Given a broker whose disk filled up
    data = small_disk / "db"
    broker = EmbeddedBroker(data)
    accepted, _err = fill(broker)
    # When it closes, that does not raise and the directory is released
    broker.close()
    # Then opening again while the disk is still full says so (not BrokerLocked)
    with pytest.raises(StorageFull, match="no space left"):
        EmbeddedBroker(data)
    # And once space is freed, a new broker in this process opens it with everything
    grow(small_disk)
    again = EmbeddedBroker(data)
    try:
        assert again.stats().topics["t"].pending == len(accepted)
        assert again.send(Message("t", b"more")).status is SendStatus.OK
    finally:
        again.close()


def test_close_with_unsaved_consumer_cursors_on_a_full_disk_still_releases(
    small_disk: Path,
) -> None:
    # Given a consumer that acked a message after the disk filled up (its cursor is
    # still to be saved, and saving it is refused)
    data = small_disk / "db"
    broker = EmbeddedBroker(data)
    sent = broker.send(Message("c", b"now"))
    consumer = broker.consumer("g", ["c"])
    got = pull_one(consumer)
    assert got.msg_id == sent.msg_id
    fill(broker)
    with contextlib.suppress(StorageFull):  # its cursor write may be refused at once
        consumer.ack(got)
    # When the broker closes, that does not raise, and the directory is released
    broker.close()
    grow(small_disk)
    again = EmbeddedBroker(data)
    try:
        # Then nothing is lost: the message is acked or, its cursor unsaved, delivered
        # again (at least once)
        redelivered = again.consumer("g", ["c"]).pull(8, 500)
        assert [m.msg_id for m in redelivered] in ([], [sent.msg_id])
    finally:
        again.close()


def test_a_nack_refused_by_a_full_disk_keeps_the_message_in_flight(small_disk: Path) -> None:
    # Given a pulled message, then a full disk
    clock = ManualClock(1_000_000)
    broker = EmbeddedBroker(small_disk / "db", clock=clock)
    try:
        consumer = broker.consumer("g", ["job"])
        broker.send(Message("job", b"work"))
        m = pull_one(consumer)
        fill(broker)
        # When the dispatcher nacks it, the write is refused with a typed error
        with pytest.raises(StorageFull):
            consumer.nack(m, delay_ms=0, reason="failed")
        # Then the message is still in flight (not lost, not skipped by a cursor)
        assert broker.stats().topics["job"].inflight == 1
        # and once there is room the nack goes through and it comes back
        grow(small_disk)

        def nacked() -> bool:
            try:
                return consumer.nack(m, delay_ms=0, reason="failed")
            except StorageFull:
                return False

        assert eventually(nacked, timeout=15, what="a nack after freeing space")
        again = pull_one(consumer)
        assert again.msg_id == m.msg_id and again.attempts == m.attempts + 1
    finally:
        broker.close()


def test_a_dispatcher_survives_a_retry_refused_by_a_full_disk_and_runs_the_job_again(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job whose first attempt fails while the disk fills up
    clock = ManualClock(1_000_000)
    app = Scheduler(f"rocksdb://{small_disk / 'db'}", clock=clock, max_workers=2, prefetch=4)
    attempts: list[int] = []

    @app.job(retry=RetryPolicy(delays_ms=(1_000,)))
    def flaky() -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            fill(app.broker)
            raise RuntimeError("first attempt fails")

    try:
        flaky.schedule()
        with Dispatcher(app) as dispatcher:
            # When its retry (a nack) is refused, the dispatcher logs it and lives on
            assert dispatcher.run_until_idle() == 1
            eventually(
                lambda: "retry failed" in caplog.text and "no space left" in caplog.text,
                timeout=20,
                what="the refused retry logged",
            )
            # Then, once there is room, the message comes back after its invisible
            # time and the job runs again
            grow(small_disk)
            clock.advance(61_000)

            def ran_again() -> bool:
                dispatcher.run_until_idle(timeout_s=1)
                return len(attempts) == 2

            eventually(ran_again, timeout=20, what="the second attempt")
    finally:
        app.close()
