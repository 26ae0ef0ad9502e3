"""AsyncRemoteBroker: the awaitable client of ``chronoq://host:port[,host2:port2]?token=...``.

The asyncio twin of :class:`~broker_adapter.server.client.RemoteBroker`, speaking
the same protocol natively on the event loop (:mod:`~broker_adapter.server.async_link`;
:mod:`~broker_adapter.server.async_endpoint` reconnects): it never blocks the loop,
and any number of coroutines share one connection per server. Its behaviour is
the sync client's, rule for rule: ``send``/``send_batch`` wait within
``send_timeout_ms`` (default 3 s) and retry a failed connection up to ``retries``
times (default 2) on another endpoint, with latency-based fault avoidance
(:mod:`~broker_adapter.server.fault`); a message with a key always goes to the
endpoint its ``(topic, key)`` hashes to, ids are ``NODE:ID`` with several
endpoints, reads merge all endpoints (:mod:`~broker_adapter.server.routing`).
A body over the server's limit (learnt on connecting) is refused before sending.
The runtime calls ``reschedule``, ``abort_prefix`` and ``find_pending`` and the
dead-letter calls route and merge as the sync client's do
(:mod:`~broker_adapter.server.async_client_runtime`); a server that predates them
is sent nothing (:class:`~broker_adapter.server.session.ServerTooOld`), and
``abort_prefix`` may take up to
:data:`~broker_adapter.server.client_runtime.ABORT_PREFIX_TIMEOUT_S` (it works
through every matching key).
Other requests wait at most ``request_timeout_s`` and are not retried: a request
in flight when its connection breaks fails with
:class:`~broker_adapter.errors.ConnectionFailed` (it may or may not have run),
and the next call connects again. A server that is stopping answers as a lost
connection does. Consumers stay on the sync side.

Use one client per event loop (one that outlives its loop connects again on the next).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from broker_adapter.adapter import check_messages
from broker_adapter.async_base import AsyncAdapterBase
from broker_adapter.checks import check_int
from broker_adapter.errors import BrokerClosed, ConnectionFailed, InvalidArgument, MessageTooLarge
from broker_adapter.message import Message
from broker_adapter.results import AbortResult, AbortStatus, BrokerStats, MessageView, SendResult
from broker_adapter.server import values as V
from broker_adapter.server.async_client_runtime import AsyncRemoteRuntimeCalls
from broker_adapter.server.async_endpoint import AsyncEndpoint
from broker_adapter.server.client import DEFAULT_RETRIES, DEFAULT_SEND_TIMEOUT_MS
from broker_adapter.server.endpoint import client_args, parse_endpoints
from broker_adapter.server.fault import FaultTolerance
from broker_adapter.server.link import REQUEST_TIMEOUT_S
from broker_adapter.server.routing import (
    ABORT_RANK,
    fixed_index,
    key_index,
    merge_pending,
    merge_stats,
    split_node_id,
)

log = logging.getLogger("chronoq.broker_adapter.AsyncRemoteBroker")
log.addHandler(logging.NullHandler())


class AsyncRemoteBroker(AsyncRemoteRuntimeCalls, AsyncAdapterBase):
    """An asyncio client of one or more broker servers; connects on its first call.

    :param endpoints: ``"h1:p1,h2:p2"`` or a sequence of ``(host, port)``; ``(path, None)``
        is a Unix socket (a data directory's owner serves one).
    :param token: the servers' token (default none).
    :param send_timeout_ms: bound on a send, retries included.
    :param retries: extra attempts of a send after a connection failure.
    :param connect_timeout_s: bound on connecting to one endpoint (and its hello).
    :param request_timeout_s: bound on the answer to any other request.
    :raises InvalidArgument: for no endpoint or a bad number.
    """

    def __init__(
        self,
        endpoints: str | Sequence[tuple[str, int | None]],
        *,
        token: str | None = None,
        send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS,
        retries: int = DEFAULT_RETRIES,
        connect_timeout_s: float = 3.0,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        check_int("send_timeout_ms", send_timeout_ms)
        check_int("retries", retries, minimum=0)
        if not isinstance(request_timeout_s, int | float) or not request_timeout_s > 0:
            raise InvalidArgument(
                f"request_timeout_s must be a number of seconds > 0, got {request_timeout_s!r}"
            )
        pairs = parse_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        if not pairs:
            raise InvalidArgument("an AsyncRemoteBroker needs at least one endpoint host:port")
        self.endpoints = [
            AsyncEndpoint(i, h, p, token, connect_timeout_s) for i, (h, p) in enumerate(pairs)
        ]
        self.multi = len(self.endpoints) > 1
        self.send_timeout_ms = send_timeout_ms
        self.retries = retries
        self.request_timeout_s = float(request_timeout_s)
        self.fault = FaultTolerance(len(self.endpoints))

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncRemoteBroker:
        """Open ``chronoq://h1:p1[,h2:p2]?token=T&send_timeout_ms=3000&retries=2``, or
        ``chronoq+unix:///abs/path.sock[?...]`` (the sync client's parameters);
        ``kwargs`` override them.

        :raises InvalidArgument: for a bad endpoint or parameter.
        """
        endpoints, opts = client_args(url, kwargs)
        return cls(endpoints, **opts)

    # -- ids -----------------------------------------------------------------------------

    def tag(self, ep: AsyncEndpoint, msg_id: str) -> str:
        """The id callers see for ``msg_id`` of endpoint ``ep``."""
        return f"{ep.node}:{msg_id}" if self.multi else msg_id

    async def _route(self, msg_id: str) -> list[tuple[AsyncEndpoint, str]]:
        """Where to look for ``msg_id``: ``(endpoint, server id)`` pairs."""
        split = split_node_id(msg_id)
        if split is not None:
            node, raw = split
            for ep in self.endpoints:
                if await ep.known_node(self.check_open) == node:
                    return [(ep, raw)]
            if not self.multi:
                return []
        return [(ep, msg_id) for ep in self.endpoints]

    # -- sending ---------------------------------------------------------------------------

    async def _send(
        self, messages: Sequence[Message], op: str, args: dict[str, Any]
    ) -> tuple[AsyncEndpoint, Any]:
        """Run a send with the timeout, retries and fault avoidance of the sync client."""
        deadline = time.monotonic() + self.send_timeout_ms / 1000
        fixed = fixed_index(messages, len(self.endpoints))
        avoid: int | None = None
        last: ConnectionFailed | None = None
        for _attempt in range(1 + self.retries):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            index = fixed if fixed is not None else self.fault.pick(avoid)
            ep = self.endpoints[index]
            t0 = time.monotonic()
            try:
                link = await ep.link(self.check_open)
                for m in messages:
                    if m.size() > link.max_body:
                        raise MessageTooLarge(m.size(), link.max_body)
                result = await link.call(op, args, remaining)
            except ConnectionFailed as e:
                self.fault.update(index, (time.monotonic() - t0) * 1000, failed=True)
                last, avoid = e, index
                log.info("%s to %s failed (%s); retrying", op, ep.address, e)
                continue
            if self.multi:  # latencies only matter when there is a choice
                self.fault.update(index, (time.monotonic() - t0) * 1000)
            return ep, result
        self.check_open()  # closed meanwhile: say so rather than "failed"
        raise ConnectionFailed(
            f"{op} failed within {self.send_timeout_ms} ms and "
            f"{self.retries} retries: {last or 'timed out'}"
        )

    async def send(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send` (a ``send`` request: the server stores the
        sends that arrive together as one batch)."""
        self.check_open()
        check_messages((message,), None)  # the body limit is each server's, checked in _send
        ep, r = await self._send((message,), "send", {"m": V.encode_message(message)})
        result = V.decode_result(r)
        return result._replace(msg_id=self.tag(ep, result.msg_id)) if self.multi else result

    async def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch` (one endpoint, one round trip)."""
        encode = V.encode_message
        ep, rs = await self._send(messages, "send_batch", {"ms": [encode(m) for m in messages]})
        return V.decode_results(rs, f"{ep.node}:" if self.multi else "")

    # -- aborting and reading ---------------------------------------------------------------

    async def _call(self, ep: AsyncEndpoint, op: str, args: dict[str, Any]) -> Any:
        link = await ep.link(self.check_open)
        return await link.call(op, args, self.request_timeout_s)

    async def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        if msg_id is not None:
            if not isinstance(msg_id, str):
                return AbortResult(AbortStatus.NOT_FOUND, msg_id)
            targets = await self._route(msg_id)
        else:
            fixed = key_index(str(topic), str(key), len(self.endpoints))
            targets = [(self.endpoints[fixed], "")]
        best = AbortResult(AbortStatus.NOT_FOUND, msg_id)
        for ep, raw in targets:
            args = {"id": raw} if msg_id is not None else {"key": key, "topic": topic}
            status, mid = await self._call(ep, "abort", args)
            result = AbortResult(
                AbortStatus(status),
                msg_id if msg_id is not None else (None if mid is None else self.tag(ep, mid)),
            )
            if ABORT_RANK[result.status] < ABORT_RANK[best.status]:
                best = result
            if best.status is AbortStatus.ABORTED:
                break
        return best

    async def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        if not isinstance(msg_id, str):
            return None
        for ep, raw in await self._route(msg_id):
            v = await self._call(ep, "query", {"id": raw})
            if v is not None:
                return dataclasses.replace(V.decode_view(v), msg_id=msg_id)
        return None

    async def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending` (merged over endpoints, by due time)."""
        views: list[MessageView] = []
        args = {"topic": topic, "start": start_ms, "end": end_ms, "limit": limit}
        for ep in self.endpoints:
            got = await self._call(ep, "pending", args)
            prefix = f"{ep.node}:" if self.multi else ""
            views.extend(V.decode_view(v, prefix) for v in got)
        return merge_pending(views, limit, self.multi)

    async def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats` (summed over endpoints)."""
        return merge_stats([await self._call(ep, "stats", {}) for ep in self.endpoints])

    async def _close(self) -> None:
        """Close every connection; requests still waiting fail with ``BrokerClosed``."""
        for ep in self.endpoints:
            await ep.close(BrokerClosed(f"this {type(self).__name__} was closed meanwhile"))


__all__ = ["AsyncRemoteBroker"]
