"""The body of a job message: :class:`JobCall` and its JSON wire format.

A job message's body is UTF-8 JSON, never pickle, so any language can read it
and no message can run code when decoded::

    {"v": 1, "job": "shop.orders.close_order", "args": [42], "kwargs": {"reason": "timeout"}}

Arguments must survive the round trip unchanged, so only JSON's own types are
accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str``, lists (tuples
are accepted and arrive as lists) and dicts with ``str`` keys. Anything else
(datetimes, sets, bytes, ``Decimal``, objects, ``nan``) is refused when the call
is built, with the path of the offending value and what to pass instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from types import CoroutineType, MappingProxyType
from typing import Any, Self

from broker_adapter.errors import DecodeError
from scheduler.errors import UnserializableArgument
from scheduler.spec import check_job_name

#: Version of the wire format; decoders refuse others.
WIRE_VERSION = 1
#: Deepest nesting accepted in arguments (guards against cycles and runaway data).
MAX_DEPTH = 64

_HINTS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    ((datetime, date, time), "pass an ISO string (value.isoformat()) or epoch milliseconds"),
    (timedelta, "pass seconds as a number (value.total_seconds())"),
    (Decimal, "pass a str (str(value)) or an int of minor units, e.g. cents"),
    ((bytes, bytearray, memoryview), "pass text, or base64 (base64.b64encode(value).decode())"),
    ((set, frozenset), "pass a sorted list"),
    (CoroutineType, "a coroutine object (an async function called without await): pass data"),
)


def _hint(value: object) -> str:
    for types, hint in _HINTS:
        if isinstance(value, types):
            return hint
    return "pass plain JSON data (None, bool, int, float, str, list, dict with str keys)"


def check_json(value: object, path: str, depth: int = 0) -> None:
    """Raise :class:`UnserializableArgument` unless ``value`` round-trips through JSON.

    :param path: how to name ``value`` in the error, e.g. ``args[0]``.
    """
    if depth > MAX_DEPTH:
        raise UnserializableArgument(path, value, f"nesting deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnserializableArgument(path, value, "JSON has no nan or infinity; pass None")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_json(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise UnserializableArgument(
                    f"{path} key {k!r}", k, "JSON object keys are str; convert the keys"
                )
            check_json(item, f"{path}[{k!r}]", depth + 1)
        return
    raise UnserializableArgument(path, value, _hint(value))


#: Exact types whose values :func:`check_json` always accepts (floats may be nan).
_PLAIN: frozenset[type] = frozenset({int, str, bool, type(None)})
#: Job names a decoded call carried that passed ``check_job_name`` (bounded).
_VALID_NAMES: set[str] = set()
_MAX_VALID_NAMES = 4096
#: json.loads's scanner (the C one where there is one): ``(value, end)`` from an index.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
#: The kwargs of every decoded call that has none (read-only, so one can be shared).
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})


def _all_scalars(args: list[Any], kwargs: dict[str, Any]) -> bool:
    plain = _PLAIN
    for a in args:
        if type(a) not in plain:
            return False
    for v in kwargs.values():
        if type(v) not in plain:
            return False
    return True


@dataclass(frozen=True, slots=True)
class JobCall:
    """One call of a job: its name and the arguments to call it with.

    :param name: the registered job name.
    :param args: positional arguments, JSON data only.
    :param kwargs: keyword arguments, JSON data only.
    :raises InvalidJobSpec: for an invalid job name.
    :raises UnserializableArgument: for an argument JSON cannot carry.
    """

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_job_name(self.name)
        if not isinstance(self.args, tuple | list):
            raise UnserializableArgument("args", self.args, "args is a tuple or list")
        object.__setattr__(self, "args", tuple(self.args))
        if not isinstance(self.kwargs, Mapping):
            raise UnserializableArgument("kwargs", self.kwargs, "kwargs is a dict")
        for i, item in enumerate(self.args):
            check_json(item, f"args[{i}]")
        for k, item in self.kwargs.items():
            if not isinstance(k, str):
                raise UnserializableArgument(f"kwargs key {k!r}", k, "keyword names are str")
            check_json(item, f"kwargs[{k!r}]")
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))

    def encode(self) -> bytes:
        """The call as compact UTF-8 JSON.

        :raises UnserializableArgument: if a (mutable) argument was changed after
            construction into something JSON cannot carry.
        """
        doc = {"v": WIRE_VERSION, "job": self.name, "args": self.args, "kwargs": dict(self.kwargs)}
        try:
            text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise UnserializableArgument(
                "args/kwargs",
                e,
                "an argument changed after the call was built; pass plain JSON data",
            ) from e
        return text.encode("utf-8")

    @classmethod
    def decode(cls, body: bytes) -> Self:
        """The call that ``body`` (from :meth:`encode`) carries.

        :raises DecodeError: for bytes that are not UTF-8 JSON of this format
            (wrong version, missing or mistyped fields, bad job name).
        """
        if type(body) is bytes:
            # The common case in fewer steps (issue 16): json.loads's own C scanner
            # without its two whitespace regex matches and wrappers, and a job name
            # seen valid before with plain scalar arguments skips the checks (they
            # would pass: JSON gives str keys). Anything else, errors included, takes
            # the full path below, which says what is wrong.
            try:
                text = body.decode()
                doc, end = _SCAN(text, 0)
            except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
                text, doc, end = "", None, -1
            if end == len(text) and type(doc) is dict and doc.get("v") == WIRE_VERSION:
                name, args, kwargs = doc.get("job"), doc.get("args", []), doc.get("kwargs", {})
                if (
                    type(name) is str
                    and type(args) is list
                    and type(kwargs) is dict
                    and name in _VALID_NAMES
                    and _all_scalars(args, kwargs)
                ):
                    call = object.__new__(cls)
                    setattr_ = object.__setattr__
                    setattr_(call, "name", name)
                    setattr_(call, "args", tuple(args))
                    setattr_(call, "kwargs", MappingProxyType(kwargs) if kwargs else _NO_KWARGS)
                    return call
        return cls._decode_checked(body)

    @classmethod
    def _decode_checked(cls, body: bytes) -> Self:
        """:meth:`decode` with every check (see there)."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise DecodeError(f"a job call decodes from bytes, got {type(body).__name__}")
        try:
            doc = json.loads(bytes(body).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise DecodeError(f"job call body is not UTF-8 JSON: {e}") from e
        if not isinstance(doc, dict):
            raise DecodeError(f"job call body must be a JSON object, got {type(doc).__name__}")
        version = doc.get("v")
        if version != WIRE_VERSION:
            raise DecodeError(
                f"job call wire version {version!r} is not {WIRE_VERSION}; upgrade the worker "
                "or drain messages sent by the other version"
            )
        name, args, kwargs = doc.get("job"), doc.get("args", []), doc.get("kwargs", {})
        if not isinstance(name, str):
            raise DecodeError(f'job call has no job name ("job": {name!r})')
        if not isinstance(args, list):
            raise DecodeError(f"job call args must be a JSON array, got {type(args).__name__}")
        if not isinstance(kwargs, dict):
            raise DecodeError(f"job call kwargs must be a JSON object, got {type(kwargs).__name__}")
        try:
            call = cls(name, tuple(args), kwargs)
        except (ValueError, TypeError) as e:
            raise DecodeError(f"job call does not validate: {e}") from e
        if len(_VALID_NAMES) < _MAX_VALID_NAMES:
            _VALID_NAMES.add(name)
        return call

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"JobCall({self.name}({', '.join(parts)}))"
