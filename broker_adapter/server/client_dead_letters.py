"""The dead-letter calls and pending counts of :class:`~broker_adapter.server.client.RemoteBroker`.

Routing with several endpoints (each server has its own dead letters and wheel):

* ``dead_letters`` walks every endpoint's pages in one order of death time with
  the pieces of ``find_pending``'s walk (:mod:`~broker_adapter.server.find_merge`:
  a dead letter's view is due at its death, so the same merge applies);
* ``requeue_dead``/``purge_dead`` with ids send each id to the endpoint its
  ``NODE:`` names (an id without one to every endpoint) and sum the answers;
  without ids they ask the endpoints in turn for what ``limit`` leaves;
* ``count_pending`` adds up every endpoint's counts (exact if all are).

What each call sends and how it reads the replies is
:mod:`~broker_adapter.server.runtime_requests` (shared with the asyncio client). A server that predates
these calls is sent nothing: the call raises
:class:`~broker_adapter.server.session.ServerTooOld`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from broker_adapter.results import DeadLetterPage, PendingCounts
from broker_adapter.server import runtime_requests as RQ
from broker_adapter.server.runtime_requests import (
    as_pending,
    dead_args,
    ids_by_endpoint,
    merge_counts,
)

if TYPE_CHECKING:
    from broker_adapter.server.endpoint import Endpoint

R = TypeVar("R")


class RemoteDeadLetterCalls:
    """The dead-letter primitives of ``RemoteBroker`` (a mixin of it: it uses the
    client's endpoints, id routing and runtime requests)."""

    endpoints: list[Endpoint]
    multi: bool

    if TYPE_CHECKING:

        def _route(self, msg_id: str) -> list[tuple[Endpoint, str]]: ...

        def _drive(self, steps: RQ.Steps[Endpoint, R]) -> R: ...

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` (one order of death over every endpoint)."""
        steps = RQ.dead_letters(self.endpoints, self.multi, group, cursor, limit, with_body)
        return self._drive(steps)

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""
        return self._settle("requeue_dead", group, msg_ids, limit)

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return self._settle("purge_dead", group, msg_ids, limit)

    def _settle(self, op: str, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        plan = None if msg_ids is None else ids_by_endpoint([self._route(i) for i in msg_ids])
        return self._drive(RQ.settle_dead(self.endpoints, op, group, plan, limit))

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` (every endpoint's counts added up)."""
        return self._drive(RQ.count_pending(self.endpoints, edges, topic))


__all__ = [
    "RemoteDeadLetterCalls",
    "as_pending",
    "dead_args",
    "ids_by_endpoint",
    "merge_counts",
]
