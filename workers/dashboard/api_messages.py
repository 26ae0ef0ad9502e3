"""API routes of messages: search, one message, and the actions on pending ones
(abort, reschedule, run now, cancel everything under a key prefix)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from broker_adapter.checks import check_key_prefix, is_int
from broker_adapter.errors import InvalidArgument, MessageNotFound, UnknownTopic
from broker_adapter.message import check_topic
from broker_adapter.results import MessageState, MessageView, PrefixAbortResult
from scheduler.app_pending import check_app_prefix
from scheduler.pending_runs import RunQuery
from scheduler.receipts import CancelAllResult
from workers.dashboard.bodies import OptionalBody, RequiredBody
from workers.dashboard.context import Dashboard
from workers.dashboard.search import (
    PAGE,
    broker_topics,
    find_body,
    find_key,
    search_page,
)
from workers.dashboard.views import message_doc

#: Most pending messages the cancel-prefix preview counts (more: ``exact`` is false).
PREVIEW_CAP = 10_000
#: ``find_pending`` page size of the preview count.
_COUNT_PAGE = 500

#: A POST body: a JSON object.
JsonObject = dict[str, Any]


def _doc_of(dash: Dashboard, view: MessageView) -> dict[str, Any]:
    """``Msg`` of ``view``, its body looked up when it is pending."""
    body = None
    if view.body is None and view.state is MessageState.PENDING:
        body = find_body(dash.broker, view)
    return message_doc(view, body)


def _str_field(body: JsonObject, name: str, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name!r} must be a non-empty string, got {value!r}")
    return value


def _prefix_topics(dash: Dashboard, body: JsonObject) -> tuple[str, list[str], bool]:
    """The checked ``key_prefix``, the topics to cover and whether one was named."""
    prefix = check_app_prefix(_str_field(body, "key_prefix"))
    topic = _str_field(body, "topic", required=False)
    if topic is not None:
        return prefix, [check_topic(topic)], True
    return prefix, broker_topics(dash.broker), False


def count_prefix(dash: Dashboard, prefix: str, topics: list[str], strict: bool) -> tuple[int, bool]:
    """How many pending messages are under ``prefix`` on ``topics`` (up to
    :data:`PREVIEW_CAP`), and whether that is all of them."""
    total = 0
    for topic in topics:
        cursor: str | None = None
        while True:
            try:
                page = dash.broker.find_pending(
                    topic, key_prefix=prefix, limit=_COUNT_PAGE, cursor=cursor
                )
            except UnknownTopic:
                if strict:
                    raise
                break
            total += len(page.messages)
            cursor = page.cursor
            if cursor is None:
                break
            if total >= PREVIEW_CAP:
                return PREVIEW_CAP, False
    return min(total, PREVIEW_CAP), total <= PREVIEW_CAP


def _due_args(body: JsonObject) -> tuple[int | None, int | None]:
    """``(deliver_at_ms, delay_ms)`` of a reschedule body: exactly one, an int >= 0."""
    given = {k: body[k] for k in ("at_ms", "delay_ms") if body.get(k) is not None}
    if len(given) != 1:
        raise InvalidArgument('give exactly one of "at_ms" (epoch ms) or "delay_ms" (>= 0)')
    name, value = next(iter(given.items()))
    if not is_int(value, minimum=0):
        raise InvalidArgument(f"{name!r} must be an integer >= 0, got {value!r}")
    return (value, None) if name == "at_ms" else (None, value)


def routes(dash: Dashboard) -> APIRouter:
    """The message routes on ``dash``."""
    router = APIRouter(prefix="/api", tags=["messages"])
    broker = dash.broker

    @router.get("/messages")
    def search(
        id: str | None = None,
        key: str | None = None,
        key_prefix: str | None = None,
        job: str | None = None,
        start: int | None = Query(None, ge=0),
        end: int | None = Query(None, ge=0),
        topic: str | None = None,
        cursor: str | None = None,
        limit: int = Query(50, ge=1, le=PAGE),
    ) -> dict[str, Any]:
        """Pending messages in due-time order by key prefix, job, due-time window
        and topic (paged); or one message by id, or the pending one with a key."""
        if topic is not None:
            check_topic(topic)
        if id is not None:
            view = broker.query(id)
            return {"items": [] if view is None else [_doc_of(dash, view)], "cursor": None}
        if key is not None:
            topics = [topic] if topic is not None else broker_topics(broker)
            return {
                "items": [_doc_of(dash, v) for v in find_key(broker, key, topics)],
                "cursor": None,
            }
        if key_prefix is not None:
            check_key_prefix(key_prefix)
        topics_q: tuple[str | None, ...]
        if topic is not None:
            topics_q = (topic,)
        elif key_prefix is not None:  # find_pending needs a topic with a prefix
            topics_q = tuple(broker_topics(broker))
        else:
            topics_q = (None,)
        query = RunQuery(topics_q, topic is not None, key_prefix, job, start, end)
        views, next_cursor = search_page(broker, query, limit, cursor)
        return {"items": [message_doc(v) for v in views], "cursor": next_cursor}

    @router.get("/messages/{msg_id}")
    def message(msg_id: str) -> dict[str, Any]:
        """One message in any state."""
        view = broker.query(msg_id)
        if view is None:
            raise MessageNotFound(f"no message {msg_id!r}: never sent, or gone after retention")
        return _doc_of(dash, view)

    @router.post("/messages/{msg_id}/abort")
    def abort(msg_id: str, body: OptionalBody = None) -> dict[str, Any]:
        """Abort a pending message: ``ABORTED``, ``ALREADY_DELIVERED`` or ``NOT_FOUND``."""
        res = broker.abort(msg_id)
        return {"status": res.status.value, "msg_id": res.msg_id}

    @router.post("/messages/{msg_id}/reschedule")
    def reschedule(msg_id: str, body: RequiredBody) -> dict[str, Any]:
        """Move a pending message to ``at_ms`` or ``delay_ms`` from now."""
        at_ms, delay_ms = _due_args(body)
        res = broker.reschedule(msg_id, deliver_at_ms=at_ms, delay_ms=delay_ms)
        return {
            "status": res.status.value,
            "msg_id": res.msg_id,
            "deliver_at_ms": res.deliver_at_ms,
        }

    @router.post("/messages/{msg_id}/run-now")
    def run_now(msg_id: str, body: OptionalBody = None) -> dict[str, Any]:
        """Make a pending message due now."""
        res = broker.reschedule(msg_id, delay_ms=0)
        return {
            "status": res.status.value,
            "msg_id": res.msg_id,
            "deliver_at_ms": res.deliver_at_ms,
        }

    @router.post("/cancel-prefix/preview")
    def cancel_preview(body: RequiredBody) -> dict[str, Any]:
        """How many pending messages a cancel of the prefix would abort (bounded)."""
        prefix, topics, strict = _prefix_topics(dash, body)
        count, exact = count_prefix(dash, prefix, topics, strict)
        return {"count": count, "exact": exact, "topics": topics}

    @router.post("/cancel-prefix")
    def cancel_prefix(body: RequiredBody) -> dict[str, Any]:
        """Abort every pending message under the prefix (in bounded atomic chunks)."""
        prefix, topics, strict = _prefix_topics(dash, body)
        results: list[PrefixAbortResult] = []
        for topic in topics:
            try:
                results.append(broker.abort_prefix(topic, prefix))
            except UnknownTopic:
                if strict:
                    raise
        res = CancelAllResult.of(results, topics)
        return {
            "aborted": res.aborted,
            "already_delivered_count": res.already_delivered_count,
            "already_delivered": list(res.already_delivered),
            "topics": list(res.topics),
        }

    return router


__all__ = ["PREVIEW_CAP", "count_prefix", "routes"]
