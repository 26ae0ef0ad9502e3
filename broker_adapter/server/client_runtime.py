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

import dataclasses
from typing import TYPE_CHECKING, Any

from broker_adapter.checks import NewDue
from broker_adapter.errors import ConnectionFailed, MessageTooLarge, UnknownTopic
from broker_adapter.results import (
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)
from broker_adapter.server import find_merge
from broker_adapter.server import values as V
from broker_adapter.server.link import REQUEST_TIMEOUT_S
from broker_adapter.server.routing import (
    RATE_SPACE,
    RESCHEDULE_RANK,
    SLOT_SPACE,
    key_index,
    merge_prefix_aborts,
)

if TYPE_CHECKING:
    from broker_adapter.server.endpoint import Endpoint

#: Bound on the answer to an ``abort_prefix``: it works through every matching key
#: (about 100,000 a second here), far longer than other requests may take.
ABORT_PREFIX_TIMEOUT_S = 600.0


def reschedule_args(due: NewDue, body: bytes | None) -> dict[str, Any]:
    """The timing and body arguments of a ``reschedule`` request."""
    args: dict[str, Any] = {"delay": due.delay_ms, "at": due.deliver_at_ms}
    if body is not None:
        args["body"] = body
    return args


def find_args(
    topic: str | None,
    key_prefix: str | None,
    tag: str | None,
    start_ms: int | None,
    end_ms: int | None,
    limit: int,
    with_body: bool,
) -> dict[str, Any]:
    """The arguments of a ``find_pending`` request but its cursor."""
    return {
        "topic": topic,
        "prefix": key_prefix,
        "tag": tag,
        "start": start_ms,
        "end": end_ms,
        "limit": limit,
        "body": with_body,
    }


class RemoteRuntimeCalls:
    """The runtime primitives of ``RemoteBroker`` (a mixin of it: it uses the client's
    endpoints, id routing and connection handling)."""

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
        timing = reschedule_args(due, body)
        best = RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)
        for ep, raw in targets:
            if body is not None:
                limit = ep.link(self.check_open).max_body
                if len(body) > limit:
                    raise MessageTooLarge(len(body), limit)
            where = {"id": raw} if msg_id is not None else {"key": key, "topic": topic}
            result = V.decode_reschedule(self._runtime(ep, "reschedule", {**where, **timing}))
            if msg_id is not None:
                result = dataclasses.replace(result, msg_id=msg_id)
            elif result.msg_id is not None:
                result = dataclasses.replace(result, msg_id=self.tag(ep, result.msg_id))
            if RESCHEDULE_RANK[result.status] < RESCHEDULE_RANK[best.status]:
                best = result
            if best.status is RescheduleStatus.RESCHEDULED:
                break
        return best

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix` (every endpoint, answers summed)."""
        answers = []
        unknown: UnknownTopic | None = None
        for ep in self.endpoints:
            try:
                answer = self._runtime(
                    ep,
                    "abort_prefix",
                    {"topic": topic, "prefix": key_prefix},
                    ABORT_PREFIX_TIMEOUT_S,
                )
            except UnknownTopic as e:
                unknown = e
                continue
            answers.append(V.decode_prefix_abort(answer))
        if not answers and unknown is not None:
            raise unknown
        return merge_prefix_aborts(answers)

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
        if not self.multi:
            return V.decode_page(
                self._runtime(self.endpoints[0], "find_pending", {**args, "cursor": cursor})
            )
        walks = find_merge.decode_cursor(cursor, len(self.endpoints))
        pages: dict[int, PendingPage | None] = {}
        unknown: UnknownTopic | None = None
        for i, walk in enumerate(walks):
            if walk.done:
                continue
            try:
                answer = self._runtime(
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
            answer = self._runtime(self.endpoints[i], "find_pending", again)
            fetched[i] = V.decode_page(answer)
        prefixes = [f"{ep.node}:" for ep in self.endpoints]
        views, walks = find_merge.finish(walks, pages, takes, fetched, prefixes)
        return PendingPage(views, find_merge.encode_cursor(walks))

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
