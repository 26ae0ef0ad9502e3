"""Spark settings (``CHRONOQ_SPARK_*``), read by spark_tasks rather than the scheduler."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scheduler.errors import InvalidSettings
from scheduler.executor_kinds import EXECUTOR_KINDS
from spark_tasks.settings import ENV_PREFIX, SparkSettings


def test_defaults_and_the_variable() -> None:
    assert SparkSettings.from_env({}) == SparkSettings() and SparkSettings().master is None
    s = SparkSettings.from_env({"CHRONOQ_SPARK_MASTER": " local[2] ", "CHRONOQ_TOPIC": "x"})
    assert s.master == "local[2]"
    assert SparkSettings.from_env({"CHRONOQ_SPARK_MASTER": "  "}).master is None
    assert set(SparkSettings.env_names().values()) == {"CHRONOQ_SPARK_MASTER"}


def test_the_spark_kind_owns_the_prefix() -> None:
    assert EXECUTOR_KINDS.get("spark").env_prefix == ENV_PREFIX == "CHRONOQ_SPARK_"


def test_overrides_win_and_unknown_ones_are_errors() -> None:
    assert SparkSettings.from_env({"CHRONOQ_SPARK_MASTER": "yarn"}, master="local[1]").master == (
        "local[1]"
    )
    with pytest.raises(InvalidSettings, match="no such Spark setting.*master"):
        SparkSettings.from_env({}, mastr="yarn")


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOQ_SPARK_MASTER", "spark://127.0.0.1:7077")
    assert SparkSettings.from_env().master == "spark://127.0.0.1:7077"


def test_unknown_spark_variable_is_logged_with_suggestion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="chronoq.spark_tasks.SparkSettings"):
        SparkSettings.from_env({"CHRONOQ_SPARK_MASTR": "yarn"})
    assert "CHRONOQ_SPARK_MASTR" in caplog.text and "CHRONOQ_SPARK_MASTER?" in caplog.text


@pytest.mark.parametrize("master", ["", 7, b"yarn"])
def test_bad_master(master: Any) -> None:
    with pytest.raises(InvalidSettings) as info:
        SparkSettings(master=master)
    assert (info.value.field, info.value.env) == ("master", "CHRONOQ_SPARK_MASTER")
