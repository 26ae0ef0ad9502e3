"""The dead-letter calls and pending counts of :class:`~broker_adapter.server.client.RemoteBroker`.

Routing with several endpoints (each server has its own dead letters and wheel):

* ``dead_letters`` walks every endpoint's pages in one order of death time with
  the pieces of ``find_pending``'s walk (:mod:`~broker_adapter.server.find_merge`:
  a dead letter's view is due at its death, so the same merge applies);
* ``requeue_dead``/``purge_dead`` with ids send each id to the endpoint its
  ``NODE:`` names (an id without one to every endpoint) and sum the answers;
  without ids they ask the endpoints in turn for what ``limit`` leaves;
* ``count_pending`` adds up every endpoint's counts (exact if all are).

The helpers without I/O here serve the asyncio client too. A server that predates
these calls is sent nothing: the call raises
:class:`~broker_adapter.server.session.ServerTooOld`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from broker_adapter.results import DeadLetterPage, PendingCounts, PendingPage
from broker_adapter.server import find_merge
from broker_adapter.server import values as V

if TYPE_CHECKING:
    from broker_adapter.server.endpoint import Endpoint

E = TypeVar("E")


def dead_args(group: str, limit: int, with_body: bool) -> dict[str, Any]:
    """The arguments of a ``dead_letters`` request but its cursor."""
    return {"group": group, "limit": limit, "body": with_body}


def ids_by_endpoint(routes: list[list[tuple[E, str]]]) -> list[tuple[E, list[str]]]:
    """The server ids to send to each endpoint, given each id's routes (in order)."""
    out: dict[int, tuple[E, list[str]]] = {}
    for route in routes:
        for ep, raw in route:
            out.setdefault(id(ep), (ep, []))[1].append(raw)
    return list(out.values())


def merge_counts(answers: list[PendingCounts]) -> PendingCounts:
    """Several endpoints' counts as one: added up bucket by bucket."""
    counts = [sum(c) for c in zip(*(a.counts for a in answers), strict=True)]
    return PendingCounts(counts, all(a.exact for a in answers))


def as_pending(page: DeadLetterPage) -> PendingPage:
    """A dead-letter page in the shape :mod:`find_merge` walks (views due at death)."""
    return PendingPage(page.messages, page.cursor)


class RemoteDeadLetterCalls:
    """The dead-letter primitives of ``RemoteBroker`` (a mixin of it: it uses the
    client's endpoints, id routing and runtime requests)."""

    endpoints: list[Endpoint]
    multi: bool

    if TYPE_CHECKING:

        def _route(self, msg_id: str) -> list[tuple[Endpoint, str]]: ...

        def _runtime(
            self, ep: Endpoint, op: str, args: dict[str, Any], timeout_s: float = ...
        ) -> Any: ...

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` (one order of death over every endpoint)."""
        args = dead_args(group, limit, with_body)
        if not self.multi:
            answer = self._runtime(self.endpoints[0], "dead_letters", {**args, "cursor": cursor})
            return V.decode_dead_page(answer)
        walks = find_merge.decode_cursor(cursor, len(self.endpoints))
        pages: dict[int, PendingPage | None] = {}
        for i, walk in enumerate(walks):
            if not walk.done:
                answer = self._runtime(
                    self.endpoints[i], "dead_letters", {**args, "cursor": walk.cursor}
                )
                pages[i] = as_pending(V.decode_dead_page(answer))
        takes = find_merge.plan(pages, limit)
        fetched = {}
        for i, (take, at) in find_merge.refetches(walks, pages, takes).items():
            again = {**args, "limit": take, "cursor": at}  # just what goes out
            answer = self._runtime(self.endpoints[i], "dead_letters", again)
            fetched[i] = as_pending(V.decode_dead_page(answer))
        prefixes = [f"{ep.node}:" for ep in self.endpoints]
        views, walks = find_merge.finish(walks, pages, takes, fetched, prefixes)
        return DeadLetterPage(views, find_merge.encode_cursor(walks))

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""
        return self._settle("requeue_dead", group, msg_ids, limit)

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return self._settle("purge_dead", group, msg_ids, limit)

    def _settle(self, op: str, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        if msg_ids is not None:
            plan = ids_by_endpoint([self._route(i) for i in msg_ids])
            return sum(
                int(self._runtime(ep, op, {"group": group, "ids": raw, "limit": limit}))
                for ep, raw in plan
            )
        done = 0
        for ep in self.endpoints:
            if done >= limit:
                break
            done += int(self._runtime(ep, op, {"group": group, "ids": None, "limit": limit - done}))
        return done

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` (every endpoint's counts added up)."""
        args = {"edges": list(edges), "topic": topic}
        return merge_counts(
            [V.decode_counts(self._runtime(ep, "count_pending", args)) for ep in self.endpoints]
        )


__all__ = [
    "RemoteDeadLetterCalls",
    "as_pending",
    "dead_args",
    "ids_by_endpoint",
    "merge_counts",
]
