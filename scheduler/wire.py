"""The wire format of job runs, and fast builders for it.

A run of job ``name`` is one :class:`~broker_adapter.message.Message`:

* topic: ``spec.topic_or(settings.topic)`` (the job's own topic, else ``CHRONOQ_TOPIC``);
* body: ``JobCall(name, args, kwargs).encode()``, UTF-8 JSON such as
  ``{"v":1,"job":"shop.close_order","args":[42],"kwargs":{}}`` (see :mod:`scheduler.jobcall`);
* tags: the job's name, so ``find_pending(tag=name)`` finds a job's runs (and
  ``app.pending(job=...)`` lists them); every run the scheduler sends carries it;
* key: the caller's ``key`` (``None`` when not given); for a cron occurrence
  ``cron:<name>:<fire_ms>``, with ``deliver_at_ms = fire_ms`` plus the cron's
  deterministic jitter (see :mod:`scheduler.cron`). Keys starting with ``cron:``
  are refused from ``schedule()``, so a dispatcher can tell the two apart.

:func:`make_encoder` builds the same bytes as ``JobCall.encode`` several times
faster for the common case of scalar arguments; ``schedule()`` spends most of its
own time here and in :class:`~broker_adapter.message.Message`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from broker_adapter.message import Message
from scheduler.jobcall import JobCall
from scheduler.timing import TimingFields

#: Argument types whose JSON form needs no deeper check (exact types only).
_SCALARS: frozenset[type] = frozenset({int, str, bool, float, type(None)})
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _no_default(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON")


def _make_dumps() -> Callable[[object], str]:
    """``JobCall.encode``'s JSON dialect, for flat containers of scalars only.

    The C encoder without circular-reference markers (a flat tuple of scalars has
    no cycles) is about 3x faster than ``json.dumps``, which builds a new encoder
    per call when given options.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the C accelerator
        return _ENCODER.encode
    iterencode = make(
        None, _no_default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )

    def dumps(value: object) -> str:
        return "".join(iterencode(value, 0))

    return dumps


_dumps = _make_dumps()


def make_encoder(name: str) -> Callable[[tuple[Any, ...] | list[Any], Mapping[str, Any]], bytes]:
    """A fast ``(args, kwargs) -> body`` for job ``name``, byte-identical to
    ``JobCall(name, args, kwargs).encode()``.

    Scalar arguments (exact ``int``, ``str``, ``bool``, ``float``, ``None``) are
    encoded directly; anything else, and any failure, goes through
    :class:`~scheduler.jobcall.JobCall`, which checks every value and raises
    :class:`~scheduler.errors.UnserializableArgument` with its path.
    """
    head = '{"v":1,"job":' + _ENCODER.encode(name) + ',"args":'
    scalars, dumps = _SCALARS, _dumps
    ends = '],"kwargs":{}}'

    def encode(args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]) -> bytes:
        kind = type(args)
        if (kind is tuple or kind is list) and type(kwargs) is dict:
            if not kwargs:
                for a in args:
                    if type(a) is not int:
                        break
                else:  # only ints (ids, the common case): an int's repr is its JSON
                    try:
                        return (head + "[" + ",".join(map(repr, args)) + ends).encode()
                    except ValueError:  # past the int digits limit: let JobCall explain
                        return JobCall(name, tuple(args), kwargs).encode()
            for a in args:
                if type(a) not in scalars:
                    break
            else:
                try:
                    if not kwargs:  # the common case: one concatenation
                        return (head + dumps(args) + ',"kwargs":{}}').encode()
                    for k, v in kwargs.items():
                        if type(v) not in scalars or type(k) is not str:
                            break
                    else:
                        return (head + dumps(args) + ',"kwargs":' + dumps(kwargs) + "}").encode()
                except ValueError:  # nan or infinity: let JobCall explain
                    pass
        return JobCall(name, tuple(args), kwargs).encode()

    return encode


# Message's fields after ``tags``, in order: schedule_many passes them by position
# (about 10% faster than by keyword on its hot loop).
_AFTER_TAGS = ("properties", "delay_ms", "delay_sec", "delay_level", "deliver_at_ms")
assert tuple(f.name for f in dataclasses.fields(Message))[3:] == ("tags", *_AFTER_TAGS)


Positional = tuple[None, int | None, None, int | None, int | None]


def positional(timing: TimingFields) -> Positional:
    """``timing`` as Message's positional fields after ``tags``."""
    return (
        None,
        timing.get("delay_ms"),
        None,
        timing.get("delay_level"),
        timing.get("deliver_at_ms"),
    )


__all__ = ["Positional", "make_encoder", "positional"]
