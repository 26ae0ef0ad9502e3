"""The dashboard's JSON API over real HTTP (``chronoq dashboard`` in a subprocess) on
a ``rocksdb://`` directory this process owns: every read on real data, and every
action checked through the broker afterwards."""

from __future__ import annotations

import itertools
import json
import time
from datetime import timedelta
from typing import Any

from broker_adapter import Message, MessageState
from spark_tasks.pipelines.delivery_report import nearest_rank
from tests.dashboard.conftest import DashboardProc, ids
from tests.helpers import eventually
from workers.job_stats import LATENESS_BOUNDS_S, JobStatsLog, Totals, lateness_bucket

HOUR = timedelta(hours=1)


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_config_answers_without_the_token(dashboard: DashboardProc) -> None:
    r = dashboard.get("api/config", token=False)
    assert r.status_code == 200
    doc = r.json()
    assert doc["token_required"] is True
    assert doc["broker_kind"] == "rocksdb"
    assert doc["lateness_available"] is True
    assert isinstance(doc["version"], str) and doc["version"]
    assert abs(doc["now_ms"] - _now_ms()) < 60_000


def test_overview_counts_what_the_broker_counts(dashboard: DashboardProc) -> None:
    close = dashboard.app.handle("shop.close_order")
    nightly = dashboard.app.handle("reports.nightly")
    for n in range(3):
        close.schedule(n, delay=HOUR, key=f"ov:{n}")
    nightly.schedule(delay=HOUR, key="ov:nightly")
    dashboard.app.schedules.add("ov-tenant", close, every=timedelta(hours=6), args=(7,))
    doc = dashboard.ok("api/overview")
    stats = dashboard.broker.stats()
    topics = {t["topic"]: t for t in doc["topics"]}
    assert topics["reports"]["pending"] == stats.topics["reports"].pending >= 1
    default = close.topic
    assert topics[default]["pending"] == stats.topics[default].pending >= 3
    assert not topics[default]["internal"]
    # The schedule's record is a pending message on an internal topic: counted apart.
    internal = {name for name, t in topics.items() if t["internal"]}
    assert "chronoq.schedules" in internal
    records = sum(stats.topics[name].pending for name in internal)
    assert records >= 1
    assert doc["totals"]["records"] == records
    assert doc["totals"]["pending"] == stats.pending - records
    assert set(doc["totals"]) == {"pending", "records", "ready", "inflight", "dead", "fired_total"}
    assert isinstance(doc["groups"], list)


def test_search_by_key_prefix_id_key_job_and_window_in_due_order(
    dashboard: DashboardProc,
) -> None:
    close = dashboard.app.handle("shop.close_order")
    remind = dashboard.app.handle("shop.remind")
    # Due out of order on purpose; two topics' worth of jobs share the prefix.
    sent = {
        n: close.schedule(n, delay=HOUR + timedelta(minutes=10 - n), key=f"s:{n}:close")
        for n in range(5)
    }
    r = remind.schedule("hello", delay=2 * HOUR, key="s:9:remind", who="ann")
    doc = dashboard.ok("api/messages", key_prefix="s:")
    items = doc["items"]
    assert [i["key"] for i in items] == [f"s:{n}:close" for n in (4, 3, 2, 1, 0)] + ["s:9:remind"]
    assert [i["deliver_at_ms"] for i in items] == sorted(i["deliver_at_ms"] for i in items)
    first = items[0]
    assert first["job"] == "shop.close_order" and first["args"] == [4] and first["kwargs"] == {}
    assert first["state"] == "PENDING" and first["msg_id"] == sent[4].msg_id
    assert items[-1]["kwargs"] == {"who": "ann"} and items[-1]["args"] == ["hello"]

    by_id = dashboard.ok("api/messages", id=sent[2].msg_id)["items"]
    assert ids(by_id) == [sent[2].msg_id] and by_id[0]["args"] == [2]
    by_key = dashboard.ok("api/messages", key="s:1:close", topic=close.topic)["items"]
    assert ids(by_key) == [sent[1].msg_id]
    assert dashboard.ok("api/messages", key="s:1:clos")["items"] == []  # exact, not a prefix
    by_job = dashboard.ok("api/messages", job="shop.remind")["items"]
    assert r.msg_id in ids(by_job) and all(i["job"] == "shop.remind" for i in by_job)
    window = dashboard.ok(
        "api/messages", start=sent[3].deliver_at_ms, end=sent[1].deliver_at_ms, key_prefix="s:"
    )["items"]
    assert ids(window) == [sent[3].msg_id, sent[2].msg_id]
    assert dashboard.ok("api/messages", id="ffff0000")["items"] == []


