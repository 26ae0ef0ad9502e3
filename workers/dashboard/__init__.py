"""The chronoq dashboard: web pages and a JSON API over a broker (``chronoq
dashboard``, or mounted in your own ASGI app)::

    from fastapi import FastAPI
    from workers.dashboard import create_app

    app = FastAPI()
    app.mount("/chronoq", create_app(url="rocksdb:///srv/chronoq-data", token="s3cret"))

Needs the ``dashboard`` extra (FastAPI, uvicorn): ``pip install 'chronoq[dashboard]'``.
Importing this package does not import FastAPI; :func:`create_app` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import InvalidArgument
from broker_adapter.extras import require

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(
    url: str | None = None,
    *,
    broker: BrokerAdapter | None = None,
    token: str | None = None,
    trace_dir: str | Path | None = None,
    allowed_hosts: Iterable[str] = (),
    port: int | None = None,
) -> FastAPI:
    """The dashboard as an ASGI app (a FastAPI app) on a broker.

    The app starts sampling the broker's fire rate at once. Served on its own,
    its lifespan closes everything at shutdown; mounted in another app (whose
    lifespan does not reach mounted apps), call
    ``app.state.chronoq_dashboard.close()`` from yours.

    :param url: the broker URL to open (closed with the app); or give ``broker``.
    :param broker: a broker to use as it is (left open).
    :param token: API calls then need it in the ``X-Chronoq-Token`` header (or
        ``Authorization: Bearer``); ``None`` for none (only on loopback!).
    :param trace_dir: the delivery trace to read lateness from (default:
        ``<data dir>/trace`` of a ``rocksdb://`` URL).
    :param allowed_hosts: host names (``name`` or ``name:port``) the app is served
        under besides loopback ones (the ``Host`` check against DNS rebinding);
        ``["*"]`` turns the check off (behind a proxy that checks it).
    :param port: the port it is served on, when known (loopback names are then
        accepted with that port only).
    :raises InvalidArgument: unless exactly one of ``url`` and ``broker`` is given.
    :raises MissingExtra: without the ``dashboard`` extra.
    """
    if (url is None) == (broker is None):
        raise InvalidArgument(
            "give exactly one of url= (a broker URL) or broker= (a BrokerAdapter)"
        )
    require("fastapi", "dashboard", "the dashboard")
    from workers.dashboard.app import build_app
    from workers.dashboard.auth import Guard
    from workers.dashboard.context import Dashboard

    guard = Guard(token, allowed_hosts, port)
    if url is not None:
        dash = Dashboard.open(url, trace_dir)
    else:
        assert broker is not None
        dash = Dashboard(broker, trace_dir=trace_dir)
    dash.start()
    return build_app(dash, guard)


__all__ = ["create_app"]
