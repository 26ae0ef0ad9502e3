"""Schedules through the dashboard's API (listed from the broker alone; pause,
resume and run now checked through ``app.schedules`` and the broker)."""

from __future__ import annotations

import time
from datetime import timedelta

from broker_adapter import MessageState
from scheduler.schedule_runs import LastRun, RunBook
from tests.dashboard.conftest import DashboardProc
from tests.helpers import eventually


def _now_ms() -> int:
    return int(time.time() * 1000)


def _occurrences(dashboard: DashboardProc, name: str) -> list[str]:
    """The pending occurrences of schedule ``name`` (keys ``cron:<name>:<fire_ms>``)."""
    items = dashboard.ok("api/messages", key_prefix=f"cron:{name}:")["items"]
    return [i["key"] for i in items]


def test_schedules_are_listed_with_next_fire_times_and_last_run(
    dashboard: DashboardProc,
) -> None:
    remind = dashboard.app.handle("shop.remind")
    dashboard.app.schedules.add("tenant-1", remind, every=timedelta(hours=1), args=("hi",))
    dashboard.app.schedules.add("report", "reports.nightly", cron="0 5 * * *", tz="Asia/Shanghai")
    now = _now_ms()
    RunBook(lambda: dashboard.broker, _now_ms).write(
        "test-owner", {"report": LastRun(now - 5000, now - 4000, now - 3000, "ok")}
    )
    items = {i["name"]: i for i in dashboard.ok("api/schedules")["items"]}
    tenant = items["tenant-1"]
    assert tenant["source"] == "data" and tenant["job"] == "shop.remind"
    assert tenant["paused"] is False and tenant["last_run"] is None
    times = tenant["next_fire_times_ms"]
    assert len(times) == 3 and times == sorted(times) and times[0] > now - 1000
    assert times[1] - times[0] == 3_600_000
    assert tenant["trigger"].startswith("every ")
    report = items["report"]
    assert report["tz"] == "Asia/Shanghai"
    assert report["trigger"] == "cron '0 5 * * *' (Asia/Shanghai)"
    assert report["last_run"] == {
        "fire_ms": now - 5000,
        "start_ms": now - 4000,
        "end_ms": now - 3000,
        "outcome": "ok",
    }


def test_pause_resume_and_run_now_act_on_the_stored_schedule(dashboard: DashboardProc) -> None:
    remind = dashboard.app.handle("shop.remind")
    dashboard.app.schedules.add("tenant-2", remind, every=timedelta(hours=2), args=("yo",))
    assert len(_occurrences(dashboard, "tenant-2")) == 1  # armed at once

    doc = dashboard.ok("api/schedules/tenant-2/pause", {})
    assert doc["ok"] is True and doc["schedule"]["paused"] is True
    assert doc["schedule"]["next_fire_times_ms"] == []
    assert dashboard.app.schedules.get("tenant-2").paused is True
    assert _occurrences(dashboard, "tenant-2") == []  # its occurrence was aborted

    doc = dashboard.ok("api/schedules/tenant-2/resume", {})
    assert doc["schedule"]["paused"] is False and len(doc["schedule"]["next_fire_times_ms"]) == 3
    assert dashboard.app.schedules.get("tenant-2").paused is False
    assert len(_occurrences(dashboard, "tenant-2")) == 1

    doc = dashboard.ok("api/schedules/tenant-2/run-now", {})
    assert doc["ok"] is True and doc["schedule"]["name"] == "tenant-2"
    msg_id = doc["msg_id"]

    def fired() -> bool:
        view = dashboard.broker.query(msg_id)
        return view is not None and view.state is not MessageState.PENDING

    eventually(fired, timeout=15, what="the run-now message fired")
    detail = dashboard.ok(f"api/messages/{msg_id}")
    assert detail["job"] == "shop.remind" and detail["topic"] == remind.topic


def test_unknown_schedules_are_404_and_bad_posts_change_nothing(
    dashboard: DashboardProc,
) -> None:
    for action in ("pause", "resume", "run-now"):
        r = dashboard.post(f"api/schedules/no-such-schedule/{action}", {})
        assert r.status_code == 404 and r.json()["error"] == "ScheduleNotFound", r.text
    remind = dashboard.app.handle("shop.remind")
    dashboard.app.schedules.add("tenant-3", remind, every=timedelta(hours=3), args=("x",))
    r = dashboard.http.post(
        dashboard.base_url + "api/schedules/tenant-3/pause",
        content="a=1",
        headers={**dashboard.headers(), "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 415
    r = dashboard.post("api/schedules/tenant-3/pause", {}, Origin="http://evil.example")
    assert r.status_code == 403
    assert dashboard.app.schedules.get("tenant-3").paused is False
