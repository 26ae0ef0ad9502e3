"""RemoteBroker: the ``BrokerAdapter`` of ``chronoq://host:port[,host2:port2]?token=...``
(and of ``chronoq+unix:///path.sock``, a server's Unix socket on this machine).

Each endpoint is a ``chronoq broker serve`` process (one embedded broker each).
The producer follows RocketMQ's: ``send``/``send_batch`` wait for the answer
within ``send_timeout_ms`` (default 3 s) and retry a failed connection up to
``retries`` times (default 2) on another endpoint; ``send_async`` calls back,
``send_oneway`` forgets (neither retries). With several endpoints, sends go
round-robin with latency-based fault avoidance (:mod:`~broker_adapter.server.fault`),
except that a message with a key always goes to the endpoint its ``(topic, key)``
hashes to, so sends with a key stay idempotent (and a batch goes where its first
key does). Message ids are then ``NODE:ID`` so aborts and queries find their
endpoint; reads (``pending``, ``stats``) merge all endpoints. With one endpoint,
ids are the server's own. Consumers: :mod:`~broker_adapter.server.consumer`;
the runtime calls (reschedule, prefix abort, find, rate limits, slots):
:mod:`~broker_adapter.server.client_runtime`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker_adapter.adapter import AdapterBase, ConsumerLimits
from broker_adapter.base import Consumer, SendCallback
from broker_adapter.checks import check_int
from broker_adapter.errors import (
    ConnectionFailed,
    InvalidArgument,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    MessageView,
    SendResult,
)
from broker_adapter.server import values as V
from broker_adapter.server.client_dead_letters import RemoteDeadLetterCalls
from broker_adapter.server.client_runtime import RemoteRuntimeCalls
from broker_adapter.server.consumer import RemoteConsumer
from broker_adapter.server.endpoint import (
    CallbackRunner,
    Endpoint,
    client_args,
    parse_endpoints,
)
from broker_adapter.server.fault import FaultTolerance
from broker_adapter.server.link import REQUEST_TIMEOUT_S, RequestTimeout
from broker_adapter.server.routing import (
    ABORT_RANK,
    fixed_index,
    key_index,
    merge_pending,
    merge_stats,
    split_node_id,
)

log = logging.getLogger("chronoq.broker_adapter.RemoteBroker")
log.addHandler(logging.NullHandler())

DEFAULT_SEND_TIMEOUT_MS = 3_000
DEFAULT_RETRIES = 2


class RemoteBroker(RemoteRuntimeCalls, RemoteDeadLetterCalls, AdapterBase):
    """A client of one or more broker servers.

    :param endpoints: ``"h1:p1,h2:p2"`` or a sequence of ``(host, port)``; ``(path, None)``
        is a Unix socket (see :mod:`broker_adapter.shared`).
    :param token: the servers' token (default none).
    :param send_timeout_ms: bound on a sync send, retries included.
    :param retries: extra attempts of a sync send after a connection failure.
    :param connect_timeout_s: bound on connecting to one endpoint.
    """

    def __init__(
        self,
        endpoints: str | Sequence[tuple[str, int | None]],
        *,
        token: str | None = None,
        send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS,
        retries: int = DEFAULT_RETRIES,
        connect_timeout_s: float = 3.0,
    ) -> None:
        check_int("send_timeout_ms", send_timeout_ms)
        check_int("retries", retries, minimum=0)
        pairs = parse_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        if not pairs:
            raise InvalidArgument("a RemoteBroker needs at least one endpoint host:port")
        self.endpoints = [
            Endpoint(i, h, p, token, connect_timeout_s) for i, (h, p) in enumerate(pairs)
        ]
        self.multi = len(self.endpoints) > 1
        self.send_timeout_ms = send_timeout_ms
        self.retries = retries
        self.fault = FaultTolerance(len(self.endpoints))
        self._callbacks = CallbackRunner()
        self._consumers: set[Consumer] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RemoteBroker:
        """Open ``chronoq://h1:p1[,h2:p2]?token=T&send_timeout_ms=3000&retries=2``, or a
        local server's socket, ``chronoq+unix:///abs/path.sock[?token=T&...]``
        (:mod:`~broker_adapter.server.unix_url`).

        :raises InvalidArgument: for a malformed URL.
        """
        endpoints, opts = client_args(url, kwargs)
        return cls(endpoints, **opts)

    # -- ids -----------------------------------------------------------------------------

    def tag(self, ep: Endpoint, msg_id: str) -> str:
        """The id callers see for ``msg_id`` of endpoint ``ep``."""
        return f"{ep.node}:{msg_id}" if self.multi else msg_id

    def _route(self, msg_id: str) -> list[tuple[Endpoint, str]]:
        """Where to look for ``msg_id``: ``(endpoint, server id)`` pairs."""
        split = split_node_id(msg_id)
        if split is not None:
            node, raw = split
            for ep in self.endpoints:
                if ep.known_node(self.check_open) == node:
                    return [(ep, raw)]
            if not self.multi:
                return []
        return [(ep, msg_id) for ep in self.endpoints]

    # -- sending ---------------------------------------------------------------------------

    def _target(self, messages: Sequence[Message]) -> int | None:
        """The fixed endpoint of keyed messages, or ``None`` for round-robin."""
        return fixed_index(messages, len(self.endpoints))

    def _key_index(self, topic: str, key: str) -> int:
        """The endpoint that owns ``key`` on ``topic``."""
        return key_index(topic, key, len(self.endpoints))

    def _send_sync(self, messages: Sequence[Message], op: str, args: dict[str, Any]) -> Any:
        """Run a send with the timeout, retries and fault avoidance of sync sends."""
        self.check_open()
        deadline = time.monotonic() + self.send_timeout_ms / 1000
        fixed = self._target(messages)
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
                link = ep.link(self.check_open)
                for m in messages:
                    if m.size() > link.max_body:
                        raise MessageTooLarge(m.size(), link.max_body)
                result = link.call(op, args, remaining)
            except ConnectionFailed as e:
                if not isinstance(e, RequestTimeout):
                    ep.drop()  # a broken link; a slow answer leaves the link alone
                self.fault.update(index, (time.monotonic() - t0) * 1000, failed=True)
                last, avoid = e, index
                log.info("%s to %s failed (%s); retrying", op, ep.address, e)
                continue
            if self.multi:  # latencies only matter when there is a choice
                self.fault.update(index, (time.monotonic() - t0) * 1000)
            return ep, result
        raise ConnectionFailed(
            f"{op} failed within {self.send_timeout_ms} ms and "
            f"{self.retries} retries: {last or 'timed out'}"
        )

    def _send_one(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send` (a ``send`` request)."""
        ep, r = self._send_sync((message,), "send", {"m": V.encode_message(message)})
        result = V.decode_result(r)
        return result._replace(msg_id=self.tag(ep, result.msg_id)) if self.multi else result

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch` (one endpoint, one round trip)."""
        encode = V.encode_message
        ep, rs = self._send_sync(messages, "send_batch", {"ms": [encode(m) for m in messages]})
        return V.decode_results(rs, f"{ep.node}:" if self.multi else "")

    def _submit_send(
        self, message: Message, done: Callable[[Endpoint | None, Any, BaseException | None], None]
    ) -> None:
        """Start an async or one-way send; ``done(endpoint, wire result, error)``."""
        self.check_open()
        fixed = self._target((message,))
        index = fixed if fixed is not None else self.fault.pick()
        ep = self.endpoints[index]
        try:
            link = ep.link(self.check_open)
        except ConnectionFailed as e:
            ep.drop()
            self.fault.update(index, 0, failed=True)
            self._callbacks.begin()
            done(None, None, e)
            return
        if message.size() > link.max_body:
            raise MessageTooLarge(message.size(), link.max_body)
        self._callbacks.begin()
        try:
            link.submit("send", {"m": V.encode_message(message)}, lambda r, e: done(ep, r, e))
        except ConnectionFailed as e:
            ep.drop()
            done(None, None, e)
        except BaseException:  # refused before it was sent: nothing will complete
            self._callbacks.end()
            raise

    def _submit(self, message: Message, callback: SendCallback | None) -> None:
        """Async (not retried) and one-way sends: straight onto a link, no batching
        (the server batches what arrives together)."""
        if callback is None:
            self._send_oneway(message)
        else:
            self._send_async(message, callback)

    def _send_async(self, message: Message, callback: SendCallback) -> None:
        def done(ep: Endpoint | None, r: Any, error: BaseException | None) -> None:
            result = None
            if error is None and ep is not None:
                result = V.decode_result(r)
                if self.multi:
                    result = result._replace(msg_id=self.tag(ep, result.msg_id))
            self._callbacks.run(callback, result, error)

        self._submit_send(message, done)

    def _send_oneway(self, message: Message) -> None:
        def done(ep: Endpoint | None, r: Any, error: BaseException | None) -> None:
            if error is not None:
                log.warning("one-way send to topic %s failed: %s", message.topic, error)
            self._callbacks.end()

        try:
            self._submit_send(message, done)
        except (InvalidArgument, MessageTooLarge) as e:
            log.warning("one-way send refused: %s", e)

    def _flush(self, timeout_s: float) -> None:
        """See :meth:`BrokerAdapter.flush`."""
        self._callbacks.flush(timeout_s)

    # -- aborting and reading ---------------------------------------------------------------

    def _call(
        self, ep: Endpoint, op: str, args: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> Any:
        try:
            return ep.link(self.check_open).call(op, args, timeout_s)
        except ConnectionFailed:
            ep.drop()
            raise

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        if msg_id is not None:
            if not isinstance(msg_id, str):
                return AbortResult(AbortStatus.NOT_FOUND, msg_id)
            targets = self._route(msg_id)
        else:
            fixed = self._key_index(str(topic), str(key)) if self.multi else 0
            targets = [(self.endpoints[fixed], "")]
        best = AbortResult(AbortStatus.NOT_FOUND, msg_id)
        for ep, raw in targets:
            args = {"id": raw} if msg_id is not None else {"key": key, "topic": topic}
            status, mid = self._call(ep, "abort", args)
            result = AbortResult(
                AbortStatus(status),
                msg_id if msg_id is not None else (None if mid is None else self.tag(ep, mid)),
            )
            if ABORT_RANK[result.status] < ABORT_RANK[best.status]:
                best = result
            if best.status is AbortStatus.ABORTED:
                break
        return best

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        if not isinstance(msg_id, str):
            return None
        for ep, raw in self._route(msg_id):
            v = self._call(ep, "query", {"id": raw})
            if v is not None:
                return dataclasses.replace(V.decode_view(v), msg_id=msg_id)
        return None

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending` (merged over endpoints, by due time)."""
        views: list[MessageView] = []
        for ep in self.endpoints:
            got = self._call(
                ep, "pending", {"topic": topic, "start": start_ms, "end": end_ms, "limit": limit}
            )
            prefix = f"{ep.node}:" if self.multi else ""
            views.extend(V.decode_view(v, prefix) for v in got)
        return merge_pending(views, limit, self.multi)

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats` (summed over endpoints)."""
        return merge_stats([self._call(ep, "stats", {}) for ep in self.endpoints])

    def _consumer(self, group: str, names: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer` (one member per endpoint; the limits
        apply per endpoint)."""
        options = {
            "group": group,
            "topics": list(names),
            "invisible_ms": limits.invisible_ms,
            "max_attempts": limits.max_attempts,
            "max_inflight": limits.max_inflight,
            "max_inflight_bytes": limits.max_inflight_bytes,
        }
        consumer = RemoteConsumer(self, options)
        with self._lock:
            self._consumers.add(consumer)
        return consumer

    def forget_consumer(self, consumer: Consumer) -> None:
        """A consumer of this broker closed."""
        with self._lock:
            self._consumers.discard(consumer)

    def _before_close(self) -> None:
        """Complete async sends and close this broker's consumers while still open."""
        self._callbacks.flush(10.0)
        with self._lock:
            consumers = list(self._consumers)
        for c in consumers:
            try:
                c.close()
            except Exception:
                log.warning("closing a consumer failed", exc_info=True)

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        self._callbacks.close()
        for ep in self.endpoints:
            ep.drop()
