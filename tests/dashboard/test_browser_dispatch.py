"""The dashboard's pages with a REAL dispatcher running (``run_app`` in a thread of
this process, on the broker the dashboard process is a client of): pausing a
schedule in the page keeps its occurrences from firing while a control schedule
fires; requeueing a dead letter in the page makes the job run; the overview's
live lines and the lateness CDF show what the dispatcher did.

With ``CHRONOQ_SCREENSHOTS=DIR`` this module writes the README's pictures
(``dashboard-overview.png``, ``dashboard-search.png``) into DIR.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker_adapter.results import MessageState
from tests.dashboard.browser import (
    Browser,
    browser_fixture,  # noqa: F401  (the module's ``browser`` fixture)
    save_shot,
    sign_in,
)
from tests.dashboard.conftest import DashboardProc
from tests.helpers import eventually
from workers.dispatcher import Dispatcher
from workers.job_metrics import JobMetrics
from workers.runner import run_app
from workers.schedule_runs import RunLog
from workers.trace import DeliveryTrace

#: Real-time bound for what the dispatcher and the dashboard's samplers do (not a
#: performance claim: job stats are published every 5 s, last runs written every 5 s).
SLOW_S = 30.0


class Runs:
    """What the jobs of this module record when the real dispatcher runs them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: Counter[str] = Counter()
        self.fail_flaky = True

    def record(self, what: str) -> None:
        with self.lock:
            self.done[what] += 1

    def count(self, what: str) -> int:
        with self.lock:
            return self.done[what]


@pytest.fixture(scope="module")
def runs(dashboard: DashboardProc) -> Iterator[Runs]:
    """The module's jobs on the dashboard's app, and the runs they record."""
    runs = Runs()
    app = dashboard.app

    @app.job(name="browser.tick")
    def tick(which: str) -> None:
        """One occurrence of a schedule ran."""
        runs.record(which)

    @app.job(name="browser.flaky", max_attempts=1)
    def flaky(order_id: int) -> None:
        """Fails (to the dead letters at once) until the test fixes it."""
        if runs.fail_flaky:
            raise RuntimeError(f"payment service down for order {order_id}")
        runs.record("flaky")

    yield runs


@pytest.fixture
def dispatcher(dashboard: DashboardProc, runs: Runs) -> Iterator[threading.Event]:
    """Start (when the test sets the returned event) a real dispatcher with the schedule
    planner, last runs, job stats and a delivery trace in the dashboard's trace dir;
    stopped when the test ends, so each test chooses when one runs."""
    assert dashboard.data_dir is not None
    start = threading.Event()
    stop = threading.Event()
    app = dashboard.app
    trace = DeliveryTrace(dashboard.data_dir.parent / "trace", flush_interval_s=0.2)
    metrics = JobMetrics(app)
    disp = Dispatcher(app, trace=trace, hooks=[RunLog(app), metrics])

    def main() -> None:
        if start.wait(600) and not stop.is_set():
            run_app(app, stop_event=stop, dispatcher=disp, job_metrics=metrics)

    thread = threading.Thread(target=main, name="browser-test-dispatcher", daemon=True)
    thread.start()
    try:
        yield start
    finally:
        stop.set()
        start.set()
        thread.join(60)
        trace.close()
        assert not thread.is_alive()


def schedule_row(browser: Browser, name: str) -> str:
    """The text of a schedule's row on the schedules page."""
    return browser.wait_text("#schedules tr", name)


