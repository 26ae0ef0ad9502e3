"""The dashboard's defences, in one ASGI middleware (:class:`SecurityMiddleware`)
around every request, and the checks it applies (:class:`Guard`).

* **Token.** With a token configured, every ``/api/*`` request (``api/config``
  aside: it reveals nothing else) needs ``X-Chronoq-Token: <token>`` or
  ``Authorization: Bearer <token>``, compared with :func:`hmac.compare_digest`.
  Only headers count: a token in a URL would end up in logs and histories.
  The token is never logged.
* **CSRF.** There are no cookies at all, so a cross-site page cannot make the
  browser authenticate for it; on top of that every POST needs ``Content-Type:
  application/json`` (a cross-site form or a "simple" fetch cannot send it
  without a CORS preflight, which this server never grants) and an ``Origin``
  that is this server's own, or none (scripts and curl send none).
* **DNS rebinding.** The ``Host`` header must be one this dashboard is served
  under (the bound address, ``localhost``, ``127.0.0.1``, ``[::1]``, or names
  given as allowed hosts), else a page of ``evil.example`` whose name now
  resolves to 127.0.0.1 could read the API as same-origin.
* **Headers.** Every answer carries :data:`SECURITY_HEADERS` (a strict
  Content-Security-Policy: no inline scripts or styles, nothing from elsewhere).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from workers.dashboard.errors import (
    BodyTooLarge,
    CrossSiteRequest,
    DashboardError,
    Unauthorized,
    UnsupportedMediaType,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Sent with every answer.
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    (
        "content-security-policy",
        (
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
        ),
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
)
#: Host names always accepted (with any port): the loopback ones.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: Largest request body accepted (the largest real one, 1,000 message ids, is ~40 KB).
MAX_BODY_BYTES = 1024 * 1024
#: The API paths readable without the token.
PUBLIC_API = frozenset({"/api/config"})


def split_host(host: str) -> tuple[str, str]:
    """``("name", "port")`` of a ``Host`` header or an origin's netloc (port ``""``
    when absent); names lower-cased, IPv6 kept in brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest.removeprefix(":")
    name, _, port = host.partition(":")
    return name, port


class Guard:
    """The checks of one dashboard (see the module docstring).

    :param token: the token API calls need; ``None`` for none.
    :param allowed_hosts: host names (``name`` or ``name:port``) accepted in the
        ``Host`` header besides the loopback ones; ``"*"`` accepts any.
    :param port: the port the server listens on, when known: loopback names are
        then accepted on it only.
    """

    def __init__(
        self, token: str | None, allowed_hosts: Iterable[str] = (), port: int | None = None
    ) -> None:
        self._token = token.encode() if token else None
        hosts = {h.strip().lower() for h in allowed_hosts if h.strip()}
        self._any_host = "*" in hosts
        self._hosts = frozenset(hosts - {"*"})
        self._port = None if port is None else str(port)

    @property
    def token_required(self) -> bool:
        """Whether API calls need the token."""
        return self._token is not None

    def host_ok(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` header) is one this dashboard is served under."""
        if self._any_host:
            return True
        name, port = split_host(host)
        if host.strip().lower() in self._hosts or name in self._hosts:
            return True
        return name in LOOPBACK_HOSTS and (self._port is None or port == self._port)

    def token_ok(self, headers: dict[str, str]) -> bool:
        """Whether ``headers`` carry the token (always, when there is none)."""
        if self._token is None:
            return True
        given = headers.get("x-chronoq-token")
        if given is None:
            scheme, _, value = headers.get("authorization", "").partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
        # compare_digest on bytes: its time does not depend on where they differ.
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def check(self, method: str, path: str, headers: dict[str, str]) -> DashboardError | None:
        """The error to answer a request with, or ``None`` to serve it.

        :param path: the path below the app's root (``/api/overview``).
        :param headers: the request headers, names lower-cased.
        """
        host = headers.get("host", "")
        if not self.host_ok(host):
            return CrossSiteRequest(
                f"Host {host!r} is not a name this dashboard is served under; open it as "
                "http://127.0.0.1:PORT/ or start it with --allowed-host NAME"
            )
        if method == "POST":
            origin = headers.get("origin")
            if origin is not None:
                netloc = origin.partition("://")[2].rstrip("/")
                if origin == "null" or split_host(netloc) != split_host(host):
                    return CrossSiteRequest(
                        f"cross-site POST from origin {origin!r} refused; actions come from "
                        "the dashboard's own pages or from scripts (which send no Origin)"
                    )
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                return BodyTooLarge(
                    f"request body of {length} bytes refused: at most {MAX_BODY_BYTES} bytes"
                )
            ctype = headers.get("content-type", "").partition(";")[0].strip().lower()
            if ctype != "application/json":
                return UnsupportedMediaType(
                    f"POST needs Content-Type: application/json, got {ctype or 'none'!r}; "
                    "send a JSON object ({} when there is nothing to say)"
                )
        is_api = path == "/api" or path.startswith("/api/")
        if is_api and path not in PUBLIC_API and not self.token_ok(headers):
            return Unauthorized(
                "this dashboard needs its token: send it in the X-Chronoq-Token header "
                "(or Authorization: Bearer TOKEN)"
            )
        return None


def error_body(error: Exception) -> bytes:
    """The JSON body of an error answer."""
    return json.dumps({"error": type(error).__name__, "message": str(error)}).encode()


def _capped(receive: Receive) -> Receive:
    """``receive`` that ends a body (sent without a length) past :data:`MAX_BODY_BYTES`
    as a disconnect: the app stops reading and answers nothing."""
    seen = 0

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                return {"type": "http.disconnect"}
        return message

    return capped


class SecurityMiddleware:
    """Applies a :class:`Guard` to every HTTP request of ``app`` and adds
    :data:`SECURITY_HEADERS` to every answer.

    :param app: the ASGI app to protect.
    :param guard: the checks.
    """

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):  # mounted under a prefix: the path below it
            path = path[len(root) :] or "/"
        error = self.guard.check(scope["method"], path, headers)

        async def send_secure(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        if error is None:
            await self.app(scope, _capped(receive), send_secure)
            return
        body = error_body(error)
        await send_secure(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send_secure({"type": "http.response.body", "body": body})


__all__ = [
    "MAX_BODY_BYTES",
    "SECURITY_HEADERS",
    "Guard",
    "SecurityMiddleware",
    "error_body",
    "split_host",
]
