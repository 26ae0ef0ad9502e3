"""Backups, checks and repair of the embedded broker's data directory (issue 18 §2).

Real directories, corrupted the ways a disk or a person does it; real
``chronoq broker`` subprocesses; a real ``chronoq broker serve`` for the admin
request and SIGUSR1.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker_adapter import open_broker
from broker_adapter.clock import ManualClock
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.embedded.check import check_directory, open_read_only
from broker_adapter.embedded.repair import repair_directory
from broker_adapter.embedded.store import RocksStore
from broker_adapter.errors import (
    AuthenticationFailed,
    BrokerError,
    BrokerLocked,
    InvalidArgument,
)
from broker_adapter.message import Message
from broker_adapter.results import MessageState, SendStatus
from broker_adapter.server.link import Link
from tests.helpers import pull_until
from tests.server.serverproc import ROOT, ServerProcess

START_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
DUE_MS = START_MS + HOUR_MS
N = 300


def chronoq(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``chronoq`` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A closed directory: N keyed messages pending, 20 fired and acked, one aborted."""
    path = tmp_path / "base"
    clock = ManualClock(START_MS)
    b = EmbeddedBroker(path, clock=clock)
    c = b.consumer("g", ["now"])
    for i in range(20):
        b.send(Message("now", b"done", key=f"n{i}"))
    assert len(pull_until(c, 20)) == 20  # (fired by the wheel thread meanwhile)
    b.send_batch([Message("t", b"y" * 100, key=f"k{i}", deliver_at_ms=DUE_MS) for i in range(N)])
    b.send(Message("t", b"gone", key="aborted", deliver_at_ms=DUE_MS))
    assert b.abort(key="aborted", topic="t").status.value == "ABORTED"
    b.close()
    return path


def copy_of(base: Path, name: str) -> Path:
    dest = base.parent / name
    shutil.copytree(base, dest)
    return dest


def pending_ids(path: Path) -> set[str]:
    """Ids of the pending messages of topic t (the broker opened on ``path``)."""
    b = EmbeddedBroker(path, clock=ManualClock(START_MS))
    try:
        return {v.msg_id for v in b.pending("t", limit=10 * N)}
    finally:
        b.close()


# -- check ------------------------------------------------------------------------------


