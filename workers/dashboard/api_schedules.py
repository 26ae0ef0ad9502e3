"""API routes of schedules: list them (the stored ones, and the ``@app.cron`` /
``@app.every`` jobs whose records ``chronoq run`` stored), pause, resume, run now.

The dashboard has no app code: like ``chronoq schedules`` without ``--app`` it
works on a bare :class:`~scheduler.scheduler.Scheduler` on the broker, whose
``app.schedules`` reads and changes the records stored there.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from scheduler.schedules import ScheduleInfo
from workers.dashboard.bodies import OptionalBody
from workers.dashboard.context import Dashboard


def schedule_doc(info: ScheduleInfo) -> dict[str, Any]:
    """The API's schedule item for ``info``."""
    d = info.definition
    last = info.last_run
    return {
        "name": d.name,
        "source": d.source,
        "job": d.job,
        "topic": d.topic,
        "trigger": d.describe(),
        "tz": d.tz,
        "paused": d.paused,
        "version": d.version,
        "next_fire_times_ms": list(info.next_fire_ms),
        "last_run": None
        if last is None
        else {
            "fire_ms": last.fire_ms,
            "start_ms": last.started_ms,
            "end_ms": last.ended_ms,
            "outcome": last.outcome,
        },
    }


def routes(dash: Dashboard) -> APIRouter:
    """The schedule routes on ``dash``."""
    router = APIRouter(prefix="/api/schedules", tags=["schedules"])
    schedules = dash.app.schedules

    @router.get("")
    def list_schedules() -> dict[str, Any]:
        """Every schedule with its next fire times and last run."""
        return {"items": [schedule_doc(i) for i in schedules.list()]}

    @router.post("/{name}/pause")
    def pause(name: str, body: OptionalBody = None) -> dict[str, Any]:
        """Pause a schedule: its pending occurrence is aborted, nothing fires until resumed."""
        return {"ok": True, "schedule": schedule_doc(schedules.pause(name))}

    @router.post("/{name}/resume")
    def resume(name: str, body: OptionalBody = None) -> dict[str, Any]:
        """Resume a schedule from now (the paused span is not caught up)."""
        return {"ok": True, "schedule": schedule_doc(schedules.resume(name))}

    @router.post("/{name}/run-now")
    def run_now(name: str, body: OptionalBody = None) -> dict[str, Any]:
        """Send one extra run of the schedule's job now."""
        sent = schedules.run_now(name)
        return {"ok": True, "msg_id": sent.msg_id, "schedule": schedule_doc(schedules.get(name))}

    return router


__all__ = ["routes", "schedule_doc"]
