"""Prometheus metrics of a broker server (``--metrics-port``).

Gauges read ``broker.stats()`` at scrape time: ``chronoq_pending{topic}``,
``chronoq_ready{group}``, ``chronoq_inflight{group}``, ``chronoq_dead{group}``,
and the counter ``chronoq_fired_total{topic}``. Counted as requests arrive:
``chronoq_requests_total{op}``, ``chronoq_sent_messages_total``,
``chronoq_aborts_total{status}``, ``chronoq_pulled_messages_total`` (their
``rate()`` are the send, abort and pull rates), ``chronoq_reschedules_total{status}``,
``chronoq_prefix_aborted_messages_total`` (messages aborted by ``abort_prefix``),
``chronoq_dead_letters_settled_total{action}`` (dead letters requeued or purged:
``requeue`` or ``purge``),
``chronoq_rate_permits_total{outcome}`` and ``chronoq_slot_acquires_total{outcome}``
(``taken`` or ``refused``), ``chronoq_bad_frames_total``,
``chronoq_auth_failures_total``, ``chronoq_refused_connections_total``.
``chronoq_fire_lateness_seconds`` is a histogram of, for each first delivery,
the server's wall time when a consumer received it minus its due time (so it
includes any time it waited in ``ready`` for a consumer).

``prometheus_client`` comes with the ``chronoq[metrics]`` extra and is imported
only when metrics are served (a missing extra is
:class:`~broker_adapter.errors.MissingExtra`); without a port the counters are
plain no-ops. The HTTP side is :func:`broker_adapter.metrics_http.serve_metrics`
(shared with the dispatchers' job metrics): off loopback, scrapers send the
server's token as ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from broker_adapter.errors import ChronoqError
from broker_adapter.extras import require
from broker_adapter.metrics_http import MetricsEndpoint, serve_metrics
from broker_adapter.results import ReceivedMessage

if TYPE_CHECKING:
    from broker_adapter.server.server import BrokerServer

log = logging.getLogger("chronoq.broker_adapter.ServerMetrics")
log.addHandler(logging.NullHandler())

LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    """The server's metrics; :meth:`serve` starts the HTTP endpoint.

    :param server: whose broker the gauges read.
    """

    def __init__(self, server: BrokerServer) -> None:
        self._server = server
        self._on = False
        self._http: MetricsEndpoint | None = None

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` on ``host:port`` (0: a free port, see :attr:`port`).

        :raises MissingExtra: without ``prometheus_client`` (``chronoq[metrics]``).
        :raises InvalidArgument: for a non-loopback ``host`` on a server without a token.
        """
        pc = require("prometheus_client", "metrics", "the server's metrics endpoint")
        self.registry = reg = pc.CollectorRegistry()
        self._requests = pc.Counter(
            "chronoq_requests", "Requests by operation", ["op"], registry=reg
        )
        self._sent = pc.Counter("chronoq_sent_messages", "Messages sent", registry=reg)
        self._aborts = pc.Counter(
            "chronoq_aborts", "Abort requests by outcome", ["status"], registry=reg
        )
        self._pulled = pc.Counter(
            "chronoq_pulled_messages", "Messages handed to consumers", registry=reg
        )
        self._reschedules = pc.Counter(
            "chronoq_reschedules", "Reschedule requests by outcome", ["status"], registry=reg
        )
        self._prefix_aborted = pc.Counter(
            "chronoq_prefix_aborted_messages", "Messages aborted by abort_prefix", registry=reg
        )
        self._dead_settled = pc.Counter(
            "chronoq_dead_letters_settled",
            "Dead letters requeued or purged, by action",
            ["action"],
            registry=reg,
        )
        self._permits = pc.Counter(
            "chronoq_rate_permits", "Rate permits asked for, by outcome", ["outcome"], registry=reg
        )
        self._slots = pc.Counter(
            "chronoq_slot_acquires", "Slot acquires by outcome", ["outcome"], registry=reg
        )
        self._lateness = pc.Histogram(
            "chronoq_fire_lateness_seconds",
            "First delivery time minus due time",
            buckets=LATENESS_BUCKETS,
            registry=reg,
        )
        self._bad = pc.Counter(
            "chronoq_bad_frames", "Malformed frames (connection closed)", registry=reg
        )
        self._auth = pc.Counter("chronoq_auth_failures", "Wrong or missing tokens", registry=reg)
        self._refused = pc.Counter(
            "chronoq_refused_connections", "Over max connections", registry=reg
        )
        core = require("prometheus_client.core", "metrics", "the server's metrics endpoint")
        reg.register(_StatsCollector(self._server, core))
        self._http = serve_metrics(
            reg, port, host, token=self._server.token, feature="the server's metrics endpoint"
        )
        self._on = True

    @property
    def port(self) -> int | None:
        """The port metrics are served on, or ``None`` when they are not."""
        return None if self._http is None else self._http.port

    def stop(self) -> None:
        """Stop the HTTP endpoint, if any."""
        if self._http is not None:
            self._http.stop()
            self._http = None

    def request(self, op: str) -> None:
        """Count one request."""
        if self._on:
            self._requests.labels(op).inc()

    def sent(self, n: int) -> None:
        """Count ``n`` sent messages."""
        if self._on:
            self._sent.inc(n)

    def aborted(self, status: str) -> None:
        """Count one abort by outcome."""
        if self._on:
            self._aborts.labels(status).inc()

    def rescheduled(self, status: str) -> None:
        """Count one reschedule by outcome."""
        if self._on:
            self._reschedules.labels(status).inc()

    def prefix_aborted(self, n: int) -> None:
        """Count ``n`` messages aborted by one ``abort_prefix``."""
        if self._on:
            self._prefix_aborted.inc(n)

    def dead_settled(self, action: str, n: int) -> None:
        """Count ``n`` dead letters requeued or purged (``action``: ``requeue``/``purge``)."""
        if self._on and n:
            self._dead_settled.labels(action).inc(n)

    def rate_asked(self, taken: bool) -> None:
        """Count one ``acquire_rate``: a permit taken or a wait answered."""
        if self._on:
            self._permits.labels("taken" if taken else "refused").inc()

    def slot_asked(self, taken: bool) -> None:
        """Count one ``acquire_slot``: a slot taken (or renewed) or all held."""
        if self._on:
            self._slots.labels("taken" if taken else "refused").inc()

    @property
    def on(self) -> bool:
        """Whether metrics are served (else every count is a no-op)."""
        return self._on

    def pulled(self, messages: Sequence[ReceivedMessage], now_ms: float) -> None:
        """Count pulled messages and observe the lateness of first deliveries."""
        if not self._on:
            return
        self._pulled.inc(len(messages))
        observe = self._lateness.observe
        for m in messages:
            if m.attempts == 1:
                observe(max(now_ms - m.deliver_at_ms, 0.0) / 1000)

    def bad_frame(self) -> None:
        """Count a malformed frame."""
        if self._on:
            self._bad.inc()

    def auth_failed(self) -> None:
        """Count a refused token."""
        if self._on:
            self._auth.inc()

    def refused(self) -> None:
        """Count a connection refused for the connection limit."""
        if self._on:
            self._refused.inc()


