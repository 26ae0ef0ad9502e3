"""The three order endpoints (and a health check), as plain sync Django views.

Sync views call chronoq's sync API (``close_order.schedule``, ``cancel``,
``get``): they run on the server's threads, not on an event loop. Answers are
the FastAPI example's: ``served_by`` names the process (pid, broker role).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from broker_adapter import AbortStatus
from orders.jobs import broker_role, close_order, now_ms, order_key
from orders.models import Order


def _served_by() -> dict[str, Any]:
    return {"pid": os.getpid(), "role": broker_role()}


def _order(order_id: int) -> Order:
    try:
        return Order.objects.get(pk=order_id)
    except Order.DoesNotExist as e:
        raise Http404(f"no order {order_id}") from e


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """Liveness: this process's pid and broker role (opens the broker)."""
    return JsonResponse({"ok": True, "served_by": _served_by()})


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    """``POST /orders``: store an open order and schedule its auto-close."""
    body = json.loads(request.body or b"{}")
    order = Order.objects.create(
        item=str(body.get("item", "book")), created_ms=now_ms(), created_by=os.getpid()
    )
    try:
        receipt = close_order.schedule(
            order.pk, delay=settings.ORDERS_CLOSE_AFTER_S, key=order_key(order.pk)
        )
    except Exception:
        order.delete()  # no auto-close, no order
        raise
    Order.objects.filter(pk=order.pk).update(
        close_msg_id=receipt.msg_id, close_due_ms=receipt.deliver_at_ms
    )
    order.refresh_from_db()
    return JsonResponse({"order": order.as_dict(), "served_by": _served_by()}, status=201)


@require_POST
def pay_order(request: HttpRequest, order_id: int) -> JsonResponse:
    """``POST /orders/<id>/pay``: cancel the auto-close; 200 when in time
    (``ABORTED``), 409 when too late (``ALREADY_DELIVERED``) or paid already."""
    _order(order_id)
    status = close_order.cancel(key=order_key(order_id))
    paid = (
        status is not AbortStatus.ALREADY_DELIVERED
        and Order.objects.filter(pk=order_id, status="open").update(
            status="paid", settled_ms=now_ms()
        )
        == 1
    )
    answer = {
        "order": _order(order_id).as_dict(),
        "paid": paid,
        "auto_close": status.value,
        "served_by": _served_by(),
    }
    return JsonResponse(answer, status=200 if paid else 409)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> JsonResponse:
    """``GET /orders/<id>``: the order and its auto-close job as the broker sees it."""
    order = _order(order_id)
    job: dict[str, Any] | None = None
    view = close_order.get(order.close_msg_id) if order.close_msg_id else None
    if view is not None:
        job = {
            "msg_id": view.msg_id,
            "key": view.key,
            "state": view.state.value,
            "deliver_at_ms": view.deliver_at_ms,
            "deliver_at": datetime.fromtimestamp(view.deliver_at_ms / 1000, UTC).isoformat(),
            "attempts": view.attempts,
        }
    return JsonResponse({"order": order.as_dict(), "auto_close": job, "served_by": _served_by()})
