"""JobSpec, RetryPolicy, MisfirePolicy, CronSpec and cron keys."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.base import retry_backoff_ms
from broker_adapter.errors import InvalidTopic
from scheduler.errors import InvalidJobSpec
from scheduler.spec import (
    MAX_NAME_CHARS,
    CronSpec,
    JobSpec,
    MisfirePolicy,
    RetryPolicy,
    check_job_name,
    cron_key,
    parse_cron_key,
)
from scheduler.triggers import CronTrigger


def close_order(order_id: int) -> None:
    """A job function."""


def test_for_function_names_job_module_qualname() -> None:
    spec = JobSpec.for_function(close_order)
    assert spec.name == f"{__name__}.close_order"
    assert spec.origin == spec.name
    assert (spec.executor, spec.max_attempts, spec.timeout, spec.topic) == ("local", 16, None, None)
    assert JobSpec.for_function(close_order, name="orders.close").name == "orders.close"


def test_options_are_normalised() -> None:
    spec = JobSpec(
        "j",
        close_order,
        executor="celery",
        timeout=timedelta(minutes=2),  # type: ignore[arg-type]
        topic="shop.jobs",
        queue="slow",
    )
    assert spec.timeout == 120.0
    assert spec.topic_or("default") == "shop.jobs"
    assert JobSpec("k", close_order).topic_or("default") == "default"


def test_jobspec_is_frozen() -> None:
    spec = JobSpec("j", close_order)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": 5}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "tab\there"}, "name"),
        ({"name": "x" * (MAX_NAME_CHARS + 1)}, "name"),
        ({"func": "not callable"}, "func"),
        ({"executor": "thread"}, "executor"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"max_attempts": 10_000}, "max_attempts"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.0}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": "30"}, "timeout"),
        ({"queue": "q"}, "queue"),
        ({"executor": "celery", "queue": ""}, "queue"),
        ({"retry": 3}, "retry"),
    ],
)
def test_bad_job_options(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"name": "job", "func": close_order, **kwargs}
    with pytest.raises(InvalidJobSpec) as info:
        JobSpec(**args)
    assert info.value.field == field
    assert field in str(info.value)


def test_bad_topic_is_the_broker_topic_error() -> None:
    with pytest.raises(InvalidTopic):
        JobSpec("job", close_order, topic="no spaces")


def test_longest_name_fits_a_cron_key() -> None:
    name = check_job_name("n" * MAX_NAME_CHARS)
    assert len(cron_key(name, 10**19)) <= 512


def test_default_retry_is_rocketmq_backoff() -> None:
    policy = RetryPolicy()
    assert [policy.backoff_ms(n) for n in range(1, 21)] == [
        retry_backoff_ms(n) for n in range(1, 21)
    ]
    assert policy.backoff_ms(1) == 10_000 and policy.backoff_ms(2) == 30_000
    assert policy.backoff_ms(100) == 7_200_000


def test_custom_retry_delays_repeat_the_last() -> None:
    policy = RetryPolicy(delays_ms=(100, 200))
    assert [policy.backoff_ms(n) for n in (1, 2, 3, 9)] == [100, 200, 200, 200]
    assert RetryPolicy.fixed(timedelta(seconds=1.5)).backoff_ms(7) == 1500
    assert RetryPolicy.fixed(2).delays_ms == (2000,)


@pytest.mark.parametrize("attempt", [0, -1, True, 1.0])
def test_backoff_attempt_counts_from_one(attempt: Any) -> None:
    with pytest.raises(ValueError, match="counted from 1"):
        RetryPolicy().backoff_ms(attempt)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delays_ms": (-1,)},
        {"delays_ms": (1.5,)},
        {"retry_on": (int,)},
        {"retry_on": ("ValueError",)},
    ],
)
def test_bad_retry_policy(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidJobSpec):
        RetryPolicy(**kwargs)


def test_retry_on_filters_exceptions() -> None:
    policy = RetryPolicy(retry_on=(ConnectionError,))
    assert policy.should_retry(ConnectionResetError())
    assert not policy.should_retry(ValueError())
    assert RetryPolicy().should_retry(KeyError())
    assert not RetryPolicy().should_retry(KeyboardInterrupt())


def test_misfire_policy_defaults_and_units() -> None:
    assert MisfirePolicy() == MisfirePolicy(grace_s=None, coalesce="latest", max_catch_up=100)
    assert MisfirePolicy().grace_ms is None
    # timedelta is accepted at run time and stored as float seconds
    assert MisfirePolicy(grace_s=timedelta(minutes=1)).grace_ms == 60_000  # type: ignore[arg-type]
    assert MisfirePolicy(grace_s=0.0015).grace_ms == 2
    assert MisfirePolicy(grace_s=0).grace_ms == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"grace_s": -1}, "misfire_grace_time"),
        ({"grace_s": float("nan")}, "misfire_grace_time"),
        ({"coalesce": "first"}, "coalesce"),
        ({"max_catch_up": 0}, "max_catch_up"),
    ],
)
def test_bad_misfire_policy(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJobSpec) as info:
        MisfirePolicy(**kwargs)
    assert info.value.field == field


def test_cron_spec_keys() -> None:
    cron = CronSpec(JobSpec("nightly.cleanup", close_order), CronTrigger("0 5 * * *"))
    assert cron.name == "nightly.cleanup"
    assert cron.key(1_700_000_000_000) == "cron:nightly.cleanup:1700000000000"
    assert parse_cron_key(cron.key(42)) == ("nightly.cleanup", 42)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_running": 0}, "max_running"),
        ({"jitter": -1}, "jitter"),
        ({"trigger": "0 5 * * *"}, "trigger"),
        ({"misfire": {"grace_s": 1}}, "misfire"),
    ],
)
def test_bad_cron_spec(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {
        "job": JobSpec("j", close_order),
        "trigger": CronTrigger("@daily"),
        **kwargs,
    }
    with pytest.raises(InvalidJobSpec) as info:
        CronSpec(**args)
    assert info.value.field == field


@pytest.mark.parametrize(
    "key",
    [
        "order:42",
        "cron:",
        "cron:name",
        "cron::5",
        "cron:name:",
        "cron:name:-5",
        "cron:name:12a",
        "cron:name:²",
    ],
)
def test_parse_cron_key_rejects_other_keys(key: str) -> None:
    assert parse_cron_key(key) is None


@given(
    name=st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=40
    ).filter(lambda s: s.isprintable() and not any(c.isspace() for c in s)),
    fire_ms=st.integers(min_value=0, max_value=2**63 - 1),
)
def test_cron_key_round_trips(name: str, fire_ms: int) -> None:
    assert parse_cron_key(cron_key(check_job_name(name), fire_ms)) == (name, fire_ms)
