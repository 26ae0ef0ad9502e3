"""``python manage.py chronoq_run``: the dispatcher of the project's chronoq app.

What ``chronoq run orders.jobs:app`` does (a dispatcher and the cron planner until
SIGINT/SIGTERM, then a drain), with Django set up first so jobs can use the ORM.
The app is ``settings.CHRONOQ_APP`` (``module:attribute``) unless ``--app`` names one.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.apps import AppNotFound, load_app
from workers.runner import run_app


class Command(BaseCommand):
    """Run the chronoq dispatcher for this project's jobs."""

    help = "Run the chronoq dispatcher (jobs and cron jobs) of settings.CHRONOQ_APP."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--app", default=None, help="module:attribute of the Scheduler")
        parser.add_argument(
            "--drain-timeout",
            type=float,
            default=30.0,
            help="seconds running jobs get to finish on SIGTERM (default 30)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            app = load_app(options["app"] or settings.CHRONOQ_APP)
        except AppNotFound as e:
            raise CommandError(str(e)) from e
        try:
            run_app(app, drain_timeout_s=options["drain_timeout"])
        finally:
            app.close()
