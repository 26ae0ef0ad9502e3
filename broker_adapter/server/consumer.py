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

An ack of a message this consumer pulled on the link still up, well within its
invisible time (:data:`ACK_MARGIN_S` to spare, by the time the pull was sent),
is answered ``True`` here and written without waiting
(:meth:`~broker_adapter.server.link.Link.ack_later`: batched, and always before
the next request on the link), as the Redis adapter does: a round trip and two
thread wake-ups less per job. Anything else (a second ack, a server on a manual
clock, a message near its invisible time) asks the server and waits.
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
from broker_adapter.server.stage_log import stage_log

if TYPE_CHECKING:
    from broker_adapter.server.client import RemoteBroker
    from broker_adapter.server.endpoint import Endpoint

POLL_SLICE_MS = 20_000
#: An ack is answered locally only this long (s) before the message's invisible time ends.
ACK_MARGIN_S = 1.0
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
        self._stages = stage_log()  # None unless a benchmark turned it on
        # receipt -> monotonic time until which an ack may be answered here (see above)
        self._held: dict[bytes, float] = {}
        self._hold_s = options["invisible_ms"] / 1000 - ACK_MARGIN_S
        self._manual: set[int] = set()  # endpoints on a manual clock (test servers)
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
        self._forget_held(ep.index)  # pulled on an older link: their acks ask the server
        if link.info.get("manual_clock"):  # its time is not ours: acks always ask it
            self._manual.add(ep.index)
        return link, cid

    def _forget_held(self, index: int) -> None:
        held = self._held
        for receipt in list(held):  # list() first: other threads pop meanwhile
            if receipt[0] == index:
                held.pop(receipt, None)

    def _call(
        self, ep: Endpoint, op: str, args: dict[str, Any], timeout_s: float, timed: bool = False
    ) -> Any:
        """``op`` on this consumer's member at ``ep`` (``timed``: :meth:`Link.call_timed`);
        ``args`` (a dict of the caller's own) gets the member's ``cid``.

        :raises ConnectionFailed: when the link broke or the server lost the member.
        """
        link, cid = self._member(ep)
        args["cid"] = cid
        try:
            if timed:
                return link.call_timed(op, args, timeout_s)
            return link.call(op, args, timeout_s)
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
        args = {"max": max_messages, "wait": wait_ms}
        timeout_s = wait_ms / 1000 + REQUEST_TIMEOUT_S
        until = time.monotonic() + self._hold_s  # before the server could take them
        stages = self._stages
        if stages is None:
            rows = self._call(ep, "pull", args, timeout_s)
        else:
            rows, read_at, by_caller = self._call(ep, "pull", args, timeout_s, timed=True)
            stages.read(read_at, by_caller, (r[0] for r in rows))
        prefix = bytes((ep.index,))
        id_prefix = f"{ep.node}:" if self._broker.multi else ""
        decode = V.decode_received
        got = [decode(r, prefix, id_prefix) for r in rows]
        if got and self._hold_s > 0 and ep.index not in self._manual:
            held = self._held
            for m in got:
                held[m.receipt] = until
        return got

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

    def _ack_here(self, message: ReceivedMessage) -> bool:
        """Ack ``message`` without waiting if this consumer holds it well within its
        invisible time on the link it came by; whether it did."""
        receipt = message.receipt
        until = self._held.pop(receipt, None)
        if until is None or time.monotonic() >= until:
            return False
        member = self._members.get(receipt[0])  # one dict read: atomic, no lock needed
        if member is None or not member[0].alive:
            return False
        member[0].ack_later(member[1], receipt[1:])
        return True

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        self._check()
        if self._ack_here(message):
            return True
        return self._settle("ack", message, {})

    def ack_batch(self, messages: Sequence[ReceivedMessage]) -> list[bool]:
        """See :meth:`broker_adapter.base.Consumer.ack_batch`: one request per endpoint
        for those not acked here."""
        self._check()
        out = [False] * len(messages)
        by_endpoint: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            if self._ack_here(m):
                out[i] = True
                continue
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
        self._held.pop(message.receipt, None)
        return self._settle(
            "nack", message, {"delay": delay_ms, "reason": None if reason is None else str(reason)}
        )

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        self._held.pop(message.receipt, None)
        return self._settle("dead_letter", message, {"reason": str(reason)})

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        until = time.monotonic() + invisible_ms / 1000 - ACK_MARGIN_S
        extended = self._settle("extend", message, {"invisible_ms": invisible_ms})
        if extended and message.receipt in self._held:
            self._held[message.receipt] = until
        return extended

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`."""
        check_release_delay(delay_ms)
        self._held.pop(message.receipt, None)
        return self._settle("release", message, {"delay": delay_ms})

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        self._held.clear()
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
