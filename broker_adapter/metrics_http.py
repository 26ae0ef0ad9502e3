"""The ``/metrics`` HTTP endpoint of a Prometheus registry, on a thread of its own.

Shared by the broker server (``chronoq broker serve --metrics-port``,
:mod:`broker_adapter.server.metrics`) and the dispatchers (``chronoq run
--metrics-port``, :mod:`workers.job_metrics`). Every metric of chronoq is named
``chronoq_...`` (:data:`METRIC_PREFIX`); each process serves its own registry,
never prometheus_client's global one, so tests and embedded uses do not collide.

Safe by default: it binds 127.0.0.1. Any other address needs a token, and every
scrape must then send ``Authorization: Bearer <token>`` (Prometheus:
``authorization: {credentials: ...}``), compared in constant time; a scrape
without it gets 401 and nothing else.

``prometheus_client`` comes with the ``chronoq[metrics]`` extra (a missing one is
:class:`~broker_adapter.errors.MissingExtra`).
"""

from __future__ import annotations

import hmac
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from broker_adapter.extras import require
from broker_adapter.listen import check_bind, is_loopback

#: The prefix of every chronoq metric name.
METRIC_PREFIX = "chronoq_"

_log = logging.getLogger("chronoq.broker_adapter.MetricsEndpoint")
_log.addHandler(logging.NullHandler())

_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per scrape, so a slow scraper holds up no other."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _with_token(app: _WsgiApp, token: str) -> _WsgiApp:
    """``app`` answering 401 unless the request carries ``Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if not hmac.compare_digest(given, expected):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")],
            )
            return [b"send Authorization: Bearer <token>\n"]
        return app(environ, start_response)

    return guarded


class MetricsEndpoint:
    """A running ``/metrics`` endpoint; build it with :func:`serve_metrics`.

    :param server: the bound HTTP server.
    :param thread: the thread serving it.
    """

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host: str = str(server.server_address[0])
        #: The bound port (the one picked when 0 was asked for).
        self.port: int = int(server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


def serve_metrics(
    registry: Any,
    port: int,
    host: str = "127.0.0.1",
    *,
    token: str | None = None,
    feature: str = "the metrics endpoint",
) -> MetricsEndpoint:
    """Serve ``registry`` (a ``prometheus_client.CollectorRegistry``) on ``host:port``.

    :param port: the TCP port; 0 picks a free one (see :attr:`MetricsEndpoint.port`).
    :param host: the address to bind; 127.0.0.1 by default.
    :param token: required from every scraper when ``host`` is not a loopback
        address (ignored on loopback, where the broker's own rule applies too).
    :param feature: what serves it, in words, for a :class:`MissingExtra`.
    :raises InvalidArgument: for a non-loopback ``host`` without a token; nothing is bound.
    :raises MissingExtra: without ``prometheus_client`` (``chronoq[metrics]``).
    :raises OSError: when the port cannot be bound (in use, no permission).
    """
    check_bind(
        host,
        token,
        f"refusing to serve metrics on {host!r} without a token: anyone who can reach "
        "it could read them; set CHRONOQ_TOKEN (scrapers then send 'Authorization: "
        "Bearer <token>') or bind 127.0.0.1",
    )
    exposition = require("prometheus_client.exposition", "metrics", feature)
    app: _WsgiApp = exposition.make_wsgi_app(registry)
    if token and not is_loopback(host):
        app = _with_token(app, token)

    server_class: type[WSGIServer] = _ThreadingServer
    if ":" in host:  # an IPv6 literal

        class _Server6(_ThreadingServer):
            address_family = socket.AF_INET6

        server_class = _Server6
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, name=f"chronoq-metrics-{port}", daemon=True
    )
    thread.start()
    endpoint = MetricsEndpoint(server, thread)
    _log.info("metrics on %s", endpoint.url)
    return endpoint


__all__ = ["METRIC_PREFIX", "MetricsEndpoint", "serve_metrics"]
