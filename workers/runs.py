"""The shapes the dispatcher works with: the app it serves (:class:`App`, i.e. a
:class:`scheduler.Scheduler`), its cron planner, and one message's :class:`Run`."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Protocol

from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import Clock
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.registry import JobRegistry
from scheduler.settings import Settings
from scheduler.spec import CronSpec, JobSpec
from workers.context import JobContext


class CronPlanner(Protocol):
    """What the dispatcher and runner need of ``app.planner``."""

    def on_fired(self, name: str, fire_ms: int, now_ms: int) -> list[int]:
        """Arm the next occurrence; the occurrences to run now (``[]``: skipped)."""
        ...

    def arm_all(self, now_ms: int | None = None) -> int:
        """Arm every cron job's next occurrence; how many were newly armed."""
        ...


class App(Protocol):
    """What the dispatcher needs of a :class:`scheduler.Scheduler`."""

    @property
    def registry(self) -> JobRegistry: ...
    @property
    def broker(self) -> BrokerAdapter: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def planner(self) -> CronPlanner: ...
    def topics(self) -> set[str]: ...


class Run:
    """The processing of one message: one job run, or a cron message's occurrences."""

    __slots__ = ("call", "cron", "future", "job", "message", "occurrences", "settled", "spec")

    def __init__(
        self,
        message: ReceivedMessage,
        spec: JobSpec,
        call: JobCall,
        cron: CronSpec | None = None,
        occurrences: list[int] | None = None,
    ) -> None:
        self.message = message
        self.spec = spec
        self.call = call
        self.cron = cron
        self.occurrences = occurrences
        self.settled = False
        self.job: JobContext | None = None
        self.future: Future[Any] | None = None


class CronGate:
    """Cron specs by name (read from the registry on a miss) and how many runs of
    each cron job are going, for ``CronSpec.max_running``; safe across threads.

    :param registry: the app's job registry.
    """

    def __init__(self, registry: JobRegistry) -> None:
        self._registry = registry
        self._specs: dict[str, CronSpec] = {}
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def find(self, name: str) -> CronSpec | None:
        """The cron job named ``name``, or ``None``."""
        spec = self._specs.get(name)
        if spec is None:
            self._specs = {c.name: c for c in self._registry.crons()}
            spec = self._specs.get(name)
        return spec

    def admit(self, cron: CronSpec) -> str:
        """Count one more run of ``cron`` and return ``""``, or return why not."""
        with self._lock:
            running = self._running.get(cron.name, 0)
            if running >= cron.max_running:
                return f"{running} run(s) still going (max_running={cron.max_running})"
            self._running[cron.name] = running + 1
            return ""

    def finished(self, name: str) -> None:
        """One run of cron job ``name`` ended."""
        with self._lock:
            self._running[name] -= 1


__all__ = ["App", "CronGate", "CronPlanner", "Run"]
