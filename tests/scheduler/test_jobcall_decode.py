"""JobCall.decode's short path gives what the checked path gives, and refuses alike."""

from __future__ import annotations

import json

import pytest

from broker_adapter.errors import DecodeError
from scheduler.jobcall import JobCall


def checked(body: bytes) -> JobCall:
    """The full path, every check (what decode did before its short path)."""
    return JobCall._decode_checked(body)


ACCEPTED = [
    JobCall("shop.close", (42,)).encode(),
    JobCall("shop.close", (42, "x", None, True, -1.5)).encode(),
    JobCall("shop.close", (), {"reason": "timeout", "n": 3}).encode(),
    JobCall("shop.close", ([1, 2], {"a": {"b": [None]}})).encode(),
    JobCall("shop.close", ("é ☃ \u2028",)).encode(),
    b' {"v":1,"job":"shop.close","args":[1]} ',  # whitespace: the checked path
    b'{"v":1,"job":"shop.close"}',  # args and kwargs left out
    b'{"v":1,"job":"shop.close","args":[1],"kwargs":{},"extra":1}',
]

REFUSED = [
    b"\xff\xfe",
    b"",
    b"[1]",
    b'{"v":2,"job":"shop.close"}',
    b'{"job":"shop.close"}',
    b'{"v":1,"job":["shop.close"]}',
    b'{"v":1,"job":{"a":1}}',
    b'{"v":1,"job":"shop.close","args":{}}',
    b'{"v":1,"job":"shop.close","kwargs":[]}',
    b'{"v":1,"job":"shop.close","args":[1]} trailing',
    b'{"v":1,"job":"shop.close","args":[NaN]}',
    b'{"v":1,"job":"shop.close","args":[Infinity]}',
    b'{"v":1,"job":"no such name!","args":[1]}',
    b'{"v":1,"job":"shop.close","args":[1]',
    b"[" * 100_000,
]


@pytest.mark.parametrize("body", ACCEPTED)
def test_short_path_equals_checked_path(body: bytes) -> None:
    # Given: the job name was seen valid before (the short path needs that)
    want = checked(body)
    # When: decoded twice (the second time on the short path where it applies)
    first, again = JobCall.decode(body), JobCall.decode(body)
    # Then: the same call, with read-only kwargs
    for got in (first, again):
        assert got == want
        assert type(got.args) is tuple
        with pytest.raises(TypeError):
            got.kwargs["new"] = 1  # type: ignore[index]


@pytest.mark.parametrize("body", REFUSED)
def test_refused_alike(body: bytes) -> None:
    checked(JobCall("shop.close", (1,)).encode())  # the name is known valid
    with pytest.raises(DecodeError) as short:
        JobCall.decode(body)
    with pytest.raises(DecodeError) as full:
        checked(body)
    assert str(short.value) == str(full.value)


def test_kwargs_not_shared_between_calls() -> None:
    body = JobCall("shop.close", (), {"a": 1}).encode()
    one, two = JobCall.decode(body), JobCall.decode(body)
    assert one.kwargs == two.kwargs == {"a": 1}
    assert json.loads(one.encode()) == json.loads(body)


def test_not_bytes_refused() -> None:
    with pytest.raises(DecodeError, match="decodes from bytes"):
        JobCall.decode("{}")  # type: ignore[arg-type]
    body = bytearray(JobCall("shop.close", (1,)).encode())
    assert JobCall.decode(body).args == (1,)  # type: ignore[arg-type]
