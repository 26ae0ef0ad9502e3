"""Settings: defaults, CHRONOQ_* variables, overrides and validation at construction."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from scheduler.errors import InvalidSettings
from scheduler.settings import DEFAULT_BROKER_URL, Settings


def test_defaults_are_safe_and_documented() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.broker_url == DEFAULT_BROKER_URL == "rocksdb://./chronoq-data"
    assert (s.topic, s.group) == ("chronoq.jobs", "chronoq.workers")
    assert (s.max_workers, s.prefetch, s.past_tolerance_ms) == (8, 32, 1000)
    assert (s.log_level, s.token) == ("INFO", None)
    assert (s.metrics_port, s.metrics_host) == (None, "127.0.0.1")
    assert s.inline_jobs is True


def test_every_variable_is_read() -> None:
    env = {
        "CHRONOQ_BROKER_URL": "chronoq://127.0.0.1:7420",
        "CHRONOQ_TOPIC": "shop.jobs",
        "CHRONOQ_GROUP": "shop-workers",
        "CHRONOQ_MAX_WORKERS": "16",
        "CHRONOQ_PREFETCH": " 64 ",
        "CHRONOQ_INLINE_JOBS": "off",
        "CHRONOQ_PAST_TOLERANCE_MS": "5000",
        "CHRONOQ_LOG_LEVEL": "debug",
        "CHRONOQ_TOKEN": "s3cret",
        "CHRONOQ_METRICS_PORT": "9464",
        "CHRONOQ_METRICS_HOST": "0.0.0.0",
        "UNRELATED": "ignored",
    }
    s = Settings.from_env(env)
    assert (s.metrics_port, s.metrics_host) == (9464, "0.0.0.0")
    assert s.broker_url == "chronoq://127.0.0.1:7420"
    assert (s.topic, s.group) == ("shop.jobs", "shop-workers")
    assert (s.max_workers, s.prefetch, s.past_tolerance_ms) == (16, 64, 5000)
    assert (s.log_level, s.token) == ("DEBUG", "s3cret")
    assert s.inline_jobs is False
    assert set(Settings.env_names().values()) == {k for k in env if k.startswith("CHRONOQ_")}


@pytest.mark.parametrize(
    ("raw", "value"),
    [("true", True), ("1", True), ("Yes", True), ("ON", True), ("false", False), ("0", False)],
)
def test_a_boolean_variable_takes_the_usual_spellings(raw: str, value: bool) -> None:
    assert Settings.from_env({"CHRONOQ_INLINE_JOBS": raw}).inline_jobs is value


def test_empty_variable_counts_as_unset() -> None:
    s = Settings.from_env({"CHRONOQ_MAX_WORKERS": "", "CHRONOQ_TOKEN": "  "})
    assert (s.max_workers, s.token) == (8, None)


def test_overrides_win_over_environment() -> None:
    s = Settings.from_env({"CHRONOQ_PREFETCH": "64", "CHRONOQ_TOPIC": "a"}, prefetch=4)
    assert (s.prefetch, s.topic) == (4, "a")


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOQ_TOPIC", "from.os.environ")
    assert Settings.from_env().topic == "from.os.environ"


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(InvalidSettings, match="no such setting.*max_workers"):
        Settings.from_env({}, max_worker=3)


def test_unknown_variable_is_logged_with_suggestion(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="chronoq.scheduler.Settings"):
        Settings.from_env({"CHRONOQ_MAX_WORKER": "3"})
    assert "CHRONOQ_MAX_WORKER" in caplog.text and "CHRONOQ_MAX_WORKERS" in caplog.text
    assert caplog.records[0].name == "chronoq.scheduler.Settings"


def test_variables_of_an_executor_kind_are_left_to_its_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given the spark kind's variable (spark_tasks.settings reads it) and a typo
    env = {"CHRONOQ_SPARK_MASTER": "local[2]", "CHRONOQ_SPARK_MASTR": "x", "CHRONOQ_TOPC": "a"}
    with caplog.at_level(logging.WARNING, logger="chronoq.scheduler.Settings"):
        s = Settings.from_env(env)
    # Then the scheduler's settings neither read nor warn about CHRONOQ_SPARK_*
    assert s == Settings()
    assert "CHRONOQ_TOPC" in caplog.text and "CHRONOQ_SPARK" not in caplog.text
    assert "spark_master" not in Settings.env_names()


def test_token_is_not_in_repr() -> None:
    s = Settings(token="s3cret")
    assert "s3cret" not in repr(s)


def test_frozen_and_replace_revalidates() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.prefetch = 3  # type: ignore[misc]
    assert dataclasses.replace(s, prefetch=3).prefetch == 3
    with pytest.raises(InvalidSettings):
        dataclasses.replace(s, prefetch=0)


@pytest.mark.parametrize(
    ("env", "field", "fragment"),
    [
        ({"CHRONOQ_MAX_WORKERS": "abc"}, "max_workers", "whole number"),
        ({"CHRONOQ_MAX_WORKERS": "1.5"}, "max_workers", "whole number"),
        ({"CHRONOQ_MAX_WORKERS": "0"}, "max_workers", "between 1 and"),
        ({"CHRONOQ_MAX_WORKERS": "100000"}, "max_workers", "between 1 and"),
        ({"CHRONOQ_PREFETCH": "-1"}, "prefetch", "between 1 and"),
        ({"CHRONOQ_PAST_TOLERANCE_MS": "-5"}, "past_tolerance_ms", "between 0 and"),
        ({"CHRONOQ_PAST_TOLERANCE_MS": "999999999"}, "past_tolerance_ms", "between 0 and"),
        ({"CHRONOQ_LOG_LEVEL": "LOUD"}, "log_level", "DEBUG, INFO"),
        ({"CHRONOQ_INLINE_JOBS": "maybe"}, "inline_jobs", "true or false"),
        ({"CHRONOQ_TOPIC": "bad topic"}, "topic", "letters, digits"),
        ({"CHRONOQ_TOPIC": "%DLQ%x"}, "topic", "reserved"),
        ({"CHRONOQ_GROUP": "g" * 121}, "group", "120 characters"),
        ({"CHRONOQ_BROKER_URL": "./data"}, "broker_url", "scheme://"),
        ({"CHRONOQ_BROKER_URL": "mysql://db/x"}, "broker_url", "unknown scheme 'mysql'"),
        ({"CHRONOQ_BROKER_URL": "rocksdb://"}, "broker_url", "names no location"),
    ],
)
def test_bad_variables(env: dict[str, str], field: str, fragment: str) -> None:
    with pytest.raises(InvalidSettings) as info:
        Settings.from_env(env)
    assert info.value.field == field
    assert info.value.env == "CHRONOQ_" + field.upper()
    assert info.value.env in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_workers": True}, "max_workers"),
        ({"max_workers": 2.0}, "max_workers"),
        ({"prefetch": "32"}, "prefetch"),
        ({"broker_url": None}, "broker_url"),
        ({"topic": 5}, "topic"),
        ({"log_level": None}, "log_level"),
        ({"token": 123}, "token"),
        ({"inline_jobs": "no"}, "inline_jobs"),
    ],
)
def test_bad_constructor_values(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSettings) as info:
        Settings(**kwargs)
    assert info.value.field == field


def test_bad_token_value_is_not_echoed() -> None:
    with pytest.raises(InvalidSettings) as info:
        Settings(token="")
    assert "<hidden>" in str(info.value)
