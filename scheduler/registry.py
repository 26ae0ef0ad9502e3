"""The :class:`JobRegistry`: job names to :class:`~scheduler.spec.JobSpec`, and cron jobs.

Decorators fill it at import time; dispatchers read it to resolve the job a
message names. Nothing here touches a broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from scheduler.errors import DuplicateJob, JobNotFound
from scheduler.spec import CronSpec, JobSpec

_log = logging.getLogger("chronoq.scheduler.JobRegistry")


class JobRegistry:
    """Registered jobs by name, and the cron jobs among them; safe across threads.

    Iterating yields the job specs in registration order; ``len`` counts them and
    ``name in registry`` tests a name.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, JobSpec] = {}
        self._crons: dict[str, CronSpec] = {}
        self._lock = threading.Lock()

    def register(self, spec: JobSpec) -> JobSpec:
        """Add ``spec`` under ``spec.name`` and return it.

        Registering the very same spec again (a module imported twice) is a no-op.

        :raises DuplicateJob: when another job already has that name.
        :raises TypeError: when ``spec`` is not a :class:`JobSpec`.
        """
        if not isinstance(spec, JobSpec):
            raise TypeError(f"register() takes a JobSpec, got {type(spec).__name__}")
        with self._lock:
            existing = self._jobs.get(spec.name)
            if existing is not None:
                if existing == spec and existing.func is spec.func:
                    return existing
                raise DuplicateJob(spec.name, existing.origin)
            self._jobs[spec.name] = spec
        _log.debug("registered job %s (%s, executor=%s)", spec.name, spec.origin, spec.executor)
        return spec

    def register_cron(self, cron: CronSpec) -> CronSpec:
        """Register ``cron.job`` (as :meth:`register` does) and its schedule.

        :raises DuplicateJob: when the name is taken by another job or cron.
        :raises TypeError: when ``cron`` is not a :class:`CronSpec`.
        """
        if not isinstance(cron, CronSpec):
            raise TypeError(f"register_cron() takes a CronSpec, got {type(cron).__name__}")
        with self._lock:
            existing = self._crons.get(cron.name)
            if existing is not None and existing != cron:
                raise DuplicateJob(cron.name, existing.job.origin)
        self.register(cron.job)
        with self._lock:
            self._crons[cron.name] = cron
        _log.debug("registered cron %s: %s", cron.name, cron.trigger)
        return cron

    def get(self, name: str) -> JobSpec:
        """The spec registered under ``name``.

        :raises JobNotFound: when no job has that name (the message suggests a close one).
        """
        try:
            return self._jobs[name]
        except KeyError:
            raise JobNotFound(name, list(self._jobs)) from None

    def find(self, name: str) -> JobSpec | None:
        """The spec registered under ``name``, or ``None``."""
        return self._jobs.get(name)

    def find_cron(self, name: str) -> CronSpec | None:
        """The cron job registered under ``name``, or ``None`` (also for a plain job)."""
        return self._crons.get(name)

    def crons(self) -> list[CronSpec]:
        """The cron jobs, in registration order."""
        with self._lock:
            return list(self._crons.values())

    def names(self) -> list[str]:
        """The registered job names, in registration order."""
        with self._lock:
            return list(self._jobs)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __iter__(self) -> Iterator[JobSpec]:
        with self._lock:
            specs = list(self._jobs.values())
        return iter(specs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __repr__(self) -> str:
        return f"<JobRegistry {len(self._jobs)} jobs, {len(self._crons)} crons>"
