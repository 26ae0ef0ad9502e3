"""The delivery trace's file format, shared by its writer (workers) and reader (spark_tasks)."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from scheduler.trace_format import (
    FIELDS,
    FILE_GLOB,
    TRACE_OUTCOMES,
    default_trace_dir,
    trace_file_name,
)


def test_file_names_sort_in_writing_order_and_match_the_glob() -> None:
    names = [trace_file_name(1_700_000_000_000, n) for n in (1, 2, 10, 99_999)]
    assert names[0] == "trace-1700000000000-00001.jsonl"
    assert sorted(names) == names
    assert all(fnmatch(n, FILE_GLOB) for n in names)
    assert not fnmatch("trace-1-00001.json", FILE_GLOB)


def test_default_dir_is_under_a_rocksdb_data_dir_only() -> None:
    assert default_trace_dir("rocksdb:///var/lib/chronoq") == Path("/var/lib/chronoq/trace")
    assert default_trace_dir("rocksdb://./data?durability=sync") == Path("./data/trace")
    assert default_trace_dir("chronoq://127.0.0.1:7420") is None
    assert default_trace_dir("redis://127.0.0.1:6379/0") is None


def test_the_writer_and_the_reader_share_the_schema() -> None:
    from spark_tasks.pipelines.delivery_report import TRACE_DDL
    from workers.trace import OUTCOMES

    ddl_columns = [column.split()[0].strip("`") for column in TRACE_DDL.split(", ")]
    assert sorted(ddl_columns) == sorted(FIELDS)
    assert set(OUTCOMES.values()) == set(TRACE_OUTCOMES)
