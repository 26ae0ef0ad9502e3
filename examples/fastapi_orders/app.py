"""The order service's HTTP side: FastAPI, with chronoq's awaitable client calls.

::

    uvicorn examples.fastapi_orders.app:app --workers 2 --port 8000

* ``POST /orders`` (``{"item": "book"}``): 201, the new open order; its auto-close
  is scheduled with ``await close_order.schedule_async(..., key="order:<id>")``.
* ``POST /orders/{id}/pay``: cancels the auto-close (``await close_order.cancel_async``).
  ``ABORTED``: paid in time, 200. ``ALREADY_DELIVERED``: too late, the order is
  (being) closed, the payment is refused, 409. A second payment is refused too.
* ``GET /orders/{id}``: the order and its auto-close job as the broker sees it
  (state, due time, attempts).
* ``GET /health``: this worker's pid and broker role.

Every answer names the worker that served it (``served_by``: pid and role), so
one can see several workers share one ``rocksdb://`` directory. The lifespan
opens the broker at start (an error shows at once, not on the first order) and
closes it with ``await app.aclose()`` at shutdown; the owner's exit hands the
directory over to another process. SQLite calls go to a thread
(``asyncio.to_thread``): the event loop never waits for a disk.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from pydantic import BaseModel

from broker_adapter import AbortStatus
from examples.fastapi_orders import jobs, store


class NewOrder(BaseModel):
    """The body of ``POST /orders``."""

    item: str = "book"


def served_by() -> dict[str, Any]:
    """Which worker answers: its pid and its role for the broker's directory."""
    return {"pid": os.getpid(), "role": jobs.broker_role()}


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    """Open the order store and the broker at start; close chronoq at shutdown."""
    await asyncio.to_thread(store.init)
    role = await asyncio.to_thread(jobs.broker_role)  # opens the broker: owner or client
    print(f"worker {os.getpid()} ready: broker {jobs.app.settings.broker_url} ({role})", flush=True)
    try:
        yield
    finally:
        await jobs.app.aclose()


app = FastAPI(title="chronoq orders", lifespan=lifespan)


async def _order_or_404(order_id: int) -> store.Order:
    order = await asyncio.to_thread(store.get, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    return order


@app.get("/health")
async def health() -> dict[str, Any]:
    """Liveness: this worker's pid and broker role."""
    return {"ok": True, "served_by": served_by()}


@app.post("/orders", status_code=201)
async def create_order(body: NewOrder) -> dict[str, Any]:
    """Store an open order and schedule its auto-close."""
    order = await asyncio.to_thread(store.create, body.item)
    try:
        receipt = await jobs.close_order.schedule_async(
            order.id, delay=jobs.close_after_s(), key=jobs.order_key(order.id)
        )
    except Exception:
        await asyncio.to_thread(store.delete, order.id)  # no auto-close, no order
        raise
    await asyncio.to_thread(store.set_close_job, order.id, receipt.msg_id, receipt.deliver_at_ms)
    order = await _order_or_404(order.id)
    return {"order": order.as_dict(), "served_by": served_by()}


@app.post("/orders/{order_id}/pay")
async def pay_order(order_id: int, response: Response) -> dict[str, Any]:
    """Cancel the auto-close; accept the payment only if that came in time."""
    await _order_or_404(order_id)
    status = await jobs.close_order.cancel_async(key=jobs.order_key(order_id))
    # ABORTED: the job will never run. NOT_FOUND: no job to race with (never stored,
    # or forgotten long after it fired; then the order is no longer open anyway).
    paid = status is not AbortStatus.ALREADY_DELIVERED and await asyncio.to_thread(
        store.mark_paid, order_id
    )
    if not paid:
        response.status_code = 409  # too late (closed or closing), or paid already
    order = await _order_or_404(order_id)
    return {
        "order": order.as_dict(),
        "paid": paid,
        "auto_close": status.value,
        "served_by": served_by(),
    }


@app.get("/orders/{order_id}")
async def show_order(order_id: int) -> dict[str, Any]:
    """The order and its auto-close job (``None`` before it is stored)."""
    order = await _order_or_404(order_id)
    job: dict[str, Any] | None = None
    if order.close_msg_id is not None:
        view = await jobs.close_order.get_async(order.close_msg_id)
        if view is not None:
            job = {
                "msg_id": view.msg_id,
                "key": view.key,
                "state": view.state.value,
                "deliver_at_ms": view.deliver_at_ms,
                "deliver_at": datetime.fromtimestamp(view.deliver_at_ms / 1000, UTC).isoformat(),
                "attempts": view.attempts,
            }
    return {"order": order.as_dict(), "auto_close": job, "served_by": served_by()}
