"""The order auto-close workflow with the close running on a Celery worker.

The shop of ``examples/order_timeout.py``: ten orders, each with an auto-close
due a few seconds later (key ``order:<id>``); four are paid in time (the payment
cancels the auto-close: ``ABORTED``), one too late (``ALREADY_DELIVERED``:
refused). Here ``close_order`` is an ``executor="celery"`` job: chronoq holds
its timer and publishes it to Celery only when due (``task_id`` = message id),
and a paid order gets a receipt from a plain Celery task scheduled with
``schedule_task`` instead of ``apply_async(countdown=...)``. Order states live in
Redis, changed by compare-and-set scripts, because the close runs in another
process: "close only if still unpaid" is the idempotent body the pattern asks for.

Three terminals (Redis at ``$CHRONOQ_CELERY_BROKER_URL``, default
``redis://127.0.0.1:6379/0``)::

    redis-server --port 6379 --save '' --appendonly no
    celery -A examples.celery_orders worker --pool=threads -c 2 --loglevel=INFO
    chronoq run examples.celery_orders:scheduler

or one command that starts its own Celery worker subprocess::

    python examples/celery_orders.py

The report job waits until every close is ``DONE`` in chronoq (the outcome came
back from the Celery result backend), prints the summary and stops the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

if __package__ in (None, ""):  # run as a script: make ``examples`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_adapter import AbortStatus, MessageState
from scheduler.scheduler import Scheduler
from workers import on_start, stop_app
from workers.celery import CELERY_URL_ENV, DEFAULT_CELERY_URL, celery_app_for, schedule_task

REDIS_URL = os.environ.get(CELERY_URL_ENV) or DEFAULT_CELERY_URL
scheduler = Scheduler(os.environ.get("CHRONOQ_BROKER_URL") or "rocksdb://./chronoq-data")
#: The Celery app: ``celery -A examples.celery_orders worker`` finds it as ``app``.
app = celery_app_for(scheduler, REDIS_URL, worker_hijack_root_logger=False)

FIRST_ID = int(time.time()) % 1_000_000 * 100
ORDERS = [FIRST_ID + n for n in range(1, 11)]
PAID_IN_TIME = {ORDERS[1], ORDERS[4], ORDERS[6], ORDERS[8]}
PAID_LATE = ORDERS[9]
STATES = "shop:orders"  # hash: order id -> unpaid | paid | closed
RECEIPTS = "shop:receipts"  # hash: order id -> Celery task id of its receipt
#: Compare-and-set: ARGV[2] -> ARGV[3] only if the order is still ARGV[2].
CAS = "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then "
CAS += "redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1 end return 0"

_db: redis.Redis | None = None
_closes: dict[int, str] = {}  # order id -> msg id of its auto-close
_refused: list[int] = []
_reports = [0]


def db() -> redis.Redis:
    """The shop's database (the Redis that Celery uses too)."""
    global _db
    if _db is None:
        _db = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    return _db


def _key(order_id: int) -> str:
    return f"order:{order_id}"


@scheduler.job(name="shop.celery.close_order", executor="celery", max_attempts=5)
def close_order(order_id: int) -> str:
    """On the Celery worker: close the order if it is still unpaid."""
    if db().eval(CAS, 1, STATES, str(order_id), "unpaid", "closed"):
        print(f"order {order_id}: closed on the Celery worker (pid {os.getpid()})", flush=True)
        return "closed"
    return f"left {db().hget(STATES, str(order_id)) or 'unknown'}"


@app.task(name="shop.send_receipt")  # type: ignore[untyped-decorator]
def send_receipt(order_id: int) -> None:
    """A plain Celery task of the shop, scheduled through chronoq."""
    from celery import current_task

    db().hset(RECEIPTS, str(order_id), str(current_task.request.id))


@scheduler.job(name="shop.celery.pay")
def pay(order_id: int) -> None:
    """A payment arrives: cancel the auto-close, or refuse if it already fired."""
    status = close_order.cancel(key=_key(order_id))
    if status is AbortStatus.ABORTED and db().eval(CAS, 1, STATES, str(order_id), "unpaid", "paid"):
        receipt = schedule_task(send_receipt, (order_id,), countdown=0.5, key=f"receipt:{order_id}")
        print(f"order {order_id}: paid; auto-close {status.value}; receipt msg {receipt.msg_id}")
        return
    _refused.append(order_id)
    state = db().hget(STATES, str(order_id))
    print(f"order {order_id}: payment refused, order {state} (auto-close {status.value})")


@scheduler.job(name="shop.celery.report")
def report() -> None:
    """Once every close and receipt is through Celery, print the outcome and stop."""
    states = {o: db().hget(STATES, str(o)) for o in ORDERS}
    closed = sorted(o for o, s in states.items() if s == "closed")
    paid = sorted(o for o, s in states.items() if s == "paid")
    receipts = db().hgetall(RECEIPTS)
    views = {o: close_order.get(m) for o, m in _closes.items() if o in closed}
    pending = [o for o, v in views.items() if v is None or v.state is not MessageState.DONE]
    missing = [o for o in paid if str(o) not in receipts]
    _reports[0] += 1
    if (pending or missing) and _reports[0] < 40:
        report.schedule(delay=0.5)  # outcomes still on their way back from Celery
        return
    print(f"closed (unpaid): {closed}")
    print(f"paid:            {paid} (receipts sent by Celery for {len(paid) - len(missing)})")
    print(f"payment refused: {_refused}")
    ok = len(closed) == 6 and len(paid) == 4 and not pending and not missing
    print(
        f"summary: {len(closed)} closed on Celery, {len(paid)} paid, {len(_refused)} refused, "
        f"{len(paid) - len(missing)} receipts{'' if ok else ' (UNEXPECTED)'}"
    )
    stop_app(scheduler)


@on_start(scheduler)
def open_shop() -> None:
    """Create the orders, schedule their auto-close, the payments and the report."""
    for n, order_id in enumerate(ORDERS):
        db().hset(STATES, str(order_id), "unpaid")
        res = close_order.schedule(order_id, delay=2.0 + 0.2 * n, key=_key(order_id))
        _closes[order_id] = res.msg_id
        print(
            f"order {order_id}: created; auto-close due in {2.0 + 0.2 * n:.1f} s (msg {res.msg_id})"
        )
    for n, order_id in enumerate(sorted(PAID_IN_TIME)):
        pay.schedule(order_id, delay=0.5 + 0.3 * n)
    pay.schedule(PAID_LATE, delay=4.5)  # after its auto-close (due at 3.8 s)
    report.schedule(delay=5.5)


def _start_worker() -> subprocess.Popen[str]:
    """``celery -A examples.celery_orders worker`` as a subprocess; its lines echo here."""
    root = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("celery")), "-A", "examples.celery_orders", "worker",
         "--pool=threads", "-c", "2", "--loglevel=INFO", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    ready = threading.Event()

    def echo() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "order" in line or "ERROR" in line:
                print(f"[celery] {line.rstrip()}", flush=True)
            if " ready." in line:
                ready.set()

    threading.Thread(target=echo, daemon=True).start()
    if not ready.wait(60):
        proc.kill()
        raise SystemExit(f"the Celery worker did not start; is Redis up at {REDIS_URL}?")
    return proc


def main() -> int:
    """Start a Celery worker, run the shop on chronoq, stop the worker."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s")
    worker = _start_worker()
    try:
        scheduler.run()
    finally:
        scheduler.close()
        worker.terminate()
        worker.wait(30)
        if worker.stdout is not None:
            worker.stdout.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