def test_a_schedule_paused_in_the_page_does_not_fire_while_the_control_does(
    browser: Browser,
    dashboard: DashboardProc,
    runs: Runs,
    dispatcher: threading.Event,
    tmp_path: Path,
) -> None:
    # Given two schedules every second, armed before any dispatcher runs
    tick = dashboard.app.handle("browser.tick")
    dashboard.app.schedules.add("paused-tick", tick, every=timedelta(seconds=1), args=("paused",))
    dashboard.app.schedules.add("control-tick", tick, every=timedelta(seconds=1), args=("control",))

    # When one is paused in the page
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go("#/schedules")
    assert "ACTIVE" in schedule_row(browser, "paused-tick")
    browser.click("button[data-action=pause][data-schedule=paused-tick]")
    browser.wait(
        lambda d: "PAUSED" in schedule_row(browser, "paused-tick"), what="paused-tick PAUSED"
    )
    assert "ACTIVE" in schedule_row(browser, "control-tick")
    assert dashboard.app.schedules.get("paused-tick").definition.paused

    # And a real dispatcher runs
    dispatcher.set()

    # Then the control fires again and again, the paused one never
    eventually(lambda: runs.count("control") >= 4, SLOW_S, "control-tick to fire 4 times")
    assert runs.count("paused") == 0

    # And once resumed in the page, it fires again
    browser.click("button[data-action=resume][data-schedule=paused-tick]")
    browser.wait(
        lambda d: "ACTIVE" in schedule_row(browser, "paused-tick"), what="paused-tick ACTIVE"
    )
    eventually(lambda: runs.count("paused") >= 1, SLOW_S, "paused-tick to fire after resume")

    # The page shows the control's last run and its outcome (written every ~5 s)
    browser.wait(lambda d: "ok" in schedule_row(browser, "control-tick"), SLOW_S, "last run ok")

    # And "run now" on a daily schedule (next due in 12 h) runs it at once
    dashboard.app.schedules.add(
        "daily-tick",
        tick,
        every=timedelta(days=1),
        anchor=datetime.now(UTC) + timedelta(hours=12),
        args=("daily",),
    )
    browser.go("#/overview")
    browser.go("#/schedules")
    browser.click("button[data-action=run-now][data-schedule=daily-tick]")
    browser.wait_text("#flash", "daily-tick will run now")
    eventually(lambda: runs.count("daily") == 1, SLOW_S, "the daily schedule's extra run")
    save_shot(browser, tmp_path, "schedules")


def test_a_dead_letter_requeued_in_the_page_runs(
    browser: Browser,
    dashboard: DashboardProc,
    runs: Runs,
    dispatcher: threading.Event,
    tmp_path: Path,
) -> None:
    # Given a job that failed for good (max_attempts=1) while a dispatcher runs
    dispatcher.set()
    receipt = dashboard.app.handle("browser.flaky").schedule(4242, key="pay:4242")
    group = dashboard.app.settings.group

    def dead_in_group() -> bool:
        view = dashboard.broker.query(receipt.msg_id)
        return view is not None and view.state is MessageState.DEAD

    eventually(dead_in_group, SLOW_S, "the flaky job to be dead")
    assert runs.count("flaky") == 0

    # When its group's dead letters are opened in the page
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go(f"#/dead/{group}")
    row = browser.wait_text("#dead-table tr", "4242")
    assert "payment service down for order 4242" in row  # the error, as the job raised it
    assert "browser.flaky(4242)" in row
    save_shot(browser, tmp_path, "dead")

    # And, the service fixed, the message is requeued with its button
    runs.fail_flaky = False
    browser.click(f"#dead-table button[data-action=requeue][data-msg-id='{receipt.msg_id}']")
    browser.wait_text("#flash", "Requeued 1")

    # Then the real dispatcher runs it, and the page's dead list empties
    eventually(lambda: runs.count("flaky") == 1, SLOW_S, "the requeued job to run")
    browser.wait_text("#dead-items", "No dead messages in this group")
    view = dashboard.broker.query(receipt.msg_id)
    assert view is not None and view.state is not MessageState.DEAD

    # And a dead letter purged in the page (after its dialog) is gone and never runs
    runs.fail_flaky = True
    doomed = dashboard.app.handle("browser.flaky").schedule(4343, key="pay:4343")
    eventually(
        lambda: (
            (v := dashboard.broker.query(doomed.msg_id)) is not None
            and v.state is MessageState.DEAD
        ),
        SLOW_S,
        "the second flaky job to be dead",
    )
    runs.fail_flaky = False
    browser.go("#/overview")
    browser.go(f"#/dead/{group}")
    browser.click(f"#dead-table button[data-action=purge][data-msg-id='{doomed.msg_id}']")
    assert doomed.msg_id in browser.confirm_dialog()
    browser.wait_text("#flash", "Purged 1")
    browser.wait_text("#dead-items", "No dead messages in this group")
    listed = dashboard.ok("api/dead", group=group)["items"]
    assert doomed.msg_id not in [m["msg_id"] for m in listed]
    assert runs.count("flaky") == 1  # only the requeued one ran


