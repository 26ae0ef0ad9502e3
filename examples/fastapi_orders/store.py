"""The orders, in SQLite: one file that the web workers and the dispatcher share.

SQLite in WAL mode lets several processes read while one writes, and each write
here is one short transaction (``BEGIN IMMEDIATE``), so the web workers and the
dispatcher never see half an update. Tables:

* ``orders``: ``id``, ``item``, ``status`` (``open``, ``paid`` or ``closed``),
  ``created_ms``, ``created_by`` (the web worker's pid), ``close_msg_id`` and
  ``close_due_ms`` (the auto-close job), ``settled_ms`` (paid or closed).
* ``close_runs``: one row per run of the auto-close job: ``order_id``,
  ``msg_id``, ``attempt``, ``outcome`` (``closed``, or the status that made it do
  nothing: ``paid``, ``closed``, ``unknown``), ``at_ms``, ``pid``. So "closed
  once" can be checked: an order has at most one ``closed`` run.

Each call opens its own connection (cheap for SQLite): callers may be any thread.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: How long a writer waits for another process's transaction, seconds.
BUSY_TIMEOUT_S = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    item TEXT NOT NULL,
    status TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    created_by INTEGER NOT NULL,
    close_msg_id TEXT,
    close_due_ms INTEGER,
    settled_ms INTEGER
);
CREATE TABLE IF NOT EXISTS close_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id INTEGER NOT NULL,
    msg_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    pid INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Order:
    """One order as stored."""

    id: int
    item: str
    status: str
    created_ms: int
    created_by: int
    close_msg_id: str | None
    close_due_ms: int | None
    settled_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        """The order as JSON-ready data."""
        return asdict(self)


def db_path() -> Path:
    """The database file: ``$ORDERS_DATA_DIR/orders.sqlite3`` (default ``./orders-data``)."""
    return Path(os.environ.get("ORDERS_DATA_DIR") or "./orders-data") / "orders.sqlite3"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextmanager
def _connect() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db_path(), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.row_factory = sqlite3.Row
        yield conn
    finally:
        conn.close()


@contextmanager
def _write() -> Iterator[sqlite3.Connection]:
    """A write transaction, taken up front (``BEGIN IMMEDIATE``): no lock upgrades."""
    with _connect() as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def init() -> None:
    """Create the data directory and the tables if they are missing (any process may)."""
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            with _connect() as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(SCHEMA)
            return
        except sqlite3.OperationalError as exc:
            # Two workers starting at once: SQLite answers "locked" at once, skipping
            # its busy wait, to the one whose lock upgrade would deadlock. Try again.
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _order(row: sqlite3.Row | None) -> Order | None:
    return None if row is None else Order(**dict(row))


def create(item: str) -> Order:
    """Store a new open order (created by this process) and return it."""
    with _write() as conn:
        cur = conn.execute(
            "INSERT INTO orders (item, status, created_ms, created_by) VALUES (?, 'open', ?, ?)",
            (item, _now_ms(), os.getpid()),
        )
        row = conn.execute("SELECT * FROM orders WHERE id = ?", (cur.lastrowid,)).fetchone()
    order = _order(row)
    assert order is not None
    return order


def delete(order_id: int) -> None:
    """Remove an order (one whose auto-close could not be scheduled)."""
    with _write() as conn:
        conn.execute("DELETE FROM orders WHERE id = ?", (order_id,))


def set_close_job(order_id: int, msg_id: str, due_ms: int) -> None:
    """Remember which message closes the order, and when."""
    with _write() as conn:
        conn.execute(
            "UPDATE orders SET close_msg_id = ?, close_due_ms = ? WHERE id = ?",
            (msg_id, due_ms, order_id),
        )


def get(order_id: int) -> Order | None:
    """The order, or ``None``."""
    with _connect() as conn:
        return _order(conn.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone())


def mark_paid(order_id: int) -> bool:
    """Mark an open order paid; ``False`` when it is not open (paid or closed already)."""
    with _write() as conn:
        cur = conn.execute(
            "UPDATE orders SET status = 'paid', settled_ms = ? WHERE id = ? AND status = 'open'",
            (_now_ms(), order_id),
        )
        return cur.rowcount == 1


def close_if_open(order_id: int, msg_id: str, attempt: int) -> str:
    """Close the order if it is still open, and record the run either way.

    Idempotent: a second run (a redelivery) finds the order closed and changes
    nothing but its own ``close_runs`` row.

    :returns: ``"closed"``, or why nothing was done: ``"paid"``, ``"closed"``, ``"unknown"``.
    """
    now = _now_ms()
    with _write() as conn:
        row = conn.execute("SELECT status FROM orders WHERE id = ?", (order_id,)).fetchone()
        if row is not None and row["status"] == "open":
            conn.execute(
                "UPDATE orders SET status = 'closed', settled_ms = ? WHERE id = ?",
                (now, order_id),
            )
            outcome = "closed"
        else:
            outcome = "unknown" if row is None else str(row["status"])
        conn.execute(
            "INSERT INTO close_runs (order_id, msg_id, attempt, outcome, at_ms, pid)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (order_id, msg_id, attempt, outcome, now, os.getpid()),
        )
    return outcome
