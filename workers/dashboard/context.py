"""What the API's routes share: :class:`Dashboard` holds the broker, a bare
:class:`~scheduler.scheduler.Scheduler` on it (for ``app.schedules``, which works
from the broker alone), the fire-rate sampler and the trace directory."""

from __future__ import annotations

import threading
from importlib import metadata
from pathlib import Path

from broker_adapter.base import BrokerAdapter
from broker_adapter.urls import ADAPTERS, open_broker, split_url
from scheduler.scheduler import Scheduler
from scheduler.trace_format import default_trace_dir
from workers.dashboard.lateness import TraceIndex
from workers.dashboard.sampler import DEFAULT_INTERVAL_S, RateSampler

#: Adapter module (under ``broker_adapter.``) -> ``broker_kind``.
_MODULE_KINDS = {
    "shared": "rocksdb",
    "embedded": "rocksdb",
    "memory": "memory",
    "server": "chronoq",
    "redis": "redis",
}


def _module_kind(module: str) -> str:
    package, _, rest = module.partition(".")
    return (
        _MODULE_KINDS.get(rest.partition(".")[0], "other")
        if package == "broker_adapter"
        else "other"
    )


#: URL scheme -> the ``broker_kind`` that ``api/config`` reports (from the adapter that
#: serves the scheme, so a new scheme of a shipped adapter needs no entry here).
KINDS = {scheme: _module_kind(target.partition(":")[0]) for scheme, target in ADAPTERS.items()}


def broker_kind(broker: BrokerAdapter, url: str | None = None) -> str:
    """``"rocksdb"``, ``"chronoq"``, ``"redis"`` or ``"memory"`` (``"other"`` for an
    adapter chronoq does not ship)."""
    if url is not None:
        return KINDS.get(split_url(url)[0], "other")
    return _module_kind(type(broker).__module__)


def version() -> str:
    """The installed chronoq's version."""
    try:
        return metadata.version("chronoq")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Dashboard:
    """The state behind one dashboard app.

    :param broker: the broker to show (closed by :meth:`close` only if ``owns_broker``).
    :param url: its URL, when opened from one.
    :param trace_dir: the delivery trace directory (default: ``<data dir>/trace``
        of a ``rocksdb://`` URL, when it exists).
    :param owns_broker: whether :meth:`close` closes the broker.
    :param sample_interval_s: seconds between fire-rate samples.
    """

    def __init__(
        self,
        broker: BrokerAdapter,
        *,
        url: str | None = None,
        trace_dir: str | Path | None = None,
        owns_broker: bool = False,
        sample_interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.broker = broker
        self.kind = broker_kind(broker, url)
        if trace_dir is None and url is not None:
            trace_dir = default_trace_dir(url)
        self.trace_dir = None if trace_dir is None else Path(trace_dir)
        self.trace = None if self.trace_dir is None else TraceIndex(self.trace_dir)
        self.app = Scheduler(broker)  # bare: its schedules come from the broker
        self.sampler = RateSampler(lambda: broker.stats().fired_total, sample_interval_s)
        self._owns_broker = owns_broker
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str, trace_dir: str | Path | None = None) -> Dashboard:
        """A dashboard on the broker at ``url`` (opened here, closed by :meth:`close`).

        :raises UnknownScheme: for a URL no adapter serves.
        :raises MissingExtra: when the URL's adapter needs an extra that is missing.
        """
        return cls(open_broker(url), url=url, trace_dir=trace_dir, owns_broker=True)

    @property
    def lateness_available(self) -> bool:
        """Whether there is a trace directory to read lateness from."""
        return self.trace_dir is not None and self.trace_dir.is_dir()

    def start(self) -> None:
        """Start sampling the fire rate."""
        self.sampler.start()

    def close(self) -> None:
        """Stop the sampler; close the broker if it was opened here. Twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.sampler.close()
        self.app.close()
        if self._owns_broker:
            self.broker.close()


__all__ = ["KINDS", "Dashboard", "broker_kind", "version"]
