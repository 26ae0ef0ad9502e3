"""``Message`` validation and timing (``broker_adapter/message.py``), no broker needed."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from broker_adapter.base import dead_letter_topic, retry_backoff_ms, retry_topic
from broker_adapter.errors import (
    BrokerClosed,
    BrokerError,
    BrokerLocked,
    ChronoqError,
    InvalidArgument,
    InvalidDelay,
    InvalidMessage,
    InvalidTopic,
    MessageNotFound,
    MessageTooLarge,
    UnknownScheme,
)
from broker_adapter.message import DELAY_LEVELS, MAX_TAGS_CHARS, Message, check_topic

NOW = 1_700_000_000_000

# (id, Message kwargs, the exact error class)
BAD_MESSAGES: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("delay_ms-negative", {"delay_ms": -1}, InvalidDelay),
    ("delay_ms-float", {"delay_ms": 1.5}, InvalidDelay),
    ("delay_ms-whole-float", {"delay_ms": 1000.0}, InvalidDelay),
    ("delay_ms-str", {"delay_ms": "5"}, InvalidDelay),
    ("delay_ms-bool", {"delay_ms": True}, InvalidDelay),
    ("delay_sec-negative", {"delay_sec": -0.5}, InvalidDelay),
    ("delay_sec-nan", {"delay_sec": math.nan}, InvalidDelay),
    ("delay_sec-inf", {"delay_sec": math.inf}, InvalidDelay),
    ("delay_sec-str", {"delay_sec": "1"}, InvalidDelay),
    ("delay_sec-bool", {"delay_sec": False}, InvalidDelay),
    ("delay_level-negative", {"delay_level": -1}, InvalidDelay),
    ("delay_level-float", {"delay_level": 2.0}, InvalidDelay),
    ("delay_level-bool", {"delay_level": True}, InvalidDelay),
    ("deliver_at_ms-float", {"deliver_at_ms": 1.7e12}, InvalidDelay),
    ("deliver_at_ms-negative", {"deliver_at_ms": -5}, InvalidDelay),
    ("deliver_at_ms-bool", {"deliver_at_ms": True}, InvalidDelay),
    ("two-timing-ms-sec", {"delay_ms": 1, "delay_sec": 1}, InvalidMessage),
    ("two-timing-zeros", {"delay_level": 0, "deliver_at_ms": 0}, InvalidMessage),
    ("two-timing-ms-at", {"delay_ms": 5, "deliver_at_ms": NOW}, InvalidMessage),
    ("body-str", {"body": "text"}, InvalidMessage),
    ("body-none", {"body": None}, InvalidMessage),
    ("body-bytearray", {"body": bytearray(b"x")}, InvalidMessage),
    ("body-memoryview", {"body": memoryview(b"x")}, InvalidMessage),
    ("body-int", {"body": 3}, InvalidMessage),
    ("topic-empty", {"topic": ""}, InvalidTopic),
    ("topic-128-chars", {"topic": "a" * 128}, InvalidTopic),
    ("topic-space", {"topic": "my topic"}, InvalidTopic),
    ("topic-slash", {"topic": "a/b"}, InvalidTopic),
    ("topic-non-ascii", {"topic": "ordrés"}, InvalidTopic),
    ("topic-percent", {"topic": "%x"}, InvalidTopic),
    ("topic-dlq", {"topic": "%DLQ%g"}, InvalidTopic),
    ("topic-retry", {"topic": "%RETRY%g"}, InvalidTopic),
    ("topic-none", {"topic": None}, InvalidTopic),
    ("topic-int", {"topic": 7}, InvalidTopic),
    ("topic-list", {"topic": ["t"]}, InvalidTopic),
    ("topic-bytes", {"topic": b"t"}, InvalidTopic),
    ("key-empty", {"key": ""}, InvalidMessage),
    ("key-nul", {"key": "a\x00b"}, InvalidMessage),
    ("key-513-chars", {"key": "k" * 513}, InvalidMessage),
    ("key-int", {"key": 42}, InvalidMessage),
    ("tags-int", {"tags": 1}, InvalidMessage),
    ("tags-too-long", {"tags": "t" * (MAX_TAGS_CHARS + 1)}, InvalidMessage),
    ("properties-int-value", {"properties": {"a": 1}}, InvalidMessage),
    ("properties-int-key", {"properties": {1: "a"}}, InvalidMessage),
    ("properties-list", {"properties": ["a"]}, InvalidMessage),
]


@pytest.mark.parametrize(
    ("kwargs", "error"), [pytest.param(kw, e, id=i) for i, kw, e in BAD_MESSAGES]
)
def test_bad_message_raises_the_exact_error(kwargs: dict[str, Any], error: type[Exception]) -> None:
    args = {"topic": "t", "body": b"x"} | kwargs
    with pytest.raises(error) as info:
        Message(**args)
    assert type(info.value) is error
    assert isinstance(info.value, ChronoqError)
    assert isinstance(info.value, ValueError)
    assert str(info.value)  # says what was wrong


@pytest.mark.parametrize("field", ["delay_ms", "delay_level", "deliver_at_ms"])
def test_invalid_delay_names_the_field_and_value(field: str) -> None:
    with pytest.raises(InvalidDelay) as info:
        Message("t", b"", **{field: -3})
    assert (info.value.field, info.value.value) == (field, -3)
    assert field in str(info.value)


def test_invalid_topic_keeps_the_topic() -> None:
    with pytest.raises(InvalidTopic) as info:
        Message("bad topic", b"")
    assert info.value.topic == "bad topic"
    assert "bad topic" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"topic": "a" * 127},
        {"topic": "Orders_2024.v1-eu"},
        {"key": "k" * 512},
        {"key": "order:42"},
        {"tags": "t" * MAX_TAGS_CHARS},
        {"properties": {}},
        {"body": b""},
        {"delay_ms": 0},
        {"delay_sec": 0},
        {"delay_sec": 2},
        {"delay_level": 0},
        {"delay_level": 1000},
        {"deliver_at_ms": 0},
    ],
    ids=lambda kw: ",".join(f"{k}={str(v)[:12]}" for k, v in kw.items()),
)
def test_good_message_edge_values_are_accepted(kwargs: dict[str, Any]) -> None:
    args = {"topic": "t", "body": b"x"} | kwargs
    msg = Message(**args)
    assert msg.topic == args["topic"]


def test_message_is_frozen_and_properties_are_a_read_only_copy() -> None:
    props = {"a": "1"}
    msg = Message("t", b"x", properties=props)
    props["a"] = "changed"
    assert msg.properties is not None and dict(msg.properties) == {"a": "1"}
    with pytest.raises(TypeError):
        msg.properties["b"] = "2"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.topic = "other"  # type: ignore[misc]


EXPECTED_LEVEL_SECONDS = [
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
]


@pytest.mark.parametrize(("level", "seconds"), list(enumerate(EXPECTED_LEVEL_SECONDS, start=1)))
def test_delay_levels_1_to_18_are_rocketmq_values(level: int, seconds: int) -> None:
    msg = Message("t", b"", delay_level=level)
    assert msg.relative_delay_ms() == seconds * 1000
    assert msg.deliver_at(NOW) == NOW + seconds * 1000
    assert DELAY_LEVELS[level - 1] == seconds * 1000


@pytest.mark.parametrize("level", [19, 20, 100, 10**9])
def test_delay_levels_above_18_clamp_to_2h(level: int) -> None:
    assert Message("t", b"", delay_level=level).deliver_at(NOW) == NOW + 7_200_000


def test_delay_level_0_means_now() -> None:
    msg = Message("t", b"", delay_level=0)
    assert msg.relative_delay_ms() == 0
    assert msg.deliver_at(NOW) == NOW


@pytest.mark.parametrize(
    ("kwargs", "due"),
    [
        ({}, NOW),
        ({"delay_ms": 0}, NOW),
        ({"delay_ms": 30_000}, NOW + 30_000),
        ({"delay_sec": 1.5}, NOW + 1_500),
        ({"delay_sec": 0.001}, NOW + 1),
        ({"delay_sec": 3}, NOW + 3_000),
        ({"deliver_at_ms": NOW + 5}, NOW + 5),
        ({"deliver_at_ms": NOW - 60_000}, NOW),  # a past time means now
        ({"deliver_at_ms": 0}, NOW),
    ],
    ids=["none", "ms0", "ms", "sec-float", "sec-1ms", "sec-int", "at-future", "at-past", "at-0"],
)
def test_deliver_at_resolves_each_timing_field(kwargs: dict[str, Any], due: int) -> None:
    assert Message("t", b"", **kwargs).deliver_at(NOW) == due


def test_relative_delay_is_none_only_for_absolute_time() -> None:
    assert Message("t", b"", deliver_at_ms=NOW).relative_delay_ms() is None
    assert Message("t", b"").relative_delay_ms() == 0


@pytest.mark.parametrize(
    ("attempt", "backoff_s"),
    [(1, 10), (2, 30), (3, 60), (4, 120), (15, 3600), (16, 7200), (17, 7200), (100, 7200)],
)
def test_retry_backoff_follows_rocketmq(attempt: int, backoff_s: int) -> None:
    assert retry_backoff_ms(attempt) == backoff_s * 1000


def test_system_topics_are_subscribable_but_not_sendable() -> None:
    assert dead_letter_topic("billing") == "%DLQ%billing"
    assert retry_topic("billing") == "%RETRY%billing"
    assert check_topic("%DLQ%billing", allow_system=True) == "%DLQ%billing"
    assert check_topic("%RETRY%billing", allow_system=True) == "%RETRY%billing"
    with pytest.raises(InvalidTopic):
        check_topic("%DLQ%billing")
    with pytest.raises(InvalidTopic):
        check_topic("%OTHER%billing", allow_system=True)


def test_dead_letter_topic_of_every_valid_group_is_subscribable() -> None:
    """Any group name a consumer accepts (a topic-like name) has a subscribable DLQ."""
    group = "g" * 127  # valid as a topic name, hence as a group name
    check_topic(group)
    assert check_topic(dead_letter_topic(group), allow_system=True) == dead_letter_topic(group)


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (InvalidMessage, (ChronoqError, ValueError)),
        (InvalidDelay, (InvalidMessage,)),
        (InvalidTopic, (InvalidMessage,)),
        (MessageTooLarge, (InvalidMessage,)),
        (InvalidArgument, (ChronoqError, ValueError)),
        (UnknownScheme, (ChronoqError, ValueError)),
        (MessageNotFound, (ChronoqError, LookupError)),
        (BrokerClosed, (BrokerError,)),
        (BrokerLocked, (BrokerError,)),
        (BrokerError, (ChronoqError,)),
    ],
)
def test_error_tree(error: type[Exception], bases: tuple[type[Exception], ...]) -> None:
    assert all(issubclass(error, b) for b in bases)


def test_error_messages_are_built_from_fields() -> None:
    too_large = MessageTooLarge(5_000_000, 4_194_304)
    assert (too_large.size, too_large.limit) == (5_000_000, 4_194_304)
    assert "5000000" in str(too_large) and "4194304" in str(too_large)
    locked = BrokerLocked("/data", "pid 123")
    assert "/data" in str(locked) and "pid 123" in str(locked)


# -- with_body: the copies schedule_many sends ------------------------------------------

TEMPLATE = Message("t", b"", None, "job.name", {"p": "1"}, delay_ms=5000)


def test_with_body_copies_everything_but_body_and_key() -> None:
    copy = TEMPLATE.with_body(b"body", "order:1")
    assert copy == dataclasses.replace(TEMPLATE, body=b"body", key="order:1")
    assert (copy.body, copy.key) == (b"body", "order:1")
    assert TEMPLATE.with_body(b"x").key is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.body = b"other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [pytest.param(kw, e, id=i) for i, kw, e in BAD_MESSAGES if set(kw) <= {"body", "key"}],
)
def test_with_body_refuses_what_the_constructor_refuses(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        TEMPLATE.with_body(kwargs.get("body", b"x"), kwargs.get("key"))
    assert type(info.value) is error


def test_with_body_of_a_subclass_keeps_the_subclass() -> None:
    class Tagged(Message):
        pass

    copy = Tagged("t", b"x", tags="a").with_body(b"y", "k")
    assert type(copy) is Tagged
    assert (copy.body, copy.key, copy.tags) == (b"y", "k", "a")