def test_the_overview_lines_and_the_lateness_cdf_show_the_dispatchers_work(
    browser: Browser,
    dashboard: DashboardProc,
    runs: Runs,
    dispatcher: threading.Event,
    tmp_path: Path,
) -> None:
    # Given a running dispatcher that has run jobs, and timers spread over the next hour
    dispatcher.set()
    tick = dashboard.app.handle("browser.tick")
    for i in range(5):
        tick.schedule("warm-up", delay=timedelta(milliseconds=300 * i))
    eventually(lambda: runs.count("warm-up") == 5, SLOW_S, "jobs to have run")
    rng = random.Random(17)
    close_order = dashboard.app.handle("shop.close_order")
    remind = dashboard.app.handle("shop.remind")
    nightly = dashboard.app.handle("reports.nightly")
    for i in range(60):
        close_order.schedule(
            7000 + i, delay=timedelta(minutes=rng.uniform(1, 59)), key=f"order:{7000 + i}:close"
        )
    for i in range(25):
        remind.schedule(
            f"order {7000 + i} unpaid",
            delay=timedelta(minutes=rng.uniform(10, 50)),
            key=f"order:{7000 + i}:remind",
        )
    for i in range(8):
        nightly.schedule(delay=timedelta(hours=rng.uniform(2, 20)), key=f"nightly:{i}")

    # When the overview is open
    sign_in(browser, dashboard.base_url, dashboard.token)

    # Then the fire-rate and job lines are drawn from the live samples, and grow
    browser.wait(lambda d: browser.all("#fire-chart path.line"), SLOW_S, "the fire-rate line")
    dots = len(browser.all("#fire-chart circle.dot"))
    browser.wait(
        lambda d: len(browser.all("#fire-chart circle.dot")) > dots, SLOW_S, "a new sample drawn"
    )
    browser.wait(lambda d: browser.all("#jobs-chart path.line"), SLOW_S, "the job lines")
    browser.wait(lambda d: browser.all("#lateness-chart path.line"), SLOW_S, "the lateness lines")
    browser.wait_text("#groups", dashboard.app.settings.group)
    assert len(browser.all("#due-chart rect.bar")) == 60
    save_shot(browser, tmp_path, "overview", publish=True)

    # And the search by job name lists its runs, paged by due time
    browser.go("#/search?mode=job&job=shop.close_order")
    browser.wait(lambda d: len(browser.all("#results tr.msg-row")) == 50, what="a first page of 50")
    save_shot(browser, tmp_path, "search", publish=True)
    browser.click("#next-page")
    browser.wait(lambda d: len(browser.all("#results tr.msg-row")) == 10, what="the other 10")
    browser.wait_text("#page-info", "51–60")

    # And the lateness page plots the trace's CDF with its percentiles
    browser.go("#/lateness")
    browser.wait(lambda d: browser.all("#cdf-chart path.cdf"), SLOW_S, "the CDF")
    assert browser.text_of("#lat-p50").startswith("P50")
    assert int(browser.text_of("#lat-count").split()[-1].replace(",", "")) >= 2
    assert len(browser.all("#cdf-chart line.mark")) == 3
    save_shot(browser, tmp_path, "lateness")
    assert browser.console_errors() == []
    assert browser.foreign_requests(dashboard.base_url) == []
