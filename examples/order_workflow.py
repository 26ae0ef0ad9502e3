"""An order's timers managed while they wait: list them, reschedule them, cancel all at once.

Order 42 is placed: a reminder is due in 15 minutes and the auto-close in 30
(keys ``order:42:remind`` and ``order:42:close``). The customer asks for more
time: both timers move 20 minutes later, one ``reschedule`` call each. The order
is paid: **one** ``app.cancel_all(key_prefix="order:42:")`` cancels both and says
that none had fired. Order 43 is paid after its reminder went out: the same call
cancels its auto-close and reports the reminder as already fired::

    python examples/order_workflow.py      # about 6 s; data in CHRONOQ_BROKER_URL

A minute of the story is :data:`MINUTE`, a tenth of a second here (a real shop
writes ``timedelta(minutes=15)``), so the story runs on the real clock, with a
dispatcher thread running each job when due. The broker is the embedded default
(``CHRONOQ_BROKER_URL``, else ``rocksdb://./chronoq-data``); reruns work, and a
timer an interrupted earlier run left behind is cancelled first.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta

from scheduler import CancelAllResult, Scheduler
from workers import Dispatcher

#: One minute of the story, in real time.
MINUTE = timedelta(seconds=0.1)
#: When the story started (``time.monotonic()``; set again when it begins).
story_start = [time.monotonic()]

app = Scheduler(os.environ.get("CHRONOQ_BROKER_URL") or "rocksdb://./chronoq-data")


def minute() -> str:
    """The story's time: minutes since it started."""
    return f"[+{round((time.monotonic() - story_start[0]) / MINUTE.total_seconds()):02d} min]"


def at_minute(n: int) -> None:
    """Wait until minute ``n`` of the story."""
    time.sleep(max(0.0, story_start[0] + n * MINUTE.total_seconds() - time.monotonic()))


@app.job(name="shop.remind_customer")
def remind_customer(order_id: int) -> None:
    """Remind the customer to pay (in a real shop: only if the order is still unpaid)."""
    print(f"{minute()} order {order_id}: reminder sent to the customer", flush=True)


@app.job(name="shop.close_order")
def close_order(order_id: int) -> None:
    """Close the order if still unpaid."""
    print(f"{minute()} order {order_id}: closed, unpaid", flush=True)


def place(order_id: int) -> None:
    """The order's two timers, keyed ``order:<id>:remind`` and ``order:<id>:close``."""
    remind_customer.schedule(order_id, delay=15 * MINUTE, key=f"order:{order_id}:remind")
    close_order.schedule(order_id, delay=30 * MINUTE, key=f"order:{order_id}:close")
    print(f"{minute()} order {order_id}: placed; reminder in 15 min, auto-close in 30 min")


def more_time(order_id: int, extra: timedelta) -> int:
    """Move both timers of the order ``extra`` later, one reschedule call each (from
    the due times ``app.pending`` lists); returns how many moved."""
    minutes = extra // MINUTE
    print(f"{minute()} order {order_id}: the customer asks for {minutes} more minutes")
    due = {run.key: run.deliver_at for run in app.pending(key_prefix=f"order:{order_id}:")}
    moved = 0
    for job, what in ((remind_customer, "remind"), (close_order, "close")):
        key = f"order:{order_id}:{what}"
        res = job.reschedule(key=key, at=due[key] + extra)
        moved += res.rescheduled
        print(f"    {key}: {res.status.value}, {minutes} min later")
    return moved


def paid(order_id: int) -> CancelAllResult:
    """Cancel every pending timer of the order, whatever its job, in one call."""
    result = app.cancel_all(key_prefix=f"order:{order_id}:")
    fired = ", ".join(result.already_delivered) or "none"
    print(
        f"{minute()} order {order_id}: paid; cancel_all aborted={result.aborted}, "
        f"already fired: {fired}"
    )
    return result


def main() -> int:
    """Play the story with a dispatcher running alongside; print a summary
    (``UNEXPECTED`` when an answer was not the expected one)."""
    for order_id in (42, 43):  # timers an interrupted earlier run left behind
        app.cancel_all(key_prefix=f"order:{order_id}:")
    dispatcher = Dispatcher(app)
    stop = threading.Event()
    worker = threading.Thread(target=dispatcher.run_forever, kwargs={"stop_event": stop})
    worker.start()
    story_start[0] = time.monotonic()
    try:
        place(42)
        at_minute(5)
        place(43)
        at_minute(10)
        moved = more_time(42, 20 * MINUTE)  # reminder now at +35, auto-close at +50
        at_minute(25)  # order 43's reminder went out at +20
        first, second = paid(42), paid(43)
        at_minute(55)  # past every old and new due time: nothing else runs
        left = len(list(app.pending(key_prefix="order:4")))
    finally:
        stop.set()
        worker.join()
        app.close()
    ok = (moved, first.aborted, first.already_delivered) == (2, 2, ()) and (
        second.aborted,
        second.already_delivered,
        left,
    ) == (1, ("order:43:remind",), 0)
    print(
        f"summary: order 42 moved {moved}, cancelled {first.aborted}, "
        f"{first.already_delivered_count} fired; order 43 cancelled {second.aborted}, "
        f"{second.already_delivered_count} fired; {left} left pending"
        + ("" if ok else " (UNEXPECTED)")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