def test_check_of_a_sound_directory_counts_keys_and_exits_0(base: Path) -> None:
    done = chronoq("broker", "check", "--data-dir", str(base), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["problems"] == {}
    assert report["families"]["wheel"] == N
    assert report["families"]["keys"] == N + 21
    assert report["families"]["aborted"] == 1


def test_check_refuses_a_directory_a_live_process_holds(base: Path) -> None:
    b = EmbeddedBroker(base, clock=ManualClock(START_MS))
    try:
        with pytest.raises(BrokerLocked, match="this process"):  # in this process too,
            check_directory(base)
        with pytest.raises(BrokerLocked):
            repair_directory(base)
        done = chronoq("broker", "check", "--data-dir", str(base))  # and its lock stays
    finally:
        b.close()
    assert done.returncode == 2
    assert "is held by" in done.stderr and "backup" in done.stderr


def test_a_deleted_message_record_is_reported_and_repair_drops_its_key(base: Path) -> None:
    # Given the wheel record of the message with key k7 deleted by hand
    store = RocksStore(base)
    tid = int(K.U16.unpack(store.cf[K.CF_META].get(K.META_TOPIC + b"t"))[0])
    index = store.cf[K.CF_KEYS].get(K.tid_bytes(tid) + b"k7")
    assert index is not None
    store.cf[K.CF_WHEEL].delete(index[:16])
    store.close()
    lost_id = K.make_id(index[:16], tid).hex()
    # When checked, the dangling key and the counter are reported with the id
    done = chronoq("broker", "check", "--data-dir", str(base), "--json")
    assert done.returncode == 1
    problems = json.loads(done.stdout)["problems"]
    assert problems["dangling_key"]["count"] == 1
    assert lost_id in problems["dangling_key"]["examples"][0]
    assert problems["counter_mismatch"]["count"] == 1
    # Then repair reports it lost, by id, and leaves a sound directory
    report = repair_directory(base)
    assert report.lost == [lost_id] and report.lost_range() == (lost_id, lost_id)
    assert (report.pending_claimed, report.pending_found) == (N, N - 1)
    assert report.after is not None and report.after.exit_code == 0
    assert len(pending_ids(base)) == N - 1
    b = EmbeddedBroker(base, clock=ManualClock(START_MS))
    try:  # the key is free again: a new send with it is stored
        r = b.send(Message("t", b"again", key="k7", deliver_at_ms=DUE_MS))
        assert r.status is SendStatus.OK
    finally:
        b.close()


@pytest.mark.parametrize("damage", ["missing CURRENT", "garbage MANIFEST"])
def test_a_broken_manifest_is_unusable_and_repair_recovers_everything(
    base: Path, damage: str
) -> None:
    before = pending_ids(copy_of(base, "reference"))
    if damage == "missing CURRENT":
        (base / "CURRENT").unlink()
    else:
        manifest = next(base.glob("MANIFEST-*"))
        manifest.write_bytes(os.urandom(600))
    # check: exit 2, unusable, with RocksDB's reason
    done = chronoq("broker", "check", "--data-dir", str(base))
    assert done.returncode == 2 and "UNUSABLE" in done.stdout
    # repair: RocksDB rebuilds the MANIFEST; nothing is lost
    done = chronoq("broker", "check", "--data-dir", str(base), "--repair", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["rocksdb_repair"] and report["lost"]["count"] == 0
    assert report["after"]["ok"]
    assert pending_ids(base) == before


def _wheel_table(path: Path) -> Path:
    """The table file holding the wheel family (16-byte keys, the most entries)."""
    db = open_read_only(path)
    try:
        files = db.live_files()
    finally:
        db.close()
    wheel = max(
        (f for f in files if len(f["start_key"]) == 16), key=lambda f: int(f["num_entries"])
    )
    assert int(wheel["num_entries"]) >= N
    return path / str(wheel["name"]).lstrip("/")


def test_flipped_bytes_in_a_table_block_are_found_and_repair_salvages_the_rest(
    base: Path,
) -> None:
    # Given a few bytes flipped inside the first data block of the wheel's table
    table = _wheel_table(base)
    data = bytearray(table.read_bytes())
    for at in range(200, 208):
        data[at] ^= 0xFF
    table.write_bytes(bytes(data))
    # When checked: a checksum problem in the wheel family, exit 1
    report = check_directory(base)
    assert report.exit_code == 1
    assert report.bad_families == ["wheel"]
    assert "checksum" in report.problems
    # and a broker reading it gets a typed error that names the next step
    b = EmbeddedBroker(base, clock=ManualClock(START_MS))
    try:
        with pytest.raises(BrokerError, match="chronoq broker check"):
            b.pending("t", limit=N)
    finally:
        b.close()
    # Then repair salvages the readable rows, reports the lost ones by id, and the
    # directory is sound again
    repaired = repair_directory(base)
    assert repaired.rocksdb_repair and repaired.salvaged > 0
    assert repaired.after is not None and repaired.after.exit_code == 0
    lost = len(repaired.lost)
    assert 0 < lost < N // 2  # one block's worth at most
    assert repaired.pending_found == N - lost
    assert repaired.lost_range() is not None
    # and the repaired broker fires every message that is left
    b = EmbeddedBroker(base, clock=ManualClock(DUE_MS + 1))
    try:
        got = pull_until(b.consumer("w", ["t"]), N - lost, max_messages=500)
        assert len(got) == N - lost
        assert not {m.msg_id for m in got} & set(repaired.lost)
    finally:
        b.close()


# -- backup -------------------------------------------------------------------------------


def test_a_backup_under_load_has_every_send_acknowledged_before_it_started(
    tmp_path: Path,
) -> None:
    # Given a broker taking keyed sends from another thread
    broker = EmbeddedBroker(tmp_path / "live")
    acked: list[str] = []
    stop = threading.Event()

    def sender() -> None:
        i = 0
        while not stop.is_set():
            r = broker.send(Message("t", b"z" * 64, key=f"s{i}", delay_ms=HOUR_MS))
            acked.append(r.msg_id)
            i += 1

    thread = threading.Thread(target=sender)
    thread.start()
    try:
        while len(acked) < 2000:
            stop.wait(0.01)
        # When a backup is taken while sends go on
        before = list(acked)
        info = broker.backup(tmp_path / "copy")
        during = len(acked)
    finally:
        stop.set()
        thread.join()
        broker.close()
    assert during > len(before)  # the load really ran during the backup
    assert info.files > 0 and info.size_bytes > 0
    # Then the copy holds every send acknowledged before the backup started
    restored = EmbeddedBroker(info.path)
    try:
        views = {v.msg_id: v.state for v in restored.pending("t", limit=len(acked) + 1)}
        assert all(views.get(i) is MessageState.PENDING for i in before)
    finally:
        restored.close()
    # and a broker restored from it fires them
    clock = ManualClock(int(time.time() * 1000))
    restored = EmbeddedBroker(info.path, clock=clock)
    try:
        consumer = restored.consumer("g", ["t"])  # subscribed before anything fires
        clock.advance(2 * HOUR_MS)
        fired: set[str] = set()
        deadline = time.monotonic() + 60
        while len(fired) < len(views) and time.monotonic() < deadline:
            got = consumer.pull(max_messages=500, wait_ms=200)
            consumer.ack_batch(got)  # (a consumer holds a bounded number in flight)
            fired.update(m.msg_id for m in got)
        assert fired >= set(before)
    finally:
        restored.close()


def test_backup_refuses_a_destination_that_is_not_empty(base: Path, tmp_path: Path) -> None:
    dest = tmp_path / "full"
    dest.mkdir()
    (dest / "x").write_text("keep me")
    done = chronoq("broker", "backup", "--data-dir", str(base), str(dest))
    assert done.returncode == 2 and "not an empty directory" in done.stderr
    assert (dest / "x").read_text() == "keep me"


def test_cli_backup_of_a_free_directory_and_of_one_a_shared_owner_holds(
    base: Path, tmp_path: Path
) -> None:
    done = chronoq("broker", "backup", "--data-dir", str(base), str(tmp_path / "offline"))
    assert done.returncode == 0, done.stderr
    assert check_directory(tmp_path / "offline").families["wheel"] == N
    done = chronoq("broker", "backup", "--url", f"rocksdb://{base}", str(tmp_path / "by-url"))
    assert done.returncode == 0, done.stderr
    assert check_directory(tmp_path / "by-url").families["wheel"] == N
    # The owner (this process) of a shared directory is asked through DIR/chronoq.sock
    shared = tmp_path / "shared"
    owner = open_broker(f"rocksdb://{shared}")
    try:
        owner.send_batch([Message("t", b"x", key=f"o{i}", delay_ms=HOUR_MS) for i in range(10)])
        done = chronoq("broker", "backup", "--data-dir", str(shared), str(tmp_path / "online"))
    finally:
        owner.close()
    assert done.returncode == 0, done.stderr
    assert "online" in done.stdout
    copy = check_directory(tmp_path / "online")
    assert copy.exit_code == 0
    assert copy.families["wheel"] == 10


def test_server_backs_up_on_the_admin_request_and_on_sigusr1(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "srv",
        token="s3cret",
        extra=("--backup-dir", str(tmp_path / "backups")),
    ).start()
    try:
        with open_broker(server.url) as b:
            b.send_batch([Message("t", b"x", key=f"k{i}", delay_ms=HOUR_MS) for i in range(50)])
        # the admin request, authenticated
        path, size, files, _seconds = server.admin("backup", dest=str(tmp_path / "by-request"))
        assert size > 0 and files > 0
        assert check_directory(path).families["wheel"] == 50
        with pytest.raises(InvalidArgument, match="not an empty directory"):
            server.admin("backup", dest=path)  # never over an existing backup
        # a wrong token is refused before any request
        with pytest.raises(AuthenticationFailed):
            Link("127.0.0.1", server.port, "wrong").call("backup", {"dest": "/tmp/x"}, 10)
        done = chronoq(
            "broker",
            "backup",
            "--url",
            f"chronoq://127.0.0.1:{server.port}?token=no",
            str(tmp_path / "refused"),
        )
        assert done.returncode == 2 and not (tmp_path / "refused").exists()
        # the CLI with the right token
        done = chronoq("broker", "backup", "--url", server.url, str(tmp_path / "by-cli"))
        assert done.returncode == 0, done.stderr
        # SIGUSR1: a timestamped backup under --backup-dir, its path printed
        assert server.proc is not None and server.proc.stdout is not None
        server.proc.send_signal(signal.SIGUSR1)
        ready, _, _ = select.select([server.proc.stdout], [], [], 30)
        line = server.proc.stdout.readline() if ready else ""
        assert line.startswith("chronoq broker backup "), line
        signalled = Path(line.split(" ", 3)[3].strip())
        assert signalled.parent == (tmp_path / "backups").resolve()
        assert signalled.name.startswith("chronoq-backup-")
        assert check_directory(signalled).families["wheel"] == 50
    finally:
        server.stop()
