"""The runs of ``JobHandle.schedule_many``: the :class:`Call` record, the shapes a
batch accepts (:data:`CallLike`) and :func:`batch_messages`, which turns them into
checked messages.

Also :func:`check_key`, the reserved-prefix rule every scheduled run's key obeys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from broker_adapter.message import Message
from scheduler.errors import InvalidSchedule
from scheduler.spec import CRON_KEY_PREFIX
from scheduler.wire import Positional


@dataclass(frozen=True, slots=True)
class Call:
    """One run for :meth:`JobHandle.schedule_many`: arguments, key and, optionally,
    its own timing (which wins over the batch's ``delay=``/``at=``/``delay_level=``).

    Also the way to pass a keyword argument named ``delay``, ``at``,
    ``delay_level`` or ``key`` to the job itself (``kwargs={"delay": 5}``).
    """

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    delay: timedelta | float | None = None
    at: datetime | None = None
    delay_level: int | None = None

    @property
    def has_timing(self) -> bool:
        """Whether this call sets its own timing."""
        return self.delay is not None or self.at is not None or self.delay_level is not None


#: What ``schedule_many`` accepts per run: a :class:`Call`, ``(args, kwargs)`` or
#: ``(args, kwargs, key)``.
CallLike = Call | tuple[Any, ...]

#: Works out a call's own timing: ``(delay, at, delay_level)`` -> Message's fields.
TimingOf = Callable[[timedelta | float | None, datetime | None, int | None], Positional]


def check_key(key: object) -> None:
    """Refuse a key with the prefix reserved for cron occurrences.

    :raises InvalidSchedule: for a str key starting with ``cron:``.
    """
    if type(key) is str and key.startswith(CRON_KEY_PREFIX):
        raise InvalidSchedule(
            f"key={key!r}: keys starting with {CRON_KEY_PREFIX!r} are reserved for cron "
            "occurrences; choose another prefix, e.g. 'order:42'"
        )


def batch_messages(
    calls: Iterable[CallLike],
    template: Message,
    encode: Callable[[tuple[Any, ...], Mapping[str, Any]], bytes],
    timing_of: TimingOf,
) -> tuple[list[Message], list[str | None]]:
    """The checked messages of a batch's calls, and their keys.

    :param template: a message of the job with the batch's timing and an empty body.
    :param encode: the job's argument encoder.
    :param timing_of: works out the timing of a :class:`Call` that sets its own.
    :raises InvalidSchedule: for a reserved key or a call's bad timing.
    :raises TypeError: for an entry that is neither a :class:`Call` nor a 2- or 3-tuple.
    """
    prefix = CRON_KEY_PREFIX
    # Calls with the batch's timing differ only in body and key: copies of one
    # checked message (Message.with_body) cost less than a new Message each.
    copy = template.with_body
    topic, name = template.topic, template.tags
    messages: list[Message] = []
    keys: list[str | None] = []
    add_message, add_key = messages.append, keys.append
    for i, call in enumerate(calls):
        if type(call) is tuple and 2 <= len(call) <= 3:
            args, kwargs = call[0], call[1]
            key = call[2] if len(call) == 3 else None
            if type(key) is str and key.startswith(prefix):
                check_key(key)
            add_message(copy(encode(args, kwargs), key))
        elif isinstance(call, Call):
            key = call.key
            if type(key) is str and key.startswith(prefix):
                check_key(key)
            body = encode(call.args, call.kwargs)
            if call.has_timing:
                timing = timing_of(call.delay, call.at, call.delay_level)
                add_message(Message(topic, body, key, name, *timing))
            else:
                add_message(copy(body, key))
        else:
            raise TypeError(
                f"schedule_many() call {i} is {type(call).__name__} {call!r:.80}; give a "
                "Call(args, kwargs, key=...), an (args, kwargs) or an (args, kwargs, key) tuple"
            )
        add_key(key)
    return messages, keys


__all__ = ["Call", "CallLike", "TimingOf", "batch_messages", "check_key"]
