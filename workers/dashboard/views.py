"""Messages as the API shows them: :func:`message_doc` turns a broker's
:class:`~broker_adapter.results.MessageView` into the ``Msg`` JSON object, with the
job call decoded and everything long cut short.

A job call's ``args``/``kwargs`` are JSON values already (the wire format is
JSON); each string is cut to :data:`MAX_STRING` characters and the whole to
about :data:`MAX_CALL_CHARS` characters of JSON, with ``"truncated": true`` when
anything was cut. A body that is not a job call shows its first
:data:`MAX_PREVIEW` characters as text (undecodable bytes replaced). Nothing is
escaped for HTML here: the pages insert every value as text.
"""

from __future__ import annotations

from typing import Any

from broker_adapter.errors import DecodeError
from broker_adapter.results import MessageView
from scheduler.jobcall import JobCall

#: Longest string shown inside a job call's arguments.
MAX_STRING = 200
#: About the most characters of JSON a job call's arguments are shown with.
MAX_CALL_CHARS = 4000
#: Most items of one list or object shown.
MAX_ITEMS = 100
#: Characters of a non-job body shown.
MAX_PREVIEW = 500


class _Budget:
    """What is left of :data:`MAX_CALL_CHARS`, and whether anything was cut."""

    __slots__ = ("cut", "left")

    def __init__(self, left: int) -> None:
        self.left = left
        self.cut = False

    def take(self, n: int) -> bool:
        """Spend ``n`` characters; ``False`` (and marked cut) when they do not fit."""
        if n > self.left:
            self.cut = True
            return False
        self.left -= n
        return True


def _short(value: Any, budget: _Budget, depth: int = 0) -> Any:
    """``value`` with strings, lists and objects cut to fit ``budget``."""
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            budget.cut = True
            value = value[:MAX_STRING] + "…"
        return value if budget.take(len(value) + 2) else None
    if isinstance(value, list):
        out: list[Any] = []
        for item in value[:MAX_ITEMS]:
            if budget.left <= 0:
                budget.cut = True
                break
            out.append(_short(item, budget, depth + 1))
        budget.cut |= len(value) > len(out)
        return out
    if isinstance(value, dict):
        obj: dict[str, Any] = {}
        for k, item in list(value.items())[:MAX_ITEMS]:
            if budget.left <= 0 or not budget.take(min(len(k), MAX_STRING) + 3):
                budget.cut = True
                break
            if len(k) > MAX_STRING:
                budget.cut = True
                k = k[:MAX_STRING] + "…"
            obj[k] = _short(item, budget, depth + 1)
        budget.cut |= len(value) > len(obj)
        return obj
    budget.take(len(str(value)))
    return value


def call_doc(call: JobCall) -> dict[str, Any]:
    """``job``, ``args``, ``kwargs`` and ``truncated`` of a decoded job call."""
    budget = _Budget(MAX_CALL_CHARS)
    args = _short(list(call.args), budget)
    kwargs = _short(dict(call.kwargs), budget)
    return {"job": call.name, "args": args, "kwargs": kwargs, "truncated": budget.cut}


def body_doc(body: bytes | None, tags: str | None) -> dict[str, Any]:
    """The body's fields of a ``Msg``: its decoded call, or a text preview, or
    nothing known (``body`` is ``None``: the broker did not give it)."""
    doc: dict[str, Any] = {
        "job": tags,
        "args": None,
        "kwargs": None,
        "body_preview": None,
        "truncated": False,
    }
    if body is None:
        return doc
    try:
        doc.update(call_doc(JobCall.decode(body)))
    except DecodeError:
        text = body[: MAX_PREVIEW * 4].decode("utf-8", errors="replace")
        doc["body_preview"] = text[:MAX_PREVIEW]
        doc["truncated"] = len(text) > MAX_PREVIEW or len(body) > MAX_PREVIEW * 4
    return doc


def message_doc(view: MessageView, body: bytes | None = None) -> dict[str, Any]:
    """The API's ``Msg`` object for ``view`` (its body: ``view.body``, else ``body``).

    :param view: what the broker answered.
    :param body: the body when it was found apart from the view.
    """
    doc: dict[str, Any] = {
        "msg_id": view.msg_id,
        "topic": view.topic,
        "state": view.state.value,
        "deliver_at_ms": view.deliver_at_ms,
        "born_ms": view.born_ms,
        "attempts": view.attempts,
        "key": view.key,
        "tags": view.tags,
        "body_size": view.body_size,
        "error": view.error,
        "groups": {g: s.value for g, s in view.groups.items()},
    }
    doc.update(body_doc(view.body if view.body is not None else body, view.tags))
    return doc


__all__ = ["MAX_CALL_CHARS", "MAX_PREVIEW", "MAX_STRING", "body_doc", "call_doc", "message_doc"]
