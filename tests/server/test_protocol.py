"""The wire protocol: strict decoding with typed errors, and value round trips."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter.errors import DecodeError, InvalidDelay, MessageTooLarge
from broker_adapter.message import Message
from broker_adapter.results import (
    MessageState,
    MessageView,
    ReceivedMessage,
    SendResult,
    SendStatus,
)
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_decoding_random_bytes_raises_only_protocol_error(data: bytes) -> None:
    try:
        req = P.decode_request(data)
    except P.ProtocolError as e:
        assert isinstance(e, DecodeError)
    else:  # the rare random bytes that are a valid request still decode to one
        assert req.op in P.OPS and isinstance(req.args, dict)


@settings(max_examples=500, deadline=None)
@given(msgpack_values)
def test_decoding_any_msgpack_value_raises_only_protocol_error(value: object) -> None:
    payload = msgpack.packb(value, use_bin_type=True)
    try:
        req = P.decode_request(payload)
    except P.ProtocolError:
        pass
    else:
        assert req.op in P.OPS


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    st.sampled_from(sorted(P.OPS)),
    st.dictionaries(
        st.text(max_size=8), st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8), max_size=4
    ),
)
def test_request_frames_round_trip(rid: int, op: str, args: dict[str, object]) -> None:
    data = P.request(rid, op, args)
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert P.decode_request(data[4:]) == P.Request(rid, op, args)


@pytest.mark.parametrize(
    "value",
    [
        [1, 1, "send", {}],
        [0, -1, "send", {}],
        [0, 2**63, "send", {}],
        [0, 1, "nope", {}],
        [0, 1, "send", []],
        [0, 1, "send"],
        [0, 1.0, "send", {}],
        [True, 1, "send", {}],
        {},
    ],
    ids=[
        "response-tag",
        "negative-rid",
        "huge-rid",
        "unknown-op",
        "args-list",
        "short",
        "float-rid",
        "bool-tag",
        "map",
    ],
)
def test_wrong_shapes_are_protocol_errors(value: object) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode_request(msgpack.packb(value))


def test_trailing_bytes_are_a_protocol_error() -> None:
    with pytest.raises(P.ProtocolError):
        P.decode_request(msgpack.packb([0, 1, "stats", {}]) + b"\x00")


def test_values_msgpack_cannot_carry_are_invalid_arguments() -> None:
    from broker_adapter.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        P.request(1, "send", {"m": V.encode_message(Message("t", delay_ms=2**70))})


def test_non_str_map_keys_are_a_protocol_error() -> None:
    with pytest.raises(P.ProtocolError):
        P.decode_request(msgpack.packb([0, 1, "stats", {1: 2}]))


@pytest.mark.parametrize("length", [0, P.MAX_FRAME + 1, 2**32 - 1])
def test_frame_lengths_outside_the_limit_are_refused(length: int) -> None:
    with pytest.raises(P.FrameTooLarge) as info:
        P.check_length(length)
    assert info.value.limit == P.MAX_FRAME


def test_frame_length_at_the_limit_is_accepted() -> None:
    assert P.check_length(P.MAX_FRAME) == P.MAX_FRAME


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(r"[a-z]{1,10}", fullmatch=True),
    st.binary(max_size=50),
    st.none() | st.text(min_size=1, max_size=10).filter(lambda s: "\x00" not in s),
    st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    st.none() | st.integers(0, 10**9),
)
def test_messages_round_trip(
    topic: str, body: bytes, key: str | None, props: dict[str, str] | None, delay: int | None
) -> None:
    m = Message(topic, body, key=key, tags="t", properties=props, delay_ms=delay)
    wire = msgpack.unpackb(msgpack.packb(V.encode_message(m)))
    assert V.decode_message(wire) == m


def test_results_views_and_received_messages_round_trip() -> None:
    r = SendResult(SendStatus.DUPLICATE, "abc", 5)
    assert V.decode_result(V.encode_result(r)) == r
    v = MessageView(
        "id", "t", MessageState.DEAD, 1, 2, 3, "k", "tg", 4, {"g": MessageState.DEAD}, "why"
    )
    assert V.decode_view(msgpack.unpackb(msgpack.packb(V.encode_view(v)))) == v
    rm = ReceivedMessage("id", "t", b"b", 1, 2, 3, b"r", "k", None, {"a": "b"})
    got = V.decode_received(msgpack.unpackb(msgpack.packb(V.encode_received(rm))), b"\x07", "n:")
    assert got.receipt == b"\x07r" and got.msg_id == "n:id"
    assert dict(got.properties) == {"a": "b"} and got.body == b"b"


def test_errors_cross_the_wire_with_their_type_and_fields() -> None:
    frame = P.error_response(9, MessageTooLarge(10, 5))
    resp = P.decode_response(frame[4:])
    assert (resp.rid, resp.ok) == (9, False)
    error = P.decode_error(resp.result)
    assert isinstance(error, MessageTooLarge)
    assert (error.size, error.limit) == (10, 5)
    delay = P.decode_error(P.error_payload(InvalidDelay("delay_ms", -1, "bad")))
    assert isinstance(delay, InvalidDelay) and "bad" in str(delay)


def test_unknown_error_names_become_broker_errors() -> None:
    from broker_adapter.errors import BrokerError

    assert type(P.decode_error(["NoSuchError", "x", {}])) is BrokerError
    assert type(P.decode_error(["__class__", "x", {}])) is BrokerError
    assert isinstance(P.decode_error("junk"), P.ProtocolError)
