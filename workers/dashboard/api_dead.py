"""API routes of dead letters: per consumer group, list them (with their errors),
requeue or purge some or all.

"All" loops the broker's bounded ``requeue_dead``/``purge_dead`` calls until one
moves nothing, up to :data:`MAX_ROUNDS` calls, so one request stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, Query

from broker_adapter.errors import InvalidArgument
from broker_adapter.message import check_topic
from workers.dashboard.bodies import RequiredBody
from workers.dashboard.context import Dashboard
from workers.dashboard.views import message_doc

#: Messages per ``requeue_dead``/``purge_dead`` call.
CHUNK = 1000
#: Most calls of one "all" request (so at most ``CHUNK * MAX_ROUNDS`` messages).
MAX_ROUNDS = 100
#: Most message ids one request may name.
MAX_IDS = 1000


def _target(body: dict[str, Any]) -> tuple[str, list[str] | None]:
    """The group and the ids (``None``: all) of a requeue/purge body."""
    group = body.get("group")
    if not isinstance(group, str) or not group:
        raise InvalidArgument(f'"group" must be a consumer group name, got {group!r}')
    check_topic(group)
    ids = body.get("msg_ids")
    if body.get("all") is True:
        if ids is not None:
            raise InvalidArgument('give "msg_ids" or "all": true, not both')
        return group, None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument('give "msg_ids": a non-empty list of message ids, or "all": true')
    if len(ids) > MAX_IDS:
        raise InvalidArgument(f'"msg_ids" names {len(ids)} messages; give at most {MAX_IDS}')
    return group, list(dict.fromkeys(ids))


#: ``requeue_dead`` or ``purge_dead`` of a broker.
DeadCall = Callable[..., int]


def _repeat(call: DeadCall, group: str, ids: Sequence[str] | None) -> int:
    """``call(group, ids)`` once for ids, else until it moves nothing (bounded)."""
    if ids is not None:
        return call(group, ids, limit=max(len(ids), 1))
    total = 0
    for _ in range(MAX_ROUNDS):
        n = call(group, None, limit=CHUNK)
        total += n
        if n == 0:
            break
    return total


def routes(dash: Dashboard) -> APIRouter:
    """The dead-letter routes on ``dash``."""
    router = APIRouter(prefix="/api/dead", tags=["dead letters"])
    broker = dash.broker

    @router.get("")
    def dead(
        group: str | None = None,
        cursor: str | None = None,
        limit: int = Query(50, ge=1, le=500),
    ) -> dict[str, Any]:
        """The groups with their dead-letter counts; with ``group``, a page of its dead
        letters (oldest first), each with the error that killed it."""
        groups = [
            {"group": name, "dead": g.dead} for name, g in sorted(broker.stats().groups.items())
        ]
        if group is None:
            return {"groups": groups, "items": [], "cursor": None}
        check_topic(group)
        page = broker.dead_letters(group, cursor=cursor, limit=limit, with_body=True)
        return {
            "groups": groups,
            "items": [message_doc(v) for v in page.messages],
            "cursor": page.cursor,
        }

    @router.post("/requeue")
    def requeue(body: RequiredBody) -> dict[str, Any]:
        """Deliver dead letters to their group again (attempts start over)."""
        group, ids = _target(body)
        return {"requeued": _repeat(broker.requeue_dead, group, ids)}

    @router.post("/purge")
    def purge(body: RequiredBody) -> dict[str, Any]:
        """Delete dead letters for good."""
        group, ids = _target(body)
        return {"purged": _repeat(broker.purge_dead, group, ids)}

    return router


__all__ = ["CHUNK", "MAX_IDS", "MAX_ROUNDS", "routes"]
