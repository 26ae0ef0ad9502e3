"""JobCall: JSON only, refused early with a path, decoded strictly."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.errors import DecodeError
from scheduler.errors import InvalidJobSpec, UnserializableArgument
from scheduler.jobcall import MAX_DEPTH, JobCall


def test_round_trip_and_wire_format() -> None:
    call = JobCall("shop.close_order", (42, "zürich"), {"reason": "timeout", "n": [1, {"a": None}]})
    body = call.encode()
    assert json.loads(body) == {
        "v": 1,
        "job": "shop.close_order",
        "args": [42, "zürich"],
        "kwargs": {"reason": "timeout", "n": [1, {"a": None}]},
    }
    assert b" " not in body.replace(b"z\xc3\xbcrich", b"")
    assert JobCall.decode(body) == call


def test_tuples_arrive_as_lists_and_args_list_becomes_tuple() -> None:
    call = JobCall("j", [(1, 2)])  # type: ignore[arg-type]
    assert call.args == ((1, 2),)
    assert JobCall.decode(call.encode()).args == ([1, 2],)


def test_kwargs_are_read_only_and_copied() -> None:
    source = {"a": 1}
    call = JobCall("j", (), source)
    source["a"] = 2
    assert call.kwargs["a"] == 1
    with pytest.raises(TypeError):
        call.kwargs["a"] = 3  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "kwargs", "path", "hint"),
    [
        ((datetime(2024, 1, 1, tzinfo=UTC),), {}, "args[0]", "isoformat"),
        ((), {"day": date(2024, 1, 1)}, "kwargs['day']", "isoformat"),
        ((timedelta(seconds=3),), {}, "args[0]", "total_seconds"),
        ((Decimal("1.10"),), {}, "args[0]", "str(value)"),
        ((b"raw",), {}, "args[0]", "base64"),
        (({1, 2},), {}, "args[0]", "sorted list"),
        ((float("nan"),), {}, "args[0]", "nan"),
        ((float("inf"),), {}, "args[0]", "nan or infinity"),
        (([1, [2, object()]],), {}, "args[0][1][1]", "plain JSON"),
        (({"when": {"at": datetime(2024, 1, 1)}},), {}, "args[0]['when']['at']", "isoformat"),
        (({1: "a"},), {}, "args[0] key 1", "str"),
    ],
)
def test_non_json_arguments_are_refused_with_path(
    args: tuple[Any, ...], kwargs: dict[str, Any], path: str, hint: str
) -> None:
    with pytest.raises(UnserializableArgument) as info:
        JobCall("j", args, kwargs)
    assert info.value.path == path
    assert hint in str(info.value)
    assert isinstance(info.value, TypeError)


def test_too_deep_nesting_is_refused() -> None:
    value: Any = 1
    for _ in range(MAX_DEPTH + 2):
        value = [value]
    with pytest.raises(UnserializableArgument, match="nesting"):
        JobCall("j", (value,))


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(UnserializableArgument):
        JobCall("j", "abc")  # type: ignore[arg-type]
    with pytest.raises(UnserializableArgument):
        JobCall("j", (), [("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(UnserializableArgument, match="keyword names"):
        JobCall("j", (), {1: 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidJobSpec):
        JobCall("", ())


def test_argument_mutated_after_construction_fails_at_encode() -> None:
    payload: list[Any] = [1]
    call = JobCall("j", (payload,))
    payload.append(object())
    with pytest.raises(UnserializableArgument, match="changed after"):
        call.encode()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b"{not json", "UTF-8 JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"job": "j", "args": []}', "wire version None"),
        (b'{"v": 2, "job": "j"}', "wire version 2"),
        (b'{"v": 1, "args": []}', "no job name"),
        (b'{"v": 1, "job": 7}', "no job name"),
        (b'{"v": 1, "job": "j", "args": {}}', "args must be a JSON array"),
        (b'{"v": 1, "job": "j", "kwargs": []}', "kwargs must be a JSON object"),
        (b'{"v": 1, "job": ""}', "does not validate"),
        (b'{"v": 1, "job": "j", "args": [NaN]}', "does not validate"),
        (b'{"v": 1, "job": "j", "args": ' + b"[" * 100 + b"]" * 100 + b"}", "does not validate"),
        (b"[" * 100_000, "UTF-8 JSON"),
    ],
)
def test_decode_errors(body: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError) as info:
        JobCall.decode(body)
    assert fragment in str(info.value)


def test_decode_takes_bytes_only() -> None:
    with pytest.raises(DecodeError, match="from bytes"):
        JobCall.decode('{"v": 1, "job": "j"}')  # type: ignore[arg-type]


def test_missing_args_and_kwargs_default_to_empty() -> None:
    assert JobCall.decode(b'{"v": 1, "job": "j"}') == JobCall("j")


def test_repr_reads_like_a_call() -> None:
    assert repr(JobCall("close", (42,), {"why": "late"})) == "JobCall(close(42, why='late'))"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(
    args=st.lists(json_values, max_size=4),
    kwargs=st.dictionaries(st.text(), json_values, max_size=4),
)
def test_json_arguments_round_trip(args: list[Any], kwargs: dict[str, Any]) -> None:
    call = JobCall("prop.job", tuple(args), kwargs)
    assert JobCall.decode(call.encode()) == call


def test_decode_of_a_known_name_checks_the_same() -> None:
    # The second decode of a name takes the fast path (scalar arguments): same call,
    # read-only kwargs; anything else still gets every check.
    body = JobCall("shop.close", (42, "x", None, True), {"k": 1}).encode()
    first, second = JobCall.decode(body), JobCall.decode(body)
    assert first == second == JobCall("shop.close", (42, "x", None, True), {"k": 1})
    assert type(second.args) is tuple
    with pytest.raises(TypeError):
        second.kwargs["k"] = 2  # type: ignore[index]
    nan = b'{"v":1,"job":"shop.close","args":[NaN],"kwargs":{}}'
    with pytest.raises(DecodeError, match="nan"):
        JobCall.decode(nan)
    spaced = b'{"v":1,"job":"shop close","args":[1],"kwargs":{}}'
    with pytest.raises(DecodeError, match="whitespace"):
        JobCall.decode(spaced)
