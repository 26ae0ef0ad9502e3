"""RemoteBroker: the ``BrokerAdapter`` of ``chronoq://host:port[,host2:port2]?token=...``.

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
ids are the server's own. Consumers: :mod:`~broker_adapter.server.consumer`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from broker_adapter.base import (
    DEFAULT_INVISIBLE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INFLIGHT_BYTES,
    BrokerAdapter,
    Consumer,
    SendCallback,
    check_abort_args,
    check_pending_limit,
)
from broker_adapter.errors import (
    BrokerClosed,
    ConnectionFailed,
    InvalidArgument,
    MessageTooLarge,
)
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    GroupStats,
    MessageView,
    SendResult,
    TopicStats,
)
from broker_adapter.server import protocol as P
from broker_adapter.server.endpoint import (
    CallbackRunner,
    Endpoint,
    parse_endpoints,
    url_options,
)
from broker_adapter.server.fault import FaultTolerance
from broker_adapter.server.link import RequestTimeout
from broker_adapter.urls import split_url

log = logging.getLogger("chronoq.broker_adapter.RemoteBroker")
log.addHandler(logging.NullHandler())

DEFAULT_SEND_TIMEOUT_MS = 3_000
DEFAULT_RETRIES = 2
#: Bound on answers to requests other than sends and long polls.
REQUEST_TIMEOUT_S = 30.0
_ABORT_RANK = {AbortStatus.ABORTED: 0, AbortStatus.ALREADY_DELIVERED: 1, AbortStatus.NOT_FOUND: 2}


class RemoteBroker(BrokerAdapter):
    """A client of one or more broker servers.

    :param endpoints: ``"h1:p1,h2:p2"`` or a sequence of ``(host, port)``.
    :param token: the servers' token (default none).
    :param send_timeout_ms: bound on a sync send, retries included.
    :param retries: extra attempts of a sync send after a connection failure.
    :param connect_timeout_s: bound on connecting to one endpoint.
    """

    def __init__(
        self,
        endpoints: str | Sequence[tuple[str, int]],
        *,
        token: str | None = None,
        send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS,
        retries: int = DEFAULT_RETRIES,
        connect_timeout_s: float = 3.0,
    ) -> None:
        if (
            isinstance(send_timeout_ms, bool)
            or not isinstance(send_timeout_ms, int)
            or send_timeout_ms < 1
        ):
            raise InvalidArgument(f"send_timeout_ms must be an int >= 1, got {send_timeout_ms!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgument(f"retries must be an int >= 0, got {retries!r}")
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
        self._closed = False
        self._consumers: set[Consumer] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RemoteBroker:
        """Open ``chronoq://h1:p1[,h2:p2]?token=T&send_timeout_ms=3000&retries=2``."""
        _scheme, rest, params = split_url(url)
        opts = url_options(params)
        opts.update(kwargs)
        return cls(rest.rstrip("/"), **opts)

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerClosed("this RemoteBroker is closed")

    # -- ids -----------------------------------------------------------------------------

    def tag(self, ep: Endpoint, msg_id: str) -> str:
        """The id callers see for ``msg_id`` of endpoint ``ep``."""
        return f"{ep.node}:{msg_id}" if self.multi else msg_id

    def _route(self, msg_id: str) -> list[tuple[Endpoint, str]]:
        """Where to look for ``msg_id``: ``(endpoint, server id)`` pairs."""
        node, sep, raw = msg_id.partition(":")
        if sep and len(node) == 8:
            for ep in self.endpoints:
                if ep.known_node(self._check_open) == node:
                    return [(ep, raw)]
            if not self.multi:
                return []
        return [(ep, msg_id) for ep in self.endpoints]

    # -- sending ---------------------------------------------------------------------------

    def _target(self, messages: Sequence[Message]) -> int | None:
        """The fixed endpoint of keyed messages, or ``None`` for round-robin."""
        if not self.multi:
            return 0
        for m in messages:
            if m.key is not None:
                return self._key_index(m.topic, m.key)
        return None

    def _key_index(self, topic: str, key: str) -> int:
        """The endpoint that owns ``key`` on ``topic``."""
        data = f"{topic}\x00{key}".encode("utf-8", "surrogatepass")
        return zlib.crc32(data) % len(self.endpoints)

    def _check_messages(self, messages: Sequence[Message]) -> None:
        for m in messages:
            if not isinstance(m, Message):
                raise InvalidArgument(f"send takes Message objects, got {type(m).__name__}")

    def _send_sync(self, messages: Sequence[Message], op: str, args: dict[str, Any]) -> Any:
        """Run a send with the timeout, retries and fault avoidance of sync sends."""
        self._check_open()
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
                link = ep.link(self._check_open)
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

    def send(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send`."""
        self._check_messages((message,))
        ep, r = self._send_sync((message,), "send", {"m": P.encode_message(message)})
        result = P.decode_result(r)
        return result._replace(msg_id=self.tag(ep, result.msg_id)) if self.multi else result

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch` (one endpoint, one round trip)."""
        self._check_messages(messages)
        if not messages:
            self._check_open()
            return []
        encode = P.encode_message
        ep, rs = self._send_sync(messages, "send_batch", {"ms": [encode(m) for m in messages]})
        return P.decode_results(rs, f"{ep.node}:" if self.multi else "")

    def _submit_send(
        self, message: Message, done: Callable[[Endpoint | None, Any, BaseException | None], None]
    ) -> None:
        """Start an async or one-way send; ``done(endpoint, wire result, error)``."""
        self._check_open()
        self._check_messages((message,))
        fixed = self._target((message,))
        index = fixed if fixed is not None else self.fault.pick()
        ep = self.endpoints[index]
        try:
            link = ep.link(self._check_open)
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
            link.submit("send", {"m": P.encode_message(message)}, lambda r, e: done(ep, r, e))
        except ConnectionFailed as e:
            ep.drop()
            done(None, None, e)
        except BaseException:  # refused before it was sent: nothing will complete
            self._callbacks.end()
            raise

    def send_async(self, message: Message, callback: SendCallback) -> None:
        """See :meth:`BrokerAdapter.send_async` (not retried)."""

        def done(ep: Endpoint | None, r: Any, error: BaseException | None) -> None:
            result = None
            if error is None and ep is not None:
                result = P.decode_result(r)
                if self.multi:
                    result = result._replace(msg_id=self.tag(ep, result.msg_id))
            self._callbacks.run(callback, result, error)

        self._submit_send(message, done)

    def send_oneway(self, message: Message) -> None:
        """See :meth:`BrokerAdapter.send_oneway` (not retried; errors are logged)."""

        def done(ep: Endpoint | None, r: Any, error: BaseException | None) -> None:
            if error is not None:
                log.warning("one-way send to topic %s failed: %s", message.topic, error)
            self._callbacks.end()

        try:
            self._submit_send(message, done)
        except (InvalidArgument, MessageTooLarge) as e:
            log.warning("one-way send refused: %s", e)

    def flush(self, timeout_s: float = 10.0) -> None:
        """See :meth:`BrokerAdapter.flush`."""
        self._check_open()
        self._callbacks.flush(timeout_s)

    # -- aborting and reading ---------------------------------------------------------------

    def _call(
        self, ep: Endpoint, op: str, args: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> Any:
        try:
            return ep.link(self._check_open).call(op, args, timeout_s)
        except ConnectionFailed:
            ep.drop()
            raise

    def abort(
        self, msg_id: str | None = None, *, key: str | None = None, topic: str | None = None
    ) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        check_abort_args(msg_id, key, topic)
        self._check_open()
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
            if _ABORT_RANK[result.status] < _ABORT_RANK[best.status]:
                best = result
            if best.status is AbortStatus.ABORTED:
                break
        return best

    def query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        self._check_open()
        if not isinstance(msg_id, str):
            return None
        for ep, raw in self._route(msg_id):
            v = self._call(ep, "query", {"id": raw})
            if v is not None:
                return dataclasses.replace(P.decode_view(v), msg_id=msg_id)
        return None

    def pending(
        self,
        topic: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending` (merged over endpoints, by due time)."""
        check_pending_limit(limit)
        self._check_open()
        views: list[MessageView] = []
        for ep in self.endpoints:
            got = self._call(
                ep, "pending", {"topic": topic, "start": start_ms, "end": end_ms, "limit": limit}
            )
            prefix = f"{ep.node}:" if self.multi else ""
            views.extend(P.decode_view(v, prefix) for v in got)
        if self.multi:
            views.sort(key=lambda v: v.deliver_at_ms)
        return views[:limit]

    def stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats` (summed over endpoints)."""
        self._check_open()
        topics: dict[str, list[int]] = {}
        groups: dict[str, list[int]] = {}
        for ep in self.endpoints:
            s = self._call(ep, "stats", {})
            for into, part in ((topics, s["topics"]), (groups, s["groups"])):
                for name, values in part.items():
                    acc = into.setdefault(name, [0, 0, 0, 0])
                    for i, v in enumerate(values):
                        acc[i] += v
        return BrokerStats(
            topics={n: TopicStats(*v) for n, v in topics.items()},
            groups={n: GroupStats(*v) for n, v in groups.items()},
        )

    def consumer(
        self,
        group: str,
        topics: Iterable[str],
        *,
        invisible_ms: int = DEFAULT_INVISIBLE_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    ) -> Consumer:
        """See :meth:`BrokerAdapter.consumer` (one member per endpoint; the limits
        apply per endpoint)."""
        from broker_adapter.server.consumer import RemoteConsumer

        self._check_open()
        options = {
            "group": group,
            "topics": list(topics),
            "invisible_ms": invisible_ms,
            "max_attempts": max_attempts,
            "max_inflight": max_inflight,
            "max_inflight_bytes": max_inflight_bytes,
        }
        consumer = RemoteConsumer(self, options)
        with self._lock:
            self._consumers.add(consumer)
        return consumer

    def forget_consumer(self, consumer: Consumer) -> None:
        """A consumer of this broker closed."""
        with self._lock:
            self._consumers.discard(consumer)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        if self._closed:
            return
        try:
            self._callbacks.flush(10.0)
            with self._lock:
                consumers = list(self._consumers)
            for c in consumers:
                try:
                    c.close()
                except Exception:
                    log.warning("closing a consumer failed", exc_info=True)
        finally:
            self._closed = True
            self._callbacks.close()
            for ep in self.endpoints:
                ep.drop()
