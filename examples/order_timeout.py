"""The order auto-close workflow: schedule a timeout on creation, cancel it on payment.

A small shop opens, takes ten orders and schedules for each an auto-close job a
few seconds later, keyed ``order:<id>``. Customers pay four orders in time (the
payment cancels the auto-close: ``ABORTED``) and one too late (the auto-close had
already fired: ``ALREADY_DELIVERED``, so the payment is refused). The unpaid
orders are closed by their jobs; a report job prints the outcome and stops the
worker, so the run ends by itself in about six seconds::

    chronoq run examples.order_timeout:app      # what scripts/demo.sh runs
    python examples/order_timeout.py            # the same, as a script

How it drives itself under ``chronoq run``: the :func:`workers.on_start` hook
``open_shop`` runs once the dispatcher is up; it creates the orders and schedules
the payments and the report as jobs too, so everything happens on the broker's
clock. Order ids are unique per run and the broker keeps its data in
``CHRONOQ_BROKER_URL`` (default ``rocksdb://./chronoq-data``), so reruns work; an
auto-close left over from an interrupted earlier run finds no such order here
and does nothing, which is the idempotent job body the pattern asks for.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from broker_adapter import AbortStatus
from scheduler.scheduler import Scheduler
from workers import current_job, on_start, stop_app

app = Scheduler(os.environ.get("CHRONOQ_BROKER_URL") or "rocksdb://./chronoq-data")

#: Ten orders per run, with ids unique across runs (a run's first id is time based).
FIRST_ID = int(time.time()) % 1_000_000 * 100
ORDERS = [FIRST_ID + n for n in range(1, 11)]
PAID_IN_TIME = {ORDERS[1], ORDERS[4], ORDERS[6], ORDERS[8]}
PAID_LATE = ORDERS[9]

_lock = threading.Lock()
_state: dict[int, str] = {}  # order id -> "unpaid" | "paid" | "closed"
_refused: list[int] = []


def _key(order_id: int) -> str:
    return f"order:{order_id}"


@app.job(name="shop.close_order", max_attempts=5)
def close_order(order_id: int) -> None:
    """Close the order if it is still unpaid (idempotent: decided from its state)."""
    job = current_job()
    with _lock:
        state = _state.get(order_id)
        if state != "unpaid":
            print(f"order {order_id}: auto-close found it {state or 'unknown here'}; nothing to do")
            return
        _state[order_id] = "closed"
    late = time.time() * 1000 - job.message.deliver_at_ms
    print(f"order {order_id}: closed, unpaid ({late:.1f} ms after its timeout, msg {job.msg_id})")


@app.job(name="shop.pay")
def pay(order_id: int) -> None:
    """A payment arrives: cancel the auto-close, or refuse if the order was closed."""
    status = close_order.cancel(key=_key(order_id))
    with _lock:
        if status is AbortStatus.ABORTED and _state.get(order_id) == "unpaid":
            _state[order_id] = "paid"
            print(f"order {order_id}: paid; auto-close {status.value}")
            return
        _refused.append(order_id)
    print(
        f"order {order_id}: payment refused, order {_state.get(order_id)} "
        f"(auto-close {status.value})"
    )


@app.job(name="shop.report")
def report() -> None:
    """Print which orders were closed and which were paid, then stop the worker."""
    with _lock:
        closed = sorted(o for o in ORDERS if _state.get(o) == "closed")
        paid = sorted(o for o in ORDERS if _state.get(o) == "paid")
        unsettled = sorted(o for o in ORDERS if _state.get(o) == "unpaid")
    print(f"closed (unpaid): {closed}")
    print(f"paid:            {paid}")
    print(f"payment refused: {_refused}")
    ok = len(closed) == 6 and len(paid) == 4 and not unsettled
    print(
        f"summary: {len(closed)} closed, {len(paid)} paid, {len(_refused)} refused"
        f"{'' if ok else ' (UNEXPECTED)'}"
    )
    stop_app(app)


@on_start(app)
def open_shop() -> None:
    """Create the orders, schedule their auto-close, the payments and the report."""
    for n, order_id in enumerate(ORDERS):
        with _lock:
            _state[order_id] = "unpaid"
        res = close_order.schedule(order_id, delay=2.0 + 0.2 * n, key=_key(order_id))
        print(
            f"order {order_id}: created; auto-close due in {2.0 + 0.2 * n:.1f} s (msg {res.msg_id})"
        )
    for n, order_id in enumerate(sorted(PAID_IN_TIME)):
        pay.schedule(order_id, delay=0.5 + 0.3 * n)
    pay.schedule(PAID_LATE, delay=4.5)  # after its auto-close (due at 3.8 s)
    report.schedule(delay=5.5)


def main() -> int:
    """Run the simulation in this process (what ``chronoq run`` does, plus logging)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s")
    try:
        app.run()
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
