"""CronGate: cron specs by name, and ``CronSpec.max_running`` as a dispatch hook.

A cron message admitted while ``max_running`` runs of its cron job still go on
is refused (the dispatcher then skips that fire with a log line). A run counts
from its admission until it starts no more jobs, i.e. until its last body
returned, even when a timeout settled its message earlier: a stuck body still runs.
"""

from __future__ import annotations

import threading

from scheduler.registry import JobRegistry
from scheduler.spec import CronSpec
from workers.hooks import DispatchHook
from workers.runs import Run


class CronGate(DispatchHook):
    """Cron specs by name (from the registry) and how many runs of each schedule
    are going (a stored schedule counts under its own name); thread-safe.

    :param registry: the app's job registry.
    """

    def __init__(self, registry: JobRegistry) -> None:
        self._registry = registry
        self._running: dict[str, int] = {}
        self._admitted: set[Run] = set()
        self._lock = threading.Lock()

    def find(self, name: str) -> CronSpec | None:
        """The cron job named ``name``, or ``None`` (a stored schedule's name, usually:
        a dict lookup, no rebuild per miss)."""
        return self._registry.find_cron(name)

    def running(self, name: str) -> int:
        """How many runs of cron job ``name`` go on."""
        return self._running.get(name, 0)

    def admit(self, run: Run) -> str:
        """Count one more run of ``run``'s cron job and return ``""``, or return why
        not; a run that is not a cron run passes."""
        cron = run.cron
        if cron is None:
            return ""
        with self._lock:
            running = self._running.get(cron.name, 0)
            if running >= cron.max_running:
                return f"{running} run(s) still going (max_running={cron.max_running})"
            self._running[cron.name] = running + 1
            self._admitted.add(run)
            return ""

    def after_run(self, run: Run) -> None:
        """One run ended: it no longer counts (if it was admitted here)."""
        cron = run.cron
        if cron is None:
            return
        with self._lock:
            if run in self._admitted:
                self._admitted.discard(run)
                self._running[cron.name] -= 1


__all__ = ["CronGate"]
