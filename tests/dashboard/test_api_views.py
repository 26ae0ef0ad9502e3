"""The pure parts of the API's answers, on many shapes of data: job calls cut to
size (and never more than asked), text previews of other bodies, the lateness CDF
and its nearest-rank percentiles (the same as ``chronoq report``'s)."""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter import MessageState, MessageView, ReceivedMessage
from scheduler.jobcall import JobCall
from spark_tasks.pipelines.delivery_report import nearest_rank as report_nearest_rank
from workers.dashboard.lateness import TraceIndex, cdf, nearest_rank
from workers.dashboard.views import MAX_CALL_CHARS, MAX_STRING, body_doc, message_doc
from workers.trace import DeliveryTrace

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=400),
    lambda inner: st.lists(inner, max_size=30) | st.dictionaries(st.text(max_size=20), inner),
    max_leaves=60,
)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    return []


@settings(max_examples=80, deadline=None)
@given(args=st.lists(json_values, max_size=20), kwargs=st.dictionaries(st.text(), json_values))
def test_a_job_call_is_shown_cut_to_size_and_flagged(args: list[object], kwargs: dict) -> None:  # type: ignore[type-arg]
    doc = body_doc(JobCall("shop.job", tuple(args), kwargs).encode(), "shop.job")
    assert doc["job"] == "shop.job" and doc["body_preview"] is None
    shown = json.dumps([doc["args"], doc["kwargs"]])
    # Budget plus the cost of the JSON punctuation around what fit.
    assert len(shown) <= 3 * MAX_CALL_CHARS
    assert all(len(s) <= MAX_STRING + 1 for s in _strings([doc["args"], doc["kwargs"]]))
    if not doc["truncated"]:
        assert doc["args"] == args and doc["kwargs"] == kwargs  # nothing cut: all of it


def test_a_short_call_is_shown_whole() -> None:
    doc = body_doc(JobCall("j", (1, "a", [True, None]), {"k": {"x": 1.5}}).encode(), "j")
    assert doc == {
        "job": "j",
        "args": [1, "a", [True, None]],
        "kwargs": {"k": {"x": 1.5}},
        "body_preview": None,
        "truncated": False,
    }


def test_a_huge_call_is_cut_and_flagged() -> None:
    doc = body_doc(JobCall("j", (list(range(100_000)), "z" * 10_000)).encode(), "j")
    assert doc["truncated"] is True
    assert len(doc["args"][0]) <= 100
    assert len(json.dumps(doc)) < 3 * MAX_CALL_CHARS


def test_other_bodies_get_a_text_preview() -> None:
    assert body_doc(None, "t")["job"] == "t"  # no body known: the tags say the job
    doc = body_doc(b"\x00\xffhello", None)
    assert doc["body_preview"] == "\x00\ufffdhello" and doc["truncated"] is False
    assert doc["args"] is None and doc["kwargs"] is None
    doc = body_doc(b'{"v": 2, "job": "x"}', None)  # another wire version: text
    assert doc["body_preview"] == '{"v": 2, "job": "x"}'
    doc = body_doc(("é" * 3000).encode(), None)
    assert doc["body_preview"] == "é" * 500 and doc["truncated"] is True


def test_message_doc_has_every_field_of_the_agreed_shape() -> None:
    view = MessageView(
        "abc",
        "t",
        MessageState.DEAD,
        5,
        1,
        attempts=16,
        key="k",
        tags="j",
        body_size=9,
        groups={"g": MessageState.DEAD},
        error="boom",
        body=JobCall("j", (1,)).encode(),
    )
    doc = message_doc(view)
    fields = "msg_id topic state deliver_at_ms born_ms attempts key tags job args kwargs"
    fields += " body_size body_preview error groups"
    assert set(fields.split()) <= set(doc)
    assert doc["groups"] == {"g": "DEAD"} and doc["state"] == "DEAD" and doc["args"] == [1]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-1000, 10**6), min_size=1, max_size=1000))
def test_percentiles_are_the_delivery_reports_nearest_rank(values: list[int]) -> None:
    ordered = sorted(values)
    for f in (0.5, 0.9, 0.99, 0.999, 1.0):
        assert nearest_rank(ordered, f) == report_nearest_rank(values, f)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-1000, 10**6), min_size=1, max_size=1000))
def test_the_cdf_is_at_most_200_rising_points_ending_at_the_max(values: list[int]) -> None:
    ordered = sorted(values)
    points = cdf(ordered)
    assert 1 <= len(points) <= 200
    assert points[-1] == [ordered[-1], 1.0]
    for a, b in itertools.pairwise(points):
        assert a[0] < b[0] and a[1] < b[1]
    for value, fraction in points:  # each point is exact: the share at or below it
        assert fraction == sum(v <= value for v in ordered) / len(ordered)


def test_cdf_of_a_million_values_stays_small() -> None:
    rng = random.Random(3)
    ordered = sorted(rng.randrange(10_000) for _ in range(1_000_000))
    points = cdf(ordered)
    assert len(points) <= 200 and points[-1][1] == 1.0


def test_lateness_read_from_a_trace_the_dispatchers_writer_wrote(tmp_path: Path) -> None:
    trace = DeliveryTrace(tmp_path, flush_interval_s=0.01)
    now = int(time.time() * 1000)
    want = []
    for i in range(50):
        due = now - 10_000 + i
        m = ReceivedMessage(f"{i:016x}", "t", b"", due, due - 5, 1, b"r", key=f'k"{i}')
        trace.received([m], due + 1)
        if i % 10 != 9:  # every tenth never reached its executor
            trace.dispatched(m, due + 2 + i)
            want.append(2 + i if i % 5 == 4 else 3 + i)  # started, or dispatched when not
        started = None if i % 5 == 4 else due + 3 + i
        trace.finished(m, "job", "g", "ack", None, started, now)
    trace.close()
    assert (tmp_path / next(iter(os.listdir(tmp_path)))).read_text().count("\n") == 50
    index = TraceIndex(tmp_path)
    assert sorted(index.lateness(now - 60_000)) == sorted(want)
    assert index.lateness(now + 1) == []  # all finished before that


def _line(due: int, start: int, finished: int) -> bytes:
    return (
        f'{{"v":1,"topic":"t","job":"j","group":"g","msg_id":"00","key":null,"attempt":1,'
        f'"sent_ms":{due},"deliver_at_ms":{due},"fired_ms":{due},"dispatched_ms":{start},'
        f'"started_ms":{start},"finished_ms":{finished},"outcome":"ok","error":null}}\n'
    ).encode()


def test_the_index_reads_what_was_appended_and_forgets_rotated_files(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    index = TraceIndex(tmp_path)
    assert index.lateness(now - 1000) == []
    first = tmp_path / "trace-1-00000.jsonl"
    first.write_bytes(_line(now, now + 5, now) + _line(now, now + 7, now)[:40])
    assert index.lateness(now - 1000) == [5]  # the half-written line waits
    with first.open("ab") as f:
        f.write(_line(now, now + 7, now)[40:] + _line(now, now + 9, now - 5000))
    assert sorted(index.lateness(now - 1000)) == [5, 7]
    assert sorted(index.lateness(now - 10_000)) == [5, 7, 9]
    second = tmp_path / "trace-1-00001.jsonl"
    second.write_bytes(_line(now, now + 11, now))
    assert sorted(index.lateness(now - 1000)) == [5, 7, 11]
    first.unlink()  # rotated away
    assert index.lateness(now - 1000) == [11]
    second.write_bytes(b"")  # replaced by a shorter file: read again from its start
    assert index.lateness(now - 1000) == []
