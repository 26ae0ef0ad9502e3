"""The runtime and dead-letter calls of :class:`~broker_adapter.server.async_client.AsyncRemoteBroker`.

Every call here is a request a server that predates it is never sent (the call
raises :class:`~broker_adapter.server.session.ServerTooOld`), so each goes through
one gate, ``_runtime``. They route and merge as the sync client's do
(what each call sends and how it reads the replies is
:mod:`~broker_adapter.server.runtime_requests`, shared with the sync client): a reschedule goes where its id's node or its ``(topic, key)`` points;
``abort_prefix`` and ``count_pending`` ask every endpoint and add up the answers;
``find_pending`` and ``dead_letters`` walk every endpoint's pages in one order
(:mod:`~broker_adapter.server.find_merge`); ``requeue_dead``/``purge_dead`` send
each id to the endpoint its ``NODE:`` names. ``abort_prefix`` may take up to
:data:`~broker_adapter.server.runtime_requests.ABORT_PREFIX_TIMEOUT_S`; the others
wait at most the client's ``request_timeout_s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from broker_adapter.checks import NewDue
from broker_adapter.errors import UnknownTopic
from broker_adapter.results import (
    DeadLetterPage,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
)
from broker_adapter.server import runtime_requests as RQ
from broker_adapter.server.routing import key_index

if TYPE_CHECKING:
    from broker_adapter.server.async_endpoint import AsyncEndpoint

R = TypeVar("R")


class AsyncRemoteRuntimeCalls:
    """The runtime and dead-letter primitives of ``AsyncRemoteBroker`` (a mixin of it:
    it uses the client's endpoints, id routing and connection handling)."""

    endpoints: list[AsyncEndpoint]
    multi: bool
    request_timeout_s: float

    if TYPE_CHECKING:

        def check_open(self) -> None: ...

        def tag(self, ep: AsyncEndpoint, msg_id: str) -> str: ...

        async def _route(self, msg_id: str) -> list[tuple[AsyncEndpoint, str]]: ...

    async def _runtime(
        self, ep: AsyncEndpoint, op: str, args: dict[str, Any], timeout_s: float | None = None
    ) -> Any:
        """One runtime request to ``ep``, refused before sending if its server is too old.

        :raises ServerTooOld: when the server does not know ``op``.
        """
        link = await ep.link(self.check_open)
        link.hello.require(op, ep.address)
        return await link.call(op, args, timeout_s or self.request_timeout_s)

    async def _drive(self, steps: RQ.Steps[AsyncEndpoint, R]) -> R:
        """Run a call of :mod:`runtime_requests` to its result, one request at a time
        (a body is checked against the link's ``max_body`` before it goes out).

        :raises MessageTooLarge: when a body exceeds the link's ``max_body``.
        """
        run = RQ.Run(steps)
        while (request := run.request) is not None:
            try:
                if request.body_len is not None:
                    RQ.check_body(request, (await request.ep.link(self.check_open)).max_body)
                answer = await self._runtime(
                    request.ep, request.op, request.args, request.timeout_s
                )
            except UnknownTopic as e:  # the one error a call may absorb
                run.fail(e)
            else:
                run.reply(answer)
        return run.result

    async def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule` (routed as ``abort`` is)."""
        if msg_id is not None:
            targets = await self._route(msg_id) if isinstance(msg_id, str) else []
        else:
            index = key_index(str(topic), str(key), len(self.endpoints))
            targets = [(self.endpoints[index], "")]
        return await self._drive(RQ.reschedule(targets, msg_id, key, topic, due, body, self.tag))

    async def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix` (every endpoint, answers summed)."""
        return await self._drive(RQ.abort_prefix(self.endpoints, topic, key_prefix))

    async def _find_pending(
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
        args = RQ.find_args(topic, key_prefix, tag, start_ms, end_ms, limit, with_body)
        return await self._drive(RQ.find_pending(self.endpoints, self.multi, args, limit, cursor))

    async def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` (one order of death over every endpoint)."""
        steps = RQ.dead_letters(self.endpoints, self.multi, group, cursor, limit, with_body)
        return await self._drive(steps)

    async def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""
        return await self._settle_dead("requeue_dead", group, msg_ids, limit)

    async def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return await self._settle_dead("purge_dead", group, msg_ids, limit)

    async def _settle_dead(
        self, op: str, group: str, msg_ids: tuple[str, ...] | None, limit: int
    ) -> int:
        routes = None if msg_ids is None else [await self._route(i) for i in msg_ids]
        plan = None if routes is None else RQ.ids_by_endpoint(routes)
        return await self._drive(RQ.settle_dead(self.endpoints, op, group, plan, limit))

    async def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` (every endpoint's counts added up)."""
        return await self._drive(RQ.count_pending(self.endpoints, edges, topic))


__all__ = ["AsyncRemoteRuntimeCalls"]
