"""The pure parts of the API's answers, on many shapes of data: job calls cut to
size (and never more than asked), text previews of other bodies, the lateness CDF
and its nearest-rank percentiles (the same as ``chronoq report``'s)."""

from __future__ import annotations

import itertools
import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter import MessageState, MessageView
from scheduler.jobcall import JobCall
from spark_tasks.pipelines.delivery_report import nearest_rank as report_nearest_rank
from workers.dashboard.lateness import cdf, nearest_rank
from workers.dashboard.views import MAX_CALL_CHARS, MAX_STRING, body_doc, message_doc

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
