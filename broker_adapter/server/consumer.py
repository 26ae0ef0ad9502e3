"""RemoteConsumer: a consumer-group member over the wire.

It opens one server-side member per endpoint. ``pull`` long-polls the server
(in slices of at most 20 s, so a dead server is noticed); with several endpoints
it first takes what any endpoint has ready, then long-polls them in turn in
short slices. A broken connection is reconnected with exponential backoff
(50 ms doubling to 2 s) and the member opened again; a pull gives up with
``ConnectionFailed`` only after ``max(wait_ms, 5 s)``. Acks, nacks and dead
letters go to the endpoint the message came from (the first receipt byte) and
are retried once after a reconnect: they are idempotent (a repeated ack answers
``False``). Messages held by a client that vanished come back after their
invisible time; :meth:`close` gives them back at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from broker_adapter.base import Consumer
from broker_adapter.checks import (
    check_invisible_ms,
    check_nack_delay,
    check_pull_args,
    check_release_delay,
)
from broker_adapter.errors import BrokerClosed, ConnectionFailed
from broker_adapter.results import ReceivedMessage
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V
from broker_adapter.server.link import REQUEST_TIMEOUT_S, Link

if TYPE_CHECKING:
    from broker_adapter.server.client import RemoteBroker
    from broker_adapter.server.endpoint import Endpoint

POLL_SLICE_MS = 20_000
MULTI_SLICE_MS = 50
RECONNECT_MIN_S = 5.0
BACKOFF_START_S, BACKOFF_MAX_S = 0.05, 2.0


class RemoteConsumer(Consumer):
    """A member of a consumer group of a :class:`RemoteBroker`.

    :param broker: the owning broker.
    :param options: the ``consumer_open`` args (group, topics and limits), checked by
        the adapter base.
    """

    def __init__(self, broker: RemoteBroker, options: dict[str, Any]) -> None:
        self._broker = broker
        self._options = options
        self.group = options["group"]
        self.topics = tuple(options["topics"])
        self._members: dict[int, tuple[Link, int]] = {}
        self._lock = threading.Lock()
        self._turn = 0
        self._down: dict[int, tuple[float, float]] = {}  # endpoint -> (down until, backoff)
        self.closed = False
        failure: ConnectionFailed | None = None
        for ep in broker.endpoints:
            try:
                self._member(ep)
            except ConnectionFailed as e:
                failure = e
                ep.drop()
        if failure is not None and not self._members:
            raise failure

    def _check(self) -> None:
        if self.closed:
            raise BrokerClosed(f"consumer of group {self.group!r} is closed")
        self._broker.check_open()

    def _member(self, ep: Endpoint) -> tuple[Link, int]:
        """The live link to ``ep`` and this consumer's id there (opened on demand)."""
        link = ep.link(self._check)
        with self._lock:
            member = self._members.get(ep.index)
            if member is not None and member[0] is link:
                return member
        cid = link.call("consumer_open", self._options, REQUEST_TIMEOUT_S)
        with self._lock:
            self._members[ep.index] = (link, cid)
        return link, cid

    def _call(self, ep: Endpoint, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        """``op`` on this consumer's member at ``ep``.

        :raises ConnectionFailed: when the link broke or the server lost the member.
        """
        link, cid = self._member(ep)
        try:
            return link.call(op, {**args, "cid": cid}, timeout_s)
        except BrokerClosed as e:  # the server closed (or forgot) our member
            self._check()
            with self._lock:
                self._members.pop(ep.index, None)
            raise ConnectionFailed(f"{ep.address}: {e}") from e
        except ConnectionFailed:
            with self._lock:
                self._members.pop(ep.index, None)
            ep.drop()
            raise

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`."""
        check_pull_args(max_messages, wait_ms)
        self._check()
        start = time.monotonic()
        deadline = start + wait_ms / 1000
        give_up = start + max(wait_ms / 1000, RECONNECT_MIN_S)
        backoff = BACKOFF_START_S
        endpoints = self._broker.endpoints
        n = len(endpoints)
        while True:
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                if n == 1:
                    got = self._pull_from(endpoints[0], max_messages, min(remaining, POLL_SLICE_MS))
                    if got or remaining <= POLL_SLICE_MS:
                        return got
                    continue
                got = self._pull_multi(max_messages, remaining)
                if got or remaining == 0:
                    return got
            except ConnectionFailed:
                self._check()
                now = time.monotonic()
                if now >= give_up:
                    raise
                time.sleep(min(backoff, give_up - now))
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _pull_multi(self, max_messages: int, remaining_ms: int) -> list[ReceivedMessage]:
        """One round over several endpoints: what any has ready, else a short long poll
        on the next. An endpoint that fails is skipped for a backoff while the others
        serve; :class:`ConnectionFailed` only when every endpoint is down."""
        endpoints = self._broker.endpoints
        n = len(endpoints)
        now = time.monotonic()
        live = [
            endpoints[(self._turn + i) % n]
            for i in range(n)
            if self._down.get((self._turn + i) % n, (0.0, 0.0))[0] <= now
        ]
        if not live:
            raise ConnectionFailed("no endpoint of this consumer can be reached")
        self._turn = (self._turn + 1) % n
        for wait in (0, min(remaining_ms, MULTI_SLICE_MS)):
            for ep in live if wait == 0 else live[:1]:
                try:
                    got = self._pull_from(ep, max_messages, wait)
                except ConnectionFailed:
                    backoff = min(
                        self._down.get(ep.index, (0.0, BACKOFF_START_S / 2))[1] * 2, BACKOFF_MAX_S
                    )
                    self._down[ep.index] = (time.monotonic() + backoff, backoff)
                    continue
                self._down.pop(ep.index, None)
                if got:
                    return got
            if remaining_ms == 0:
                break
        return []

    def _pull_from(self, ep: Endpoint, max_messages: int, wait_ms: int) -> list[ReceivedMessage]:
        rows = self._call(
            ep, "pull", {"max": max_messages, "wait": wait_ms}, wait_ms / 1000 + REQUEST_TIMEOUT_S
        )
        prefix = bytes((ep.index,))
        id_prefix = f"{ep.node}:" if self._broker.multi else ""
        decode = V.decode_received
        return [decode(r, prefix, id_prefix) for r in rows]

    def _endpoint_of(self, receipt: object) -> int | None:
        """The index of the endpoint a receipt came from (its first byte), or ``None``
        for a receipt that is not one of ours."""
        if (
            not isinstance(receipt, bytes)
            or len(receipt) < 2
            or receipt[0] >= len(self._broker.endpoints)
        ):
            return None
        return receipt[0]

    def _settle(self, op: str, message: ReceivedMessage, args: dict[str, Any]) -> bool:
        """Send ``ack``, ``nack``, ``extend``... to where ``message`` came from."""
        self._check()
        receipt = message.receipt
        index = self._endpoint_of(receipt)
        if index is None:
            return False
        ep = self._broker.endpoints[index]
        args = {**args, "receipt": receipt[1:]}
        try:
            return bool(self._call(ep, op, args, REQUEST_TIMEOUT_S))
        except ConnectionFailed:
            return bool(self._call(ep, op, args, REQUEST_TIMEOUT_S))  # once more, reconnected

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        return self._settle("ack", message, {})

    def ack_batch(self, messages: Sequence[ReceivedMessage]) -> list[bool]:
        """See :meth:`broker_adapter.base.Consumer.ack_batch`: one request per endpoint."""
        self._check()
        out = [False] * len(messages)
        by_endpoint: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            index = self._endpoint_of(m.receipt)
            if index is not None:
                by_endpoint.setdefault(index, []).append(i)
        for index, positions in by_endpoint.items():
            args = {"receipts": [messages[i].receipt[1:] for i in positions]}
            ep = self._broker.endpoints[index]
            try:
                acked = self._call(ep, "ack_batch", args, REQUEST_TIMEOUT_S)
            except ConnectionFailed:  # once more, reconnected
                acked = self._call(ep, "ack_batch", args, REQUEST_TIMEOUT_S)
            if type(acked) is not list or len(acked) != len(positions):
                raise P.ProtocolError("ack_batch answers one bool per receipt")
            for i, ok in zip(positions, acked, strict=True):
                out[i] = bool(ok)
        return out

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        check_nack_delay(delay_ms)
        return self._settle(
            "nack", message, {"delay": delay_ms, "reason": None if reason is None else str(reason)}
        )

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        return self._settle("dead_letter", message, {"reason": str(reason)})

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        return self._settle("extend", message, {"invisible_ms": invisible_ms})

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`."""
        check_release_delay(delay_ms)
        return self._settle("release", message, {"delay": delay_ms})

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        with self._lock:
            members, self._members = dict(self._members), {}
        for link, cid in members.values():
            if link.alive:
                try:
                    link.call("consumer_close", {"cid": cid}, REQUEST_TIMEOUT_S)
                except (ConnectionFailed, BrokerClosed):
                    pass  # gone with the connection: back after the invisible time
        self._broker.forget_consumer(self)

    def __repr__(self) -> str:
        return f"<RemoteConsumer group={self.group!r} topics={self.topics!r}>"
