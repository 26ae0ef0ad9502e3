"""``dir_lock.held_here``: this process's RocksDB LOCK, read from /proc/locks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker_adapter.embedded import EmbeddedBroker, dir_lock


def test_held_while_the_broker_is_open_and_released_by_close(tmp_path: Path) -> None:
    broker = EmbeddedBroker(str(tmp_path / "data"))
    lock = tmp_path / "data" / "LOCK"
    assert dir_lock.held_here(lock)
    broker.close()
    assert not dir_lock.held_here(lock)
    EmbeddedBroker(str(tmp_path / "data")).close()  # and this process can open it again


def test_a_missing_lock_file_is_not_held(tmp_path: Path) -> None:
    assert not dir_lock.held_here(tmp_path / "LOCK")


def test_lines_of_waiters_and_of_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "LOCK"
    lock.write_bytes(b"")
    inode, pid = os.stat(lock).st_ino, os.getpid()
    table = tmp_path / "locks"
    monkeypatch.setattr(dir_lock, "PROC_LOCKS", table)
    table.write_text(
        f"1: POSIX  ADVISORY  WRITE {pid + 1} fe:00:{inode} 0 EOF\n"  # another process
        f"2: POSIX  ADVISORY  WRITE {pid} fe:00:{inode}9 0 EOF\n"  # another inode
    )
    assert not dir_lock.held_here(lock)
    table.write_text(f"1: -> POSIX  ADVISORY  WRITE {pid} fe:00:{inode} 0 EOF\n")
    assert dir_lock.held_here(lock)  # a wait of ours counts too: the safe side
    monkeypatch.setattr(dir_lock, "PROC_LOCKS", tmp_path / "absent")
    assert dir_lock.held_here(lock)  # cannot tell: the caller collects, as before
