"""The dashboard's own errors (:class:`DashboardError` and its kinds), and the HTTP
status of every error an API call may raise (:func:`http_status`).

Every error answer is ``{"error": "<class name>", "message": "..."}``; the class
names are the ones of :mod:`broker_adapter.errors` and :mod:`scheduler.errors`
(``InvalidArgument``, ``UnknownTopic``, ``ScheduleNotFound`` ...) plus these.
"""

from __future__ import annotations

from broker_adapter.errors import BrokerError, ChronoqError


class DashboardError(ChronoqError):
    """A request the dashboard refuses before doing anything."""

    #: The HTTP status of the answer.
    status = 400


class Unauthorized(DashboardError):
    """No token, or a wrong one, on an API call of a dashboard that has a token."""

    status = 401


class CrossSiteRequest(DashboardError):
    """A POST from another origin (CSRF), or a request for a host name this dashboard
    is not served under (DNS rebinding)."""

    status = 403


class UnsupportedMediaType(DashboardError):
    """A POST whose body is not ``application/json``."""

    status = 415


class BodyTooLarge(DashboardError):
    """A request body over the dashboard's limit (its bodies are small JSON objects)."""

    status = 413


class RouteNotFound(DashboardError):
    """A path (or a method on it) the dashboard does not serve."""

    status = 404


def http_status(error: ChronoqError) -> int:
    """The HTTP status of an answer carrying ``error``: the dashboard's own status;
    404 for what names nothing (a ``LookupError``); 400 for bad input (a
    ``ValueError``/``TypeError``: nothing changed); 503 when the broker failed."""
    if isinstance(error, DashboardError):
        return error.status
    if isinstance(error, LookupError):
        return 404
    if isinstance(error, ValueError | TypeError):
        return 400
    if isinstance(error, BrokerError):
        return 503
    return 500


__all__ = [
    "BodyTooLarge",
    "CrossSiteRequest",
    "DashboardError",
    "RouteNotFound",
    "Unauthorized",
    "UnsupportedMediaType",
    "http_status",
]
