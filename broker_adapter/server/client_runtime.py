"""The runtime calls of :class:`~broker_adapter.server.client.RemoteBroker`: reschedule,
prefix abort, find, rate limits and slots, each one request (or one per endpoint).

Routing with several endpoints (:mod:`~broker_adapter.server.routing`): a reschedule
goes where its id's node or its ``(topic, key)`` points, as an abort does; a prefix
abort asks every endpoint (keys under one prefix hash to all of them) and sums the
answers; ``find_pending`` walks every endpoint's pages in one due order
(:mod:`~broker_adapter.server.find_merge`); a rate bucket or a semaphore lives on the
one endpoint its name hashes to (so every client shares it; while that endpoint is
down the call fails with :class:`~broker_adapter.errors.ConnectionFailed`). A topic
unknown to some endpoints is unknown only if no endpoint knows it.

A server that predates these calls is never sent one: the call raises
:class:`~broker_adapter.server.session.ServerTooOld`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from broker_adapter.checks import NewDue
from broker_adapter.errors import ConnectionFailed
from broker_adapter.results import PendingPage, PrefixAbortResult, RescheduleResult
from broker_adapter.server import runtime_requests as RQ
from broker_adapter.server.link import REQUEST_TIMEOUT_S
from broker_adapter.server.routing import RATE_SPACE, SLOT_SPACE, key_index
from broker_adapter.server.runtime_requests import (
    ABORT_PREFIX_TIMEOUT_S,
    find_args,
    reschedule_args,
)

if TYPE_CHECKING:
    from broker_adapter.server.endpoint import Endpoint

R = TypeVar("R")


class RemoteRuntimeCalls:
    """The runtime primitives of ``RemoteBroker`` (a mixin of it: it uses the client's
    endpoints, id routing and connection handling). What each call sends and how it
    reads the replies is :mod:`~broker_adapter.server.runtime_requests`."""

    endpoints: list[Endpoint]
    multi: bool

    if TYPE_CHECKING:

        def check_open(self) -> None: ...

        def tag(self, ep: Endpoint, msg_id: str) -> str: ...

        def _route(self, msg_id: str) -> list[tuple[Endpoint, str]]: ...

    def _runtime(
        self, ep: Endpoint, op: str, args: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> Any:
        """One runtime request to ``ep``, refused before sending if its server is too old.

        :raises ServerTooOld: when the server does not know ``op``.
        :raises ConnectionFailed: when the link breaks (it is dropped) or times out.
        """
        link = ep.link(self.check_open)
        link.hello.require(op, ep.address)
        try:
            return link.call(op, args, timeout_s)
        except ConnectionFailed:
            ep.drop()
            raise

    def _request(self, request: RQ.Request[Endpoint]) -> Any:
        """Send one request of :mod:`runtime_requests` (its body checked first).

        :raises MessageTooLarge: when its body exceeds the link's ``max_body``.
        """
        if request.body_len is not None:
            RQ.check_body(request, request.ep.link(self.check_open).max_body)
        timeout_s = REQUEST_TIMEOUT_S if request.timeout_s is None else request.timeout_s
        return self._runtime(request.ep, request.op, request.args, timeout_s)

    def _drive(self, steps: RQ.Steps[Endpoint, R]) -> R:
        """Run a call of :mod:`runtime_requests` to its result, one request at a time."""
        run = RQ.Run(steps)
        while run.request is not None:
            run.call(self._request)
        return run.result

    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule`."""
        if msg_id is not None:
            targets = self._route(msg_id) if isinstance(msg_id, str) else []
        else:
            index = key_index(str(topic), str(key), len(self.endpoints))
            targets = [(self.endpoints[index], "")]
        return self._drive(RQ.reschedule(targets, msg_id, key, topic, due, body, self.tag))

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix` (every endpoint, answers summed)."""
        return self._drive(RQ.abort_prefix(self.endpoints, topic, key_prefix))

    def _find_pending(
        self,
        topic: str | None,
        key_prefix: str | None,
        tag: str | None,
        start_ms: int | None,
        end_ms: int | None,
        limit: int,
        cursor: str | None,
        with_body: bool,
    ) -> PendingPage:
        """See :meth:`BrokerAdapter.find_pending` (one due order over every endpoint)."""
        args = find_args(topic, key_prefix, tag, start_ms, end_ms, limit, with_body)
        return self._drive(RQ.find_pending(self.endpoints, self.multi, args, limit, cursor))

    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """See :meth:`BrokerAdapter.acquire_rate` (on the endpoint the bucket hashes to)."""
        ep = self.endpoints[key_index(RATE_SPACE, bucket, len(self.endpoints))]
        args = {"bucket": bucket, "limit": limit, "period": period_ms}
        return int(self._runtime(ep, "acquire_rate", args))

    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """See :meth:`BrokerAdapter.acquire_slot` (on the endpoint the name hashes to)."""
        ep = self.endpoints[key_index(SLOT_SPACE, name, len(self.endpoints))]
        args = {"name": name, "limit": limit, "holder": holder, "lease": lease_ms}
        return bool(self._runtime(ep, "acquire_slot", args))

    def _release_slot(self, name: str, holder: str) -> bool:
        """See :meth:`BrokerAdapter.release_slot`."""
        ep = self.endpoints[key_index(SLOT_SPACE, name, len(self.endpoints))]
        return bool(self._runtime(ep, "release_slot", {"name": name, "holder": holder}))


__all__ = [
    "ABORT_PREFIX_TIMEOUT_S",
    "RemoteRuntimeCalls",
    "find_args",
    "reschedule_args",
]
