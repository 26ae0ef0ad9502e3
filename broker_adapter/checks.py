"""Argument checks shared by every adapter, the scheduler and the workers.

One validator for ints (:func:`is_int`, :func:`check_int`): ``True`` and ``False``
are not ints here, though Python says they are. The ``check_*`` functions are
what every adapter checks first, so each adapter only writes its primitives.
"""

from __future__ import annotations

from typing import TypeGuard

from broker_adapter.errors import InvalidArgument


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


__all__ = [
    "check_abort_args",
    "check_int",
    "check_invisible_ms",
    "check_nack_delay",
    "check_pending_limit",
    "check_positive_settings",
    "check_pull_args",
    "check_release_delay",
    "is_int",
]