class _StatsCollector:
    """Gauges from ``broker.stats()`` at scrape time.

    :param server: whose broker to read.
    :param core: ``prometheus_client.core`` (the metric families).
    """

    def __init__(self, server: BrokerServer, core: ModuleType) -> None:
        self._server = server
        self._core = core

    def collect(self) -> Iterator[Any]:
        """The gauges and the fired counter, read now."""
        gauge, counter = self._core.GaugeMetricFamily, self._core.CounterMetricFamily
        try:
            stats = self._server.broker.stats()
        except ChronoqError:  # closed during shutdown or reset: no gauges this scrape
            return
        pending = gauge("chronoq_pending", "Messages on the wheel", labels=["topic"])
        fired = counter("chronoq_fired", "Messages fired", labels=["topic"])
        for name, t in stats.topics.items():
            pending.add_metric([name], t.pending)
            fired.add_metric([name], t.fired_total)
        ready = gauge("chronoq_ready", "Fired, not yet pulled", labels=["group"])
        inflight = gauge("chronoq_inflight", "Pulled, not yet acked", labels=["group"])
        dead = gauge("chronoq_dead", "Dead letters", labels=["group"])
        for name, g in stats.groups.items():
            ready.add_metric([name], g.ready)
            inflight.add_metric([name], g.inflight)
            dead.add_metric([name], g.dead)
        yield from (pending, fired, ready, inflight, dead)
