"""The timed message: what a producer hands to a broker.

A :class:`Message` carries a topic, a body of bytes, an optional business key
(``order:42``), tags and string properties, and at most one timing field:

* ``delay_ms``: whole milliseconds from the moment the broker accepts it;
* ``delay_sec``: seconds (int or float, rounded to the millisecond);
* ``delay_level``: RocketMQ 4.x levels, ``1..18`` map to :data:`DELAY_LEVELS`
  (``1s 5s 10s 30s 1m 2m ... 30m 1h 2h``); ``0`` means now; above 18 clamps to 18;
* ``deliver_at_ms``: an absolute time, epoch milliseconds (a past time means now).

None of them means deliver now. Everything that can be checked without a broker
is checked here, at construction, so a bad message never reaches the wire.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from broker_adapter.checks import is_int
from broker_adapter.errors import InvalidDelay, InvalidMessage, InvalidTopic

#: RocketMQ 4.x ``messageDelayLevel`` in milliseconds; level ``n`` is ``DELAY_LEVELS[n - 1]``.
DELAY_LEVELS: tuple[int, ...] = tuple(
    s * 1000
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
MAX_DELAY_LEVEL = len(DELAY_LEVELS)

#: Topic names: letters, digits, ``_``, ``-`` and ``.``, 1 to 127 characters.
#: Names starting with ``%`` are the broker's own (``%RETRY%group``, ``%DLQ%group``).
TOPIC_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,127}")
SYSTEM_TOPIC_PATTERN = re.compile(r"%(RETRY|DLQ)%[A-Za-z0-9_.\-]{1,127}")
MAX_KEY_CHARS = 512
#: Longest ``tags``: the scheduler tags each run with its job's name (up to 256 characters).
MAX_TAGS_CHARS = 256
# Topic names already checked: most programs send to a handful of topics.
_KNOWN_TOPICS: set[str] = set()


def check_topic(topic: object, *, allow_system: bool = False) -> str:
    """Return ``topic`` if it is a valid topic name, else raise :class:`InvalidTopic`.

    :param allow_system: also accept ``%RETRY%<group>`` and ``%DLQ%<group>`` (for
        subscribing to a group's dead letters); producers never send to those.
    """
    if not isinstance(topic, str):
        raise InvalidTopic(topic, "a topic must be a str")
    if TOPIC_PATTERN.fullmatch(topic):
        return topic
    if allow_system and SYSTEM_TOPIC_PATTERN.fullmatch(topic):
        return topic
    if not topic:
        raise InvalidTopic(topic, "a topic must not be empty")
    if len(topic) > 127:
        raise InvalidTopic(topic, "a topic has at most 127 characters")
    if topic.startswith("%"):
        raise InvalidTopic(topic, "names starting with '%' are reserved for the broker")
    raise InvalidTopic(topic, "use only letters, digits, '_', '-' and '.'")


def _check_int(name: str, value: object) -> int:
    if not is_int(value):
        raise InvalidDelay(name, value, "must be an int")
    if value < 0:
        raise InvalidDelay(name, value, "must not be negative")
    return value


def _check_timing(
    delay_ms: object, delay_sec: object, delay_level: object, deliver_at_ms: object
) -> None:
    """Raise unless at most one timing field is given and it is valid."""
    given = {
        "delay_ms": delay_ms,
        "delay_sec": delay_sec,
        "delay_level": delay_level,
        "deliver_at_ms": deliver_at_ms,
    }
    names = [name for name, value in given.items() if value is not None]
    if len(names) > 1:
        raise InvalidMessage(f"give at most one timing field, got {' and '.join(names)}")
    if delay_ms is not None:
        _check_int("delay_ms", delay_ms)
    elif delay_level is not None:
        _check_int("delay_level", delay_level)
    elif deliver_at_ms is not None:
        _check_int("deliver_at_ms", deliver_at_ms)
    elif delay_sec is not None:
        if isinstance(delay_sec, bool) or not isinstance(delay_sec, int | float):
            raise InvalidDelay("delay_sec", delay_sec, "must be an int or float")
        if not math.isfinite(delay_sec) or delay_sec < 0:
            raise InvalidDelay("delay_sec", delay_sec, "must be finite and not negative")


def _checked_properties(props: object) -> Mapping[str, str]:
    """A read-only copy of ``props``, which must map str to str."""
    if not isinstance(props, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in props.items()
    ):
        raise InvalidMessage("properties must map str to str")
    return MappingProxyType(dict(props))


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """A message to deliver now or later; immutable and validated at construction.

    :param topic: where it goes; see :data:`TOPIC_PATTERN`.
    :param body: the payload, ``bytes`` only (encode text yourself: no implicit pickling).
    :param key: business key such as ``"order:42"``; names at most one pending
        message per topic, and lets ``abort(key=..., topic=...)`` find it.
    :param tags: a short label consumers may filter or log on.
    :param properties: string to string metadata delivered with the message.
    :raises InvalidMessage: for a wrong type, an empty or over-long key, or two timing fields.
    :raises InvalidDelay: for a negative or non-integer timing field.
    :raises InvalidTopic: for a bad topic name.
    """

    topic: str
    body: bytes = b""
    key: str | None = None
    tags: str | None = None
    properties: Mapping[str, str] | None = field(default=None, hash=False)
    delay_ms: int | None = None
    delay_sec: float | None = None
    delay_level: int | None = None
    deliver_at_ms: int | None = None

    # Producers build one Message per send, so construction is on the hot path of
    # scheduling (issue 16): the checks run on the arguments, the common case (a known
    # topic, bytes, a plain key, one int delay) in a few comparisons, and the fields
    # are set through their slots, not dataclass's frozen __setattr__ (~0.5 us less).
    def __init__(
        self,
        topic: str,
        body: bytes = b"",
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        delay_ms: int | None = None,
        delay_sec: float | None = None,
        delay_level: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> None:
        if type(topic) is not str or topic not in _KNOWN_TOPICS:
            check_topic(topic)
            if len(_KNOWN_TOPICS) < 10_000:
                _KNOWN_TOPICS.add(topic)
        if type(body) is not bytes:
            raise InvalidMessage(
                f"body must be bytes, got {type(body).__name__}; encode it first "
                "(e.g. json.dumps(obj).encode())"
            )
        if key is not None and (
            type(key) is not str or not key or len(key) > MAX_KEY_CHARS or "\x00" in key
        ):
            raise InvalidMessage(
                f"key must be a str of 1 to {MAX_KEY_CHARS} characters without NUL, got {key!r}"
            )
        if tags is not None and (not isinstance(tags, str) or len(tags) > MAX_TAGS_CHARS):
            raise InvalidMessage(f"tags must be a str of at most {MAX_TAGS_CHARS} characters")
        if properties is not None:
            properties = _checked_properties(properties)
        if delay_sec is None and delay_level is None:
            if delay_ms is None:
                if deliver_at_ms is not None and (
                    type(deliver_at_ms) is not int or deliver_at_ms < 0
                ):
                    _check_int("deliver_at_ms", deliver_at_ms)
            elif deliver_at_ms is not None or type(delay_ms) is not int or delay_ms < 0:
                _check_timing(delay_ms, delay_sec, delay_level, deliver_at_ms)
        else:
            _check_timing(delay_ms, delay_sec, delay_level, deliver_at_ms)
        s_topic, s_body, s_key, s_tags, s_props, s_ms, s_sec, s_level, s_at = _SET
        s_topic(self, topic)
        s_body(self, body)
        s_key(self, key)
        s_tags(self, tags)
        s_props(self, properties)
        s_ms(self, delay_ms)
        s_sec(self, delay_sec)
        s_level(self, delay_level)
        s_at(self, deliver_at_ms)

    def with_body(self, body: bytes, key: str | None = None) -> Message:
        """A copy of this message with ``body`` and ``key`` instead of its own (checked
        as the constructor checks them), everything else the same: the cheap way to
        build many messages that differ only there (``schedule_many`` does).

        :raises InvalidMessage: for a body that is not bytes or a bad key.
        """
        if (
            type(self) is not Message
            or type(body) is not bytes
            or (
                key is not None
                and (type(key) is not str or not key or len(key) > MAX_KEY_CHARS or "\x00" in key)
            )
        ):  # a subclass, or an error to raise: the constructor's path
            return replace(self, body=body, key=key)
        new = _new(Message)
        s_topic, s_body, s_key, s_tags, s_props, s_ms, s_sec, s_level, s_at = _SET
        s_topic(new, self.topic)
        s_body(new, body)
        s_key(new, key)
        s_tags(new, self.tags)
        s_props(new, self.properties)  # a read-only view of a private copy: shareable
        s_ms(new, self.delay_ms)
        s_sec(new, self.delay_sec)
        s_level(new, self.delay_level)
        s_at(new, self.deliver_at_ms)
        return new

    def properties_bytes(self) -> bytes:
        """The properties as compact JSON bytes (empty when there are none)."""
        if not self.properties:
            return b""
        return json.dumps(dict(self.properties), separators=(",", ":")).encode()

    def size(self) -> int:
        """Bytes this message weighs against a broker's max size: body plus properties."""
        return len(self.body) + (len(self.properties_bytes()) if self.properties else 0)

    def relative_delay_ms(self) -> int | None:
        """The delay in ms when the timing is relative (or none); ``None`` for ``deliver_at_ms``."""
        if self.delay_ms is not None:
            return self.delay_ms
        if self.delay_level is not None:
            level = min(self.delay_level, MAX_DELAY_LEVEL)
            return 0 if level == 0 else DELAY_LEVELS[level - 1]
        if self.delay_sec is not None:
            return round(self.delay_sec * 1000)
        if self.deliver_at_ms is not None:
            return None
        return 0

    def deliver_at(self, now_ms: int) -> int:
        """The epoch ms this message is due, given the broker's ``now_ms`` (never before now)."""
        delay = self.relative_delay_ms()
        if delay is None:
            return max(now_ms, self.deliver_at_ms or 0)
        return now_ms + delay


_new = object.__new__
# The slots' setters, in field order (a frozen dataclass refuses setattr).
_SET: tuple[Any, ...] = tuple(getattr(Message, f.name).__set__ for f in fields(Message))
