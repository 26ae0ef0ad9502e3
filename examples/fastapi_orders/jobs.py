"""The chronoq side of the order service: the app, the auto-close job and its timing.

The web workers import this module to schedule and cancel; the dispatcher runs it::

    chronoq run examples.fastapi_orders.jobs:app

Nothing here imports FastAPI, so the dispatcher does not need it. The broker is
``CHRONOQ_BROKER_URL`` (default ``rocksdb://./chronoq-data``), opened on first
use: every process may open the same ``rocksdb://`` directory (the first owns it,
the others are its clients).
"""

from __future__ import annotations

import logging
import os

from examples.fastapi_orders import store
from scheduler import Scheduler
from workers import current_job

log = logging.getLogger("examples.fastapi_orders")

app = Scheduler()

#: The auto-close delay when ``ORDERS_CLOSE_AFTER_S`` is not set: 30 minutes.
DEFAULT_CLOSE_AFTER_S = 30 * 60.0


def close_after_s() -> float:
    """Seconds from an order's creation to its auto-close (``ORDERS_CLOSE_AFTER_S``)."""
    return float(os.environ.get("ORDERS_CLOSE_AFTER_S") or DEFAULT_CLOSE_AFTER_S)


def order_key(order_id: int) -> str:
    """The business key of an order's auto-close job."""
    return f"order:{order_id}"


@app.job(name="orders.close_order", max_attempts=5)
def close_order(order_id: int) -> str:
    """Close the order if it is still unpaid; do nothing otherwise (idempotent).

    A payment that arrives after this job fired gets ``ALREADY_DELIVERED`` from its
    cancel and is refused, so a closed order is never paid. A plain ``def`` job:
    SQLite calls block, so it runs on the dispatcher's thread pool.
    """
    job = current_job()
    outcome = store.close_if_open(order_id, job.msg_id, job.attempt)
    log.info(
        "order %s: auto-close %s (msg %s, attempt %d)", order_id, outcome, job.msg_id, job.attempt
    )
    return outcome


def broker_role() -> str:
    """This process's role for a shared ``rocksdb://`` directory (``owner`` or
    ``client``), opening the app's broker if needed; ``"-"`` for other brokers."""
    role = getattr(app.broker, "role", None)
    return str(role.value) if role is not None else "-"
