"""The shared-session helper: configuration rules (no JVM) and the live session."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from spark_tasks.session import (
    LOOPBACK_CONF,
    active_spark,
    get_spark,
    parse_conf,
    session_conf,
)


def test_parse_conf_reads_pairs_and_refuses_non_spark_keys() -> None:
    assert parse_conf("spark.a=1, spark.b = x=y\nspark.c=") == {
        "spark.a": "1",
        "spark.b": "x=y",
        "spark.c": "",
    }
    with pytest.raises(ValueError, match="spark.key=value"):
        parse_conf("executor.memory=2g")
    with pytest.raises(ValueError, match="spark.key=value"):
        parse_conf("spark.a")


def test_local_masters_get_loopback_and_arguments_win_over_env() -> None:
    env = {"SPARK_CONF": "spark.sql.shuffle.partitions=7,spark.driver.host=10.0.0.1"}
    local = session_conf("local[2]", {"spark.sql.shuffle.partitions": "3"}, env)
    assert local["spark.sql.shuffle.partitions"] == "3"  # argument beats env
    assert local["spark.driver.host"] == "10.0.0.1"  # env beats the loopback default
    assert local["spark.driver.bindAddress"] == "127.0.0.1"
    cluster = session_conf("spark://master:7077", None, {})
    assert not set(LOOPBACK_CONF) & set(cluster)


@pytest.mark.external_service
def test_one_shared_session_on_loopback(spark: Any) -> None:
    assert get_spark() is spark is active_spark()
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.master") == "local[2]"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert spark.range(5).selectExpr("sum(id)").first()[0] == 10
