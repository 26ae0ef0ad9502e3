"""The chronoq app of the Django project and its auto-close job.

Imported by :class:`orders.apps.OrdersConfig` once Django is set up, so every
process that loads the project registers the jobs. ``python manage.py
chronoq_run`` runs them (``settings.CHRONOQ_APP``).
"""

from __future__ import annotations

import logging
import os
import time

from django.conf import settings
from django.db import transaction

from orders.models import CloseRun, Order
from scheduler import Scheduler
from workers import current_job

log = logging.getLogger("orders.jobs")

app = Scheduler(settings.CHRONOQ_BROKER_URL)


def order_key(order_id: int) -> str:
    """The business key of an order's auto-close job."""
    return f"order:{order_id}"


def now_ms() -> int:
    """Wall-clock time, epoch ms."""
    return time.time_ns() // 1_000_000


@app.job(name="orders.close_order", max_attempts=5)
def close_order(order_id: int) -> str:
    """Close the order if it is still unpaid; do nothing otherwise (idempotent).

    The conditional UPDATE comes first in the transaction: SQLite then takes the
    write lock at once (waiting for other processes' writes) instead of upgrading a
    read. A payment after this fired gets ``ALREADY_DELIVERED`` and is refused.
    """
    job = current_job()
    now = now_ms()
    with transaction.atomic():
        closed = Order.objects.filter(pk=order_id, status="open").update(
            status="closed", settled_ms=now
        )
        if closed:
            outcome = "closed"
        else:
            status = Order.objects.filter(pk=order_id).values_list("status", flat=True).first()
            outcome = status or "unknown"
        CloseRun.objects.create(
            order_id=order_id,
            msg_id=job.msg_id,
            attempt=job.attempt,
            outcome=outcome,
            at_ms=now,
            pid=os.getpid(),
        )
    log.info(
        "order %s: auto-close %s (msg %s, attempt %d)", order_id, outcome, job.msg_id, job.attempt
    )
    return outcome


def broker_role() -> str:
    """This process's role for a shared ``rocksdb://`` directory (``owner`` or
    ``client``), opening the app's broker if needed; ``"-"`` for other brokers."""
    role = getattr(app.broker, "role", None)
    return str(role.value) if role is not None else "-"
