"""The runtime and dead-letter calls of :class:`~broker_adapter.server.async_client.AsyncRemoteBroker`.

Every call here is a request a server that predates it is never sent (the call
raises :class:`~broker_adapter.server.session.ServerTooOld`), so each goes through
one gate, ``_runtime``. They route and merge as the sync client's do
(:mod:`~broker_adapter.server.client_runtime`,
:mod:`~broker_adapter.server.client_dead_letters`, whose helpers without I/O they
share): a reschedule goes where its id's node or its ``(topic, key)`` points;
``abort_prefix`` and ``count_pending`` ask every endpoint and add up the answers;
``find_pending`` and ``dead_letters`` walk every endpoint's pages in one order
(:mod:`~broker_adapter.server.find_merge`); ``requeue_dead``/``purge_dead`` send
each id to the endpoint its ``NODE:`` names. ``abort_prefix`` may take up to
:data:`~broker_adapter.server.client_runtime.ABORT_PREFIX_TIMEOUT_S`; the others
wait at most the client's ``request_timeout_s``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from broker_adapter.checks import NewDue
from broker_adapter.errors import MessageTooLarge, UnknownTopic
from broker_adapter.results import (
    DeadLetterPage,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)
from broker_adapter.server import find_merge
from broker_adapter.server import values as V
from broker_adapter.server.client_dead_letters import (
    as_pending,
    dead_args,
    ids_by_endpoint,
    merge_counts,
)
from broker_adapter.server.client_runtime import ABORT_PREFIX_TIMEOUT_S, find_args, reschedule_args
from broker_adapter.server.routing import RESCHEDULE_RANK, key_index, merge_prefix_aborts

if TYPE_CHECKING:
    from broker_adapter.server.async_endpoint import AsyncEndpoint


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
        timing = reschedule_args(due, body)
        best = RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)
        for ep, raw in targets:
            if body is not None:
                limit = (await ep.link(self.check_open)).max_body
                if len(body) > limit:
                    raise MessageTooLarge(len(body), limit)
            where = {"id": raw} if msg_id is not None else {"key": key, "topic": topic}
            answer = await self._runtime(ep, "reschedule", {**where, **timing})
            result = V.decode_reschedule(answer)
            if msg_id is not None:
                result = dataclasses.replace(result, msg_id=msg_id)
            elif result.msg_id is not None:
                result = dataclasses.replace(result, msg_id=self.tag(ep, result.msg_id))
            if RESCHEDULE_RANK[result.status] < RESCHEDULE_RANK[best.status]:
                best = result
            if best.status is RescheduleStatus.RESCHEDULED:
                break
        return best

    async def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix` (every endpoint, answers summed)."""
        answers = []
        unknown: UnknownTopic | None = None
        args = {"topic": topic, "prefix": key_prefix}
        for ep in self.endpoints:
            try:
                answer = await self._runtime(ep, "abort_prefix", args, ABORT_PREFIX_TIMEOUT_S)
            except UnknownTopic as e:
                unknown = e
                continue
            answers.append(V.decode_prefix_abort(answer))
        if not answers and unknown is not None:
            raise unknown
        return merge_prefix_aborts(answers)

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
        args = find_args(topic, key_prefix, tag, start_ms, end_ms, limit, with_body)
        if not self.multi:
            answer = await self._runtime(
                self.endpoints[0], "find_pending", {**args, "cursor": cursor}
            )
            return V.decode_page(answer)
        walks = find_merge.decode_cursor(cursor, len(self.endpoints))
        pages: dict[int, PendingPage | None] = {}
        unknown: UnknownTopic | None = None
        for i, walk in enumerate(walks):
            if walk.done:
                continue
            try:
                answer = await self._runtime(
                    self.endpoints[i], "find_pending", {**args, "cursor": walk.cursor}
                )
            except UnknownTopic as e:
                unknown, pages[i] = e, None
                continue
            pages[i] = V.decode_page(answer)
        if unknown is not None and cursor is None and all(p is None for p in pages.values()):
            raise unknown
        takes = find_merge.plan(pages, limit)
        fetched = {}
        for i, (take, at) in find_merge.refetches(walks, pages, takes).items():
            again = {**args, "limit": take, "cursor": at}  # just what goes out
            answer = await self._runtime(self.endpoints[i], "find_pending", again)
            fetched[i] = V.decode_page(answer)
        prefixes = [f"{ep.node}:" for ep in self.endpoints]
        views, walks = find_merge.finish(walks, pages, takes, fetched, prefixes)
        return PendingPage(views, find_merge.encode_cursor(walks))

    async def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` (routed as the sync client's:
        :mod:`~broker_adapter.server.client_dead_letters`)."""
        args = dead_args(group, limit, with_body)
        if not self.multi:
            answer = await self._runtime(
                self.endpoints[0], "dead_letters", {**args, "cursor": cursor}
            )
            return V.decode_dead_page(answer)
        walks = find_merge.decode_cursor(cursor, len(self.endpoints))
        pages: dict[int, PendingPage | None] = {}
        for i, walk in enumerate(walks):
            if not walk.done:
                answer = await self._runtime(
                    self.endpoints[i], "dead_letters", {**args, "cursor": walk.cursor}
                )
                pages[i] = as_pending(V.decode_dead_page(answer))
        takes = find_merge.plan(pages, limit)
        fetched = {}
        for i, (take, at) in find_merge.refetches(walks, pages, takes).items():
            again = {**args, "limit": take, "cursor": at}  # just what goes out
            answer = await self._runtime(self.endpoints[i], "dead_letters", again)
            fetched[i] = as_pending(V.decode_dead_page(answer))
        prefixes = [f"{ep.node}:" for ep in self.endpoints]
        views, walks = find_merge.finish(walks, pages, takes, fetched, prefixes)
        return DeadLetterPage(views, find_merge.encode_cursor(walks))

    async def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""
        return await self._settle_dead("requeue_dead", group, msg_ids, limit)

    async def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return await self._settle_dead("purge_dead", group, msg_ids, limit)

    async def _settle_dead(
        self, op: str, group: str, msg_ids: tuple[str, ...] | None, limit: int
    ) -> int:
        if msg_ids is not None:
            plan = ids_by_endpoint([await self._route(i) for i in msg_ids])
            done = 0
            for ep, raw in plan:
                done += int(
                    await self._runtime(ep, op, {"group": group, "ids": raw, "limit": limit})
                )
            return done
        done = 0
        for ep in self.endpoints:
            if done >= limit:
                break
            args = {"group": group, "ids": None, "limit": limit - done}
            done += int(await self._runtime(ep, op, args))
        return done

    async def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` (every endpoint's counts added up)."""
        args = {"edges": list(edges), "topic": topic}
        answers = [
            V.decode_counts(await self._runtime(ep, "count_pending", args)) for ep in self.endpoints
        ]
        return merge_counts(answers)


__all__ = ["AsyncRemoteRuntimeCalls"]