def test_search_pages_with_a_cursor_cover_everything_once(dashboard: DashboardProc) -> None:
    close = dashboard.app.handle("shop.close_order")
    nightly = dashboard.app.handle("reports.nightly")
    want = {close.schedule(n, delay=HOUR, key=f"pg:{n}").msg_id for n in range(7)}
    want |= {
        nightly.schedule(delay=HOUR + timedelta(seconds=n), key=f"pg:n{n}").msg_id for n in range(4)
    }
    for limits in ((3,), (2, 5, 1), (50,)):  # the limit may change from page to page
        seen: list[str] = []
        cursor = None
        for i in range(50):
            limit = limits[i % len(limits)]
            params: dict[str, Any] = {"key_prefix": "pg:", "limit": limit}
            if cursor:
                params["cursor"] = cursor
            doc = dashboard.ok("api/messages", **params)
            assert len(doc["items"]) <= limit
            seen += ids(doc["items"])
            cursor = doc["cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(want), limits  # all of them, none twice
        due = [dashboard.broker.query(i).deliver_at_ms for i in seen]  # type: ignore[union-attr]
        assert due == sorted(due)  # in due-time order across both topics
    bad = dashboard.get("api/messages", cursor="not-a-cursor")
    assert bad.status_code == 400 and bad.json()["error"] == "InvalidArgument"


def test_message_detail_decodes_and_cuts_arguments_as_plain_json(
    dashboard: DashboardProc,
) -> None:
    remind = dashboard.app.handle("shop.remind")
    evil = "\"'><img src=x onerror=alert(1)><script>alert(2)</script>"
    long_text = evil + "x" * 1000
    sent = remind.schedule(long_text, delay=HOUR, key=f"<script>{evil}", note=evil)
    r = dashboard.get(f"api/messages/{sent.msg_id}")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-content-type-options"] == "nosniff"
    doc = r.json()
    assert doc["key"] == f"<script>{evil}"  # as it is: escaping is the page's job
    assert doc["kwargs"] == {"note": evil}
    assert doc["args"][0].startswith(evil) and len(doc["args"][0]) == 201
    assert doc["truncated"] is True
    assert doc["job"] == "shop.remind" and doc["body_size"] > 1000
    assert set(doc["groups"]) == set() and doc["error"] is None
    for field in ("msg_id", "topic", "state", "deliver_at_ms", "born_ms", "attempts", "tags"):
        assert field in doc

    raw = b"\xff\xfeplain <b>body</b> " + b"y" * 2000
    res = dashboard.broker.send(Message("raw", raw, key="raw:1", delay_ms=3_600_000))
    doc = dashboard.ok(f"api/messages/{res.msg_id}")
    assert doc["args"] is None and doc["job"] is None
    assert doc["body_preview"].startswith("\ufffd\ufffdplain <b>body</b> y")
    assert len(doc["body_preview"]) == 500 and doc["truncated"] is True

    missing = dashboard.get("api/messages/0123456789abcdef")
    assert missing.status_code == 404 and missing.json()["error"] == "MessageNotFound"


def test_abort_then_the_broker_says_aborted(dashboard: DashboardProc) -> None:
    sent = dashboard.app.handle("shop.close_order").schedule(1, delay=HOUR, key="ab:1")
    doc = dashboard.ok(f"api/messages/{sent.msg_id}/abort", {})
    assert doc["status"] == "ABORTED"
    view = dashboard.broker.query(sent.msg_id)
    assert view is not None and view.state is MessageState.ABORTED
    assert dashboard.ok(f"api/messages/{sent.msg_id}/abort", {})["status"] == "ABORTED"
    assert dashboard.ok("api/messages/ffffffffffffffff/abort", {})["status"] == "NOT_FOUND"


def test_reschedule_moves_the_due_time_and_bad_input_changes_nothing(
    dashboard: DashboardProc,
) -> None:
    sent = dashboard.app.handle("shop.close_order").schedule(1, delay=HOUR, key="rs:1")
    at = _now_ms() + 2 * 3_600_000
    doc = dashboard.ok(f"api/messages/{sent.msg_id}/reschedule", {"at_ms": at})
    assert doc == {"status": "RESCHEDULED", "msg_id": sent.msg_id, "deliver_at_ms": at}
    view = dashboard.broker.query(sent.msg_id)
    assert view is not None and view.deliver_at_ms == at

    before = _now_ms()
    doc = dashboard.ok(f"api/messages/{sent.msg_id}/reschedule", {"delay_ms": 600_000})
    assert doc["status"] == "RESCHEDULED" and doc["deliver_at_ms"] >= before + 600_000
    moved = doc["deliver_at_ms"]
    for bad in (
        {},
        {"at_ms": at, "delay_ms": 5},
        {"delay_ms": -1},
        {"delay_ms": "soon"},
        {"at_ms": True},
        {"at_ms": 1},  # long past: refused by the broker (InvalidDelay)
    ):
        r = dashboard.post(f"api/messages/{sent.msg_id}/reschedule", bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"] in ("InvalidArgument", "InvalidDelay"), r.text
        view = dashboard.broker.query(sent.msg_id)
        assert view is not None and view.deliver_at_ms == moved  # nothing changed
    r = dashboard.post(f"api/messages/{sent.msg_id}/reschedule", [1, 2])
    assert r.status_code == 400 and r.json()["error"] == "InvalidArgument"


def test_run_now_makes_it_due_and_it_fires(dashboard: DashboardProc) -> None:
    sent = dashboard.app.handle("shop.close_order").schedule(7, delay=HOUR, key="rn:7")
    before = _now_ms()
    doc = dashboard.ok(f"api/messages/{sent.msg_id}/run-now", {})
    assert doc["status"] == "RESCHEDULED"
    assert before - 1000 <= doc["deliver_at_ms"] <= _now_ms() + 1000

    def fired() -> bool:
        view = dashboard.broker.query(sent.msg_id)
        return view is not None and view.state is not MessageState.PENDING

    eventually(fired, timeout=15, what="the run-now message fired")
    again = dashboard.ok(f"api/messages/{sent.msg_id}/run-now", {})
    assert again["status"] == "ALREADY_DELIVERED"


def test_cancel_prefix_preview_counts_then_cancel_aborts(dashboard: DashboardProc) -> None:
    close = dashboard.app.handle("shop.close_order")
    nightly = dashboard.app.handle("reports.nightly")
    sent = [close.schedule(n, delay=HOUR, key=f"cart:9:{n}") for n in range(6)]
    sent.append(nightly.schedule(delay=HOUR, key="cart:9:report"))
    close.schedule(1, delay=HOUR, key="cart:10:0")  # another prefix: untouched
    preview = dashboard.ok("api/cancel-prefix/preview", {"key_prefix": "cart:9:"})
    assert preview["count"] == 7 and preview["exact"] is True
    one_topic = dashboard.ok(
        "api/cancel-prefix/preview", {"key_prefix": "cart:9:", "topic": "reports"}
    )
    assert one_topic["count"] == 1
    doc = dashboard.ok("api/cancel-prefix", {"key_prefix": "cart:9:"})
    assert doc["aborted"] == 7
    assert doc["already_delivered_count"] == 0 and doc["already_delivered"] == []
    for s in sent:
        view = dashboard.broker.query(s.msg_id)
        assert view is not None and view.state is MessageState.ABORTED
    assert dashboard.ok("api/cancel-prefix/preview", {"key_prefix": "cart:9:"})["count"] == 0
    assert dashboard.ok("api/messages", key="cart:10:0")["items"] != []
    for bad in ({"key_prefix": "cron:"}, {"key_prefix": ""}, {}, {"key_prefix": 5}):
        r = dashboard.post("api/cancel-prefix", bad)
        assert r.status_code == 400 and r.json()["error"] == "InvalidArgument", (bad, r.text)
    assert dashboard.ok("api/messages", key="cart:10:0")["items"] != []


def test_due_histogram_counts_pending_per_bucket(dashboard: DashboardProc) -> None:
    nightly = dashboard.app.handle("reports.nightly")
    doc = dashboard.ok("api/due", range="hour", topic="reports")
    assert doc["bucket_ms"] == 60_000 and len(doc["counts"]) == 60
    before = list(doc["counts"])
    start = doc["start_ms"]
    at = start + 40 * 60_000 + 5  # the 41st minute
    for n in range(3):
        dashboard.broker.send(Message("reports", b"x", key=f"due:{n}", deliver_at_ms=at))
    doc = dashboard.ok("api/due", range="hour", topic="reports")
    if doc["start_ms"] == start:  # the same minute (else the buckets moved by one)
        assert doc["counts"][40] == before[40] + 3
        assert doc["exact"] is True
    assert sum(doc["counts"]) >= 3
    day = dashboard.ok("api/due", range="day")
    assert day["bucket_ms"] == 3_600_000 and len(day["counts"]) == 24
    week = dashboard.ok("api/due", range="week")
    assert week["bucket_ms"] == 86_400_000 and len(week["counts"]) == 7
    assert sum(week["counts"]) >= sum(day["counts"]) >= 3
    nightly.schedule(delay=HOUR)  # keeps the reports topic busy for later tests
    bad = dashboard.get("api/due", range="year")
    assert bad.status_code == 400 and bad.json()["error"] == "InvalidArgument"


def test_rates_show_the_fire_rate_sampled_from_the_broker(dashboard: DashboardProc) -> None:
    for n in range(20):
        dashboard.broker.send(Message("rates", b"x", key=f"rate:{n}", delay_ms=0))

    def fired_rate() -> list[dict[str, Any]]:
        doc = dashboard.ok("api/rates", minutes=15)
        assert doc["jobs"] == [] or isinstance(doc["jobs"], list)
        return [p for p in doc["fired"] if p["per_s"] > 0]

    points = eventually(fired_rate, timeout=20, what="a sample with fires")
    assert all(set(p) == {"t_ms", "per_s"} for p in points)
    r = dashboard.get("api/rates", minutes=0)
    assert r.status_code == 400


def _trace_line(due: int, start: int | None, finished: int, dispatched: int | None = None) -> str:
    rec = {
        "v": 1, "topic": "t", "job": "j", "group": "g", "msg_id": "00", "key": None,
        "attempt": 1, "sent_ms": due - 10, "deliver_at_ms": due, "fired_ms": due,
        "dispatched_ms": dispatched if dispatched is not None else start,
        "started_ms": start, "finished_ms": finished, "outcome": "ok", "error": None,
    }  # fmt: skip
    # Every other line as the dispatcher writes it (compact), the rest with spaces.
    compact = (due + (start or 0)) % 2 == 0
    return json.dumps(rec, separators=(",", ":") if compact else None) + "\n"


def test_lateness_cdf_and_nearest_rank_percentiles_from_the_trace(
    dashboard: DashboardProc,
) -> None:
    assert dashboard.data_dir is not None
    trace = dashboard.data_dir.parent / "trace"
    now = _now_ms()
    late = [(i * 7919) % 1000 for i in range(1000)] + [5000]
    lines = [_trace_line(now - 60_000, now - 60_000 + v, now - 1000) for v in late]
    lines.append(_trace_line(now - 60_000, None, now - 1000, dispatched=now - 60_000 + 3))
    old = _trace_line(now - 4 * 3_600_000, now - 3_600_000, now - 3 * 3_600_000)
    lines.append(old)  # finished before the window: left out
    lines.append('{"v": 1, "topic": "t", "deliver_at_ms": ')  # a line being written
    (trace / "trace-1-00000.jsonl").write_text("".join(lines))
    doc = dashboard.ok("api/lateness", minutes=60)
    values = [*late, 3]
    assert doc["available"] is True and doc["count"] == len(values)
    assert doc["p50_ms"] == nearest_rank(values, 0.5)
    assert doc["p99_ms"] == nearest_rank(values, 0.99)
    assert doc["p999_ms"] == nearest_rank(values, 0.999)
    assert doc["max_ms"] == 5000
    cdf = doc["cdf"]
    assert 2 <= len(cdf) <= 200 and cdf[-1] == [5000, 1.0]
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(cdf))


def test_openapi_is_served_and_the_cdn_doc_pages_are_off(dashboard: DashboardProc) -> None:
    doc = dashboard.ok("openapi.json")
    assert "/api/overview" in doc["paths"] and "/api/messages/{msg_id}/abort" in doc["paths"]
    for page in ("docs", "redoc"):
        assert dashboard.get(page).status_code == 404


def test_pages_are_served_with_the_security_headers(dashboard: DashboardProc) -> None:
    r = dashboard.http.get(dashboard.base_url)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "https://" not in r.text  # nothing from the internet


def test_rates_show_the_job_stats_dispatchers_publish(dashboard: DashboardProc) -> None:
    nbuckets = len(LATENESS_BOUNDS_S) + 1
    totals = [Totals((0,) * 5, (0,) * nbuckets)]
    log = JobStatsLog(lambda: dashboard.broker, lambda: totals[0], _now_ms)
    lateness = [0] * nbuckets
    lateness[lateness_bucket(0.002)] = 9  # 9 starts 2 ms late
    totals[0] = Totals((9, 7, 2, 1, 1), tuple(lateness))
    log.flush(closing=True)  # what a dispatcher writes every 5 s
    jobs = dashboard.ok("api/rates", minutes=5)["jobs"]
    assert [(j["started"], j["succeeded"], j["failed"], j["retried"], j["dead"]) for j in jobs] == [
        (9, 7, 2, 1, 1)
    ]
    job = jobs[0]
    assert job["lateness_p50_ms"] is not None and 1 <= job["lateness_p50_ms"] <= 2.5
    assert job["t_ms"] <= _now_ms() and job["interval_ms"] == 5000
