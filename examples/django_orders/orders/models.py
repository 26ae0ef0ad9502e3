"""Orders and the record of each auto-close run (table names shared with the
FastAPI example, so one check reads both)."""

from __future__ import annotations

from typing import Any

from django.db import models


class Order(models.Model):
    """An order: ``open`` until paid (``paid``) or auto-closed (``closed``)."""

    item = models.CharField(max_length=200)
    status = models.CharField(max_length=10, default="open")
    created_ms = models.BigIntegerField()
    created_by = models.IntegerField(help_text="pid of the web process that created it")
    close_msg_id = models.CharField(max_length=64, null=True)
    close_due_ms = models.BigIntegerField(null=True)
    settled_ms = models.BigIntegerField(null=True)

    class Meta:
        db_table = "orders"

    def as_dict(self) -> dict[str, Any]:
        """The order as JSON-ready data."""
        return {
            "id": self.pk,
            "item": self.item,
            "status": self.status,
            "created_ms": self.created_ms,
            "created_by": self.created_by,
            "close_msg_id": self.close_msg_id,
            "close_due_ms": self.close_due_ms,
            "settled_ms": self.settled_ms,
        }


class CloseRun(models.Model):
    """One run of the auto-close job: ``closed``, or the status that made it do nothing."""

    order_id = models.BigIntegerField()
    msg_id = models.CharField(max_length=64)
    attempt = models.IntegerField()
    outcome = models.CharField(max_length=10)
    at_ms = models.BigIntegerField()
    pid = models.IntegerField()

    class Meta:
        db_table = "close_runs"
