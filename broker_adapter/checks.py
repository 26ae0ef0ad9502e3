"""Argument checks shared by every adapter, the scheduler and the workers.

One validator for ints (:func:`is_int`, :func:`check_int`): ``True`` and ``False``
are not ints here, though Python says they are. The ``check_*`` functions are
what every adapter checks first, so each adapter only writes its primitives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from broker_adapter.errors import InvalidArgument, InvalidDelay


def is_int(value: object, minimum: int | None = None, maximum: int | None = None) -> TypeGuard[int]:
    """Whether ``value`` is an int (a bool is not) within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)


def check_int(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` if it is an int within ``[minimum, maximum]``.

    :raises InvalidArgument: naming ``name``, the range and what was given.
    """
    if not is_int(value, minimum, maximum):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise InvalidArgument(f"{name} must be an int {bound}, got {value!r}")
    return value


def check_pull_args(max_messages: object, wait_ms: object) -> None:
    """Raise ``InvalidArgument`` unless ``max_messages >= 1`` and ``wait_ms >= 0`` are ints
    (what every adapter's ``pull`` checks first)."""
    check_int("max_messages", max_messages)
    check_int("wait_ms", wait_ms, minimum=0)


def check_abort_args(msg_id: object, key: object, topic: object) -> None:
    """Raise ``InvalidArgument`` unless ``abort`` got ``msg_id`` alone, or ``key`` with
    ``topic`` (what every adapter's ``abort`` checks first)."""
    if (msg_id is None) == (key is None) or (key is None) != (topic is None):
        raise InvalidArgument("abort takes msg_id=..., or key=... with topic=...")


def check_pending_limit(limit: object) -> None:
    """Raise ``InvalidArgument`` unless ``limit`` (of ``pending``) is an int >= 1."""
    check_int("limit", limit)


def check_nack_delay(delay_ms: object) -> None:
    """Raise ``InvalidArgument`` unless ``delay_ms`` is ``None`` or an int >= 0."""
    if delay_ms is not None and not is_int(delay_ms, 0):
        raise InvalidArgument(f"delay_ms must be an int >= 0 or None, got {delay_ms!r}")


def check_invisible_ms(invisible_ms: object) -> None:
    """Raise ``InvalidArgument`` unless ``invisible_ms`` (of ``extend``) is an int >= 1."""
    check_int("invisible_ms", invisible_ms)


def check_release_delay(delay_ms: object) -> None:
    """Raise ``InvalidArgument`` unless ``delay_ms`` (of ``release``) is an int >= 0."""
    check_int("delay_ms", delay_ms, minimum=0)


def check_positive_settings(**settings: object) -> None:
    """Check constructor settings that must each be an int >= 1 (``max_body_bytes=...``).

    :raises InvalidArgument: naming the first that is not.
    """
    for name, value in settings.items():
        check_int(name, value)


@dataclass(frozen=True, slots=True)
class NewDue:
    """A reschedule's new due time, as given: ``delay_ms`` from the broker's now, or
    the absolute ``deliver_at_ms`` (exactly one is set); see :meth:`resolve`."""

    delay_ms: int | None
    deliver_at_ms: int | None

    def resolve(self, now_ms: int, max_delay_ms: int, tolerance_ms: int) -> int:
        """The epoch ms the message is due at, given the broker's ``now_ms``.

        :raises InvalidDelay: for a time more than ``tolerance_ms`` in the past, or
            more than ``max_delay_ms`` ahead.
        """
        if self.delay_ms is not None:
            due = now_ms + self.delay_ms
        else:
            at = self.deliver_at_ms
            assert at is not None  # the constructor's check: exactly one is set
            if at < now_ms - tolerance_ms:
                raise InvalidDelay(
                    "deliver_at_ms",
                    at,
                    f"{now_ms - at} ms in the past (the broker's clock); give a future "
                    "time, or delay_ms=0 to run it now",
                )
            due = max(at, now_ms)
        if due - now_ms > max_delay_ms:
            raise InvalidDelay(
                "deliver_at_ms" if self.delay_ms is None else "delay_ms",
                self.deliver_at_ms if self.delay_ms is None else self.delay_ms,
                f"more than the broker's max delay of {max_delay_ms} ms ahead",
            )
        return due


def check_reschedule_args(
    msg_id: object,
    key: object,
    topic: object,
    delay_ms: object,
    deliver_at_ms: object,
    body: object,
) -> NewDue:
    """Check a ``reschedule`` call (what every adapter checks first) and return its due.

    :raises InvalidArgument: unless ``msg_id`` alone or ``key`` with ``topic`` is given,
        exactly one of ``delay_ms`` and ``deliver_at_ms``, and ``body`` is bytes or ``None``.
    :raises InvalidDelay: for a timing that is not an int >= 0.
    """
    if (msg_id is None) == (key is None) or (key is None) != (topic is None):
        raise InvalidArgument("reschedule takes msg_id=..., or key=... with topic=...")
    if (delay_ms is None) == (deliver_at_ms is None):
        raise InvalidArgument("reschedule takes exactly one of delay_ms=... or deliver_at_ms=...")
    for name, value in (("delay_ms", delay_ms), ("deliver_at_ms", deliver_at_ms)):
        if value is not None and not is_int(value, 0):
            raise InvalidDelay(name, value, "must be an int >= 0")
    if body is not None and type(body) is not bytes:
        raise InvalidArgument(
            f"body must be bytes or None, got {type(body).__name__}; encode it first"
        )
    return NewDue(delay_ms, deliver_at_ms)  # type: ignore[arg-type]  # checked above


def check_key_prefix(key_prefix: object) -> str:
    """``key_prefix`` if it is a non-empty str (of ``abort_prefix``/``find_pending``).

    :raises InvalidArgument: otherwise; an empty prefix would match every key.
    """
    if not isinstance(key_prefix, str) or not key_prefix:
        raise InvalidArgument(
            f"key_prefix must be a non-empty str, got {key_prefix!r} (an empty prefix "
            "would match every key: give the part before the id, e.g. 'order:42:')"
        )
    return key_prefix


def check_find_args(
    topic: object,
    key_prefix: object,
    tag: object,
    start_ms: object,
    end_ms: object,
    limit: object,
    cursor: object,
) -> None:
    """Check a ``find_pending`` call except the topic's name (what every adapter checks
    first); the cursor only for its type: each adapter decodes its own.

    :raises InvalidArgument: see :meth:`BrokerAdapter.find_pending
        <broker_adapter.base.BrokerAdapter.find_pending>`.
    """
    check_pending_limit(limit)
    if key_prefix is not None:
        check_key_prefix(key_prefix)
        if topic is None:
            raise InvalidArgument("find_pending with key_prefix=... needs topic=... too")
    if tag is not None and (not isinstance(tag, str) or not tag):
        raise InvalidArgument(f"tag must be a non-empty str or None, got {tag!r}")
    for name, value in (("start_ms", start_ms), ("end_ms", end_ms)):
        if value is not None and not is_int(value, 0):
            raise InvalidArgument(f"{name} must be an int >= 0 (epoch ms) or None, got {value!r}")
    if cursor is not None and (not isinstance(cursor, str) or not cursor):
        raise InvalidArgument(f"cursor must be a page's cursor (a str) or None, got {cursor!r}")


def check_dead_page_args(limit: object, cursor: object) -> None:
    """Check a ``dead_letters`` call but its group name (what every adapter checks
    first); the cursor only for its type: each adapter decodes its own.

    :raises InvalidArgument: for ``limit`` < 1 or a cursor that is not a non-empty str.
    """
    check_int("limit", limit)
    if cursor is not None and (not isinstance(cursor, str) or not cursor):
        raise InvalidArgument(f"cursor must be a page's cursor (a str) or None, got {cursor!r}")


def check_dead_ids(msg_ids: object, limit: object) -> tuple[str, ...] | None:
    """The ids of a ``requeue_dead``/``purge_dead`` call without repeats (in order), or
    ``None`` for "the oldest"; what every adapter checks first.

    :raises InvalidArgument: for ``limit`` < 1, ``msg_ids`` that is not ``None`` or a
        list or tuple of str, or more than ``limit`` ids.
    """
    check_int("limit", limit)
    if msg_ids is None:
        return None
    if not isinstance(msg_ids, (list, tuple)):
        raise InvalidArgument(
            f"msg_ids must be a list or tuple of ids or None, got {type(msg_ids).__name__} "
            "(a single id goes in a list: [msg_id])"
        )
    for msg_id in msg_ids:
        if not isinstance(msg_id, str):
            raise InvalidArgument(f"msg_ids must hold str ids, got {msg_id!r}")
    if len(msg_ids) > limit:  # type: ignore[operator]  # an int: checked above
        raise InvalidArgument(
            f"{len(msg_ids)} msg_ids is more than limit={limit}: split them into calls "
            "of at most limit ids (or raise limit)"
        )
    return tuple(dict.fromkeys(msg_ids))


_MAX_EDGE = (1 << 63) - 1


def check_count_edges(edges_ms: object, max_edges: int) -> tuple[int, ...]:
    """The bucket edges of a ``count_pending`` call as a tuple.

    :raises InvalidArgument: unless ``edges_ms`` is a list or tuple of 2 to
        ``max_edges`` ints from 0 to 2**63 - 1, strictly increasing.
    """
    if not isinstance(edges_ms, (list, tuple)) or not 2 <= len(edges_ms) <= max_edges:
        raise InvalidArgument(
            f"edges_ms must be a list of 2 to {max_edges} bucket edges (epoch ms), got "
            f"{edges_ms!r:.80}"
        )
    for i, edge in enumerate(edges_ms):
        if not is_int(edge, 0, _MAX_EDGE):  # the bound: what every wire and store can carry
            raise InvalidArgument(
                f"edges_ms[{i}] must be an int from 0 to {_MAX_EDGE} (epoch ms), got {edge!r}"
            )
        if i and edge <= edges_ms[i - 1]:
            raise InvalidArgument(
                f"edges_ms must increase strictly: edges_ms[{i}]={edge} follows {edges_ms[i - 1]}"
            )
    return tuple(edges_ms)


def check_name(label: str, value: object) -> str:
    """``value`` if it is a non-empty str of at most 512 characters (a rate bucket, a
    semaphore or a holder name).

    :raises InvalidArgument: otherwise.
    """
    if not isinstance(value, str) or not value or len(value) > 512:
        raise InvalidArgument(f"{label} must be a str of 1 to 512 characters, got {value!r}")
    return value


__all__ = [
    "NewDue",
    "check_abort_args",
    "check_count_edges",
    "check_dead_ids",
    "check_dead_page_args",
    "check_find_args",
    "check_int",
    "check_invisible_ms",
    "check_key_prefix",
    "check_nack_delay",
    "check_name",
    "check_pending_limit",
    "check_positive_settings",
    "check_pull_args",
    "check_release_delay",
    "check_reschedule_args",
    "is_int",
]
