"""The orders app's config: registers the chronoq jobs and sets SQLite to WAL mode."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def _sqlite_wal(sender: Any, connection: Any, **kwargs: Any) -> None:
    """WAL mode: readers in one process never wait for a writer in another."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")


class OrdersConfig(AppConfig):
    """Importing :mod:`orders.jobs` here registers the jobs with the chronoq app once
    Django is set up, in every process (web workers, ``chronoq_run``, ``migrate``).
    The broker itself opens on first use, so ``migrate`` never touches it."""

    name = "orders"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        connection_created.connect(_sqlite_wal, dispatch_uid="orders.sqlite_wal")
        from orders import jobs  # noqa: F401 - registers the jobs
