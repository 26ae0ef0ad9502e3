"""The dashboard's pages in a real headless Chromium against the real ``chronoq
dashboard`` process on a real broker (issue 17 §4).

Each test drives the page the way a person would (forms, buttons, the in-page
confirmation dialog) and then asks the broker, in this process, what really
happened. A test also checks that the page logged no console error and requested
nothing but the dashboard's own host.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.select import Select

from broker_adapter.results import MessageState
from tests.dashboard.browser import (
    VIEWER_TZ,
    Browser,
    browser_fixture,  # noqa: F401  (the module's ``browser`` fixture)
    save_shot,
    sign_in,
)
from tests.dashboard.conftest import DashboardProc

#: The browser's time zone (UTC+05:30): "your time" in the page.
VIEWER = ZoneInfo(VIEWER_TZ)
XSS_KEY = "<script>window.__xss=1</script>"
XSS_ARG = '"\'><img src=x onerror="window.__xss=2">'


def assert_clean(browser: Browser, base_url: str) -> None:
    """No console error, and every request went to the dashboard's own address."""
    errors = browser.console_errors()
    assert errors == [], errors
    assert browser.foreign_requests(base_url) == []


def in_an_hour(minutes: int = 0) -> timedelta:
    return timedelta(minutes=60 + minutes)


def test_token_form_refuses_a_wrong_token_then_shows_data(
    browser: Browser, dashboard: DashboardProc, tmp_path: Path
) -> None:
    # Given a dashboard that requires a token, and a fresh browser tab
    assert dashboard.token is not None
    browser.open(dashboard.base_url)
    browser.js("sessionStorage.clear()")  # signed in by an earlier test: start afresh
    browser.open(dashboard.base_url)
    browser.css("#sign-in-form")
    save_shot(browser, tmp_path, "sign-in")
    assert browser.js("return sessionStorage.getItem('chronoq.token')") is None

    # When a wrong token is given, the form says so and nothing else shows
    browser.css("#token-input").send_keys("not-the-token")
    browser.click("#sign-in")
    browser.wait_text("#sign-in-error", "refused")
    assert browser.all("#card-pending") == []
    assert browser.js("return sessionStorage.getItem('chronoq.token')") is None
    browser.console_errors()  # the refused request logged its 401: expected here

    # Then the right token shows the overview, and lives in sessionStorage, not the URL
    field = browser.css("#token-input")
    field.clear()
    field.send_keys(dashboard.token)
    browser.click("#sign-in")
    browser.css("#card-pending")
    assert browser.js("return sessionStorage.getItem('chronoq.token')") == dashboard.token
    assert dashboard.token not in browser.driver.current_url
    assert not browser.all("#sign-out")[0].get_attribute("hidden")
    assert [u for u in browser.requested_urls() if dashboard.token in u] == []
    assert_clean(browser, dashboard.base_url)

    # And a token that stops working (changed on the server) brings the form back
    browser.js("sessionStorage.setItem('chronoq.token', 'stale')")
    browser.go("#/schedules")
    browser.wait_text("#sign-in-error", "refused")
    assert browser.js("return sessionStorage.getItem('chronoq.token')") is None
    browser.console_errors()  # the 401 again
    sign_in(browser, dashboard.base_url, dashboard.token)


def test_overview_shows_the_real_pending_count_and_charts(
    browser: Browser, dashboard: DashboardProc, tmp_path: Path
) -> None:
    # Given pending jobs spread over the next hour on two topics
    close_order = dashboard.app.handle("shop.close_order")
    nightly = dashboard.app.handle("reports.nightly")
    for i in range(12):
        close_order.schedule(1000 + i, delay=timedelta(minutes=5 + 4 * i), key=f"order:{1000 + i}")
    for i in range(3):
        nightly.schedule(delay=timedelta(minutes=30 + i), key=f"nightly:{i}")

    # When the overview is open
    sign_in(browser, dashboard.base_url, dashboard.token)
    expected = dashboard.ok("api/overview")["totals"]["pending"]
    assert expected >= 15

    # Then the pending card shows the broker's count, and the charts have bars
    browser.wait_text("#card-pending .card-value", f"{expected:,}")
    browser.wait(
        lambda d: len(browser.all("#due-chart rect.bar[height]")) == 60, what="60 minute bars"
    )
    heights = [float(b.get_attribute("height")) for b in browser.all("#due-chart rect.bar")]
    assert sum(1 for h in heights if h > 0) >= 10  # 12 jobs over ~50 minutes
    browser.wait_text("#topics-chart", "reports")
    assert len(browser.all("#topics-chart rect.bar")) >= 2
    browser.wait_text("#topics", "reports")

    # The day view is a click away: 24 hourly bars
    browser.click("#due-day")
    browser.wait(lambda d: len(browser.all("#due-chart rect.bar")) == 24, what="24 hour bars")
    browser.click("#due-hour")
    browser.wait(lambda d: len(browser.all("#due-chart rect.bar")) == 60, what="60 minute bars")

    # And it can show one topic: the three reports, in three minutes
    browser.wait(lambda d: browser.all("#due-topic option[value=reports]"), what="reports offered")
    Select(browser.css("#due-topic")).select_by_value("reports")
    browser.wait_text("#due-note", "3 due next hour on reports")
    heights = [float(b.get_attribute("height")) for b in browser.all("#due-chart rect.bar")]
    assert sum(1 for h in heights if h > 0) == 3
    save_shot(browser, tmp_path, "overview")
    assert_clean(browser, dashboard.base_url)


def test_search_a_key_open_it_and_abort_it(
    browser: Browser, dashboard: DashboardProc, tmp_path: Path
) -> None:
    # Given a pending job under a key
    receipt = dashboard.app.handle("shop.close_order").schedule(
        501, delay=in_an_hour(), key="order:501:close"
    )

    # When the key is searched in the page
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go("#/search")
    browser.css("#search-form")
    browser.js(
        "document.getElementById('search-mode').value = 'key';"
        "document.getElementById('search-mode').dispatchEvent(new Event('change'));"
    )
    browser.css("#search-key").send_keys("order:501:close")
    browser.click("#search-go")

    # Then it is listed with its state, due time in both zones and its decoded call
    row = browser.wait_text("#results", "order:501:close")
    assert "PENDING" in row
    assert "shop.close_order(501)" in row
    due = datetime.fromtimestamp(receipt.deliver_at_ms / 1000, UTC)
    assert due.strftime("%Y-%m-%d %H:%M:%S") in row  # UTC
    local = due.astimezone(VIEWER)
    assert local.strftime("%H:%M:%S") in row  # the viewer's zone (UTC+05:30)
    save_shot(browser, tmp_path, "search")

    # When it is opened and aborted through the in-page dialog
    browser.click(f"#results a[href='#/message/{receipt.msg_id}']")
    browser.wait_text("#detail-state", "PENDING")
    save_shot(browser, tmp_path, "message")
    browser.click("#abort")
    assert "order:501:close" in browser.confirm_dialog()

    # Then the page shows ABORTED, and so does the broker
    browser.wait_text("#detail-state", "ABORTED")
    view = dashboard.broker.query(receipt.msg_id)
    assert view is not None and view.state is MessageState.ABORTED

    # And a search by its id still finds it, aborted
    browser.go(f"#/search?mode=id&id={receipt.msg_id}")
    assert "ABORTED" in browser.wait_text("#results", receipt.msg_id)
    assert_clean(browser, dashboard.base_url)


def test_an_unknown_message_says_so_in_the_page(browser: Browser, dashboard: DashboardProc) -> None:
    # When a link names a message the broker does not know
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go("#/message/0000000000000000000000000000dead")

    # Then the page shows the API's error (its class and message), not a blank page
    text = browser.wait_text(".error-box", "NotFound")
    assert "0000000000000000000000000000dead" in text
    browser.console_errors()  # the 404 answer is logged by the browser: expected


def test_reschedule_in_the_page_moves_the_due_time(
    browser: Browser, dashboard: DashboardProc
) -> None:
    # Given a pending job
    receipt = dashboard.app.handle("shop.remind").schedule(
        "call back", delay=in_an_hour(), key="remind:77"
    )
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go(f"#/message/{receipt.msg_id}")
    browser.wait_text("#detail-state", "PENDING")

    # When a new time is picked in the viewer's zone (UTC+05:30) and submitted
    new_local = datetime.now(VIEWER).replace(second=0, microsecond=0) + timedelta(days=3)
    browser.set_value("#reschedule-at", new_local.strftime("%Y-%m-%dT%H:%M"))
    browser.click("#reschedule")

    # Then the page shows the new due time in UTC, and the broker has it
    new_utc = new_local.astimezone(UTC)
    browser.wait_text("#detail-due", new_utc.strftime("%Y-%m-%d %H:%M:00.000 UTC"))
    view = dashboard.broker.query(receipt.msg_id)
    assert view is not None and view.state is MessageState.PENDING
    assert view.deliver_at_ms == int(new_utc.timestamp() * 1000)

    # And a delay works too: "run in 2 hours"
    browser.css("#reschedule-delay").send_keys("7200")
    browser.click("#reschedule")
    browser.wait(
        lambda d: (
            (v := dashboard.broker.query(receipt.msg_id)) is not None
            and abs(v.deliver_at_ms - (datetime.now(UTC).timestamp() * 1000 + 7_200_000)) < 60_000
        ),
        what="the delay to land",
    )

    # And "run now" makes it due now: it fires (no dispatcher here: it waits READY)
    browser.wait_text("#detail-due", "in 2.0 h")
    clicked_ms = datetime.now(UTC).timestamp() * 1000
    browser.click("#run-now")
    browser.wait_text("#flash", "Due now")
    view = dashboard.broker.query(receipt.msg_id)
    assert view is not None and view.deliver_at_ms <= clicked_ms + 10_000
    browser.wait(
        lambda d: (
            (v := dashboard.broker.query(receipt.msg_id)) is not None
            and v.state is MessageState.READY
        ),
        what="the run to fire",
    )
    assert_clean(browser, dashboard.base_url)


def test_search_a_due_time_range_entered_in_the_viewers_zone(
    browser: Browser, dashboard: DashboardProc
) -> None:
    # Given three reports due 1, 5 and 20 minutes after a whole minute five hours ahead
    nightly = dashboard.app.handle("reports.nightly")
    base = (datetime.now(VIEWER) + timedelta(hours=5)).replace(second=0, microsecond=0)
    ids = [
        nightly.schedule(at=base + timedelta(minutes=m), key=f"range:{m}").msg_id
        for m in (1, 5, 20)
    ]

    # When the range [base, base + 10 min] is entered in the viewer's zone (UTC+05:30)
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go("#/search?mode=range")
    browser.set_value("#search-start", base.strftime("%Y-%m-%dT%H:%M"))
    browser.set_value("#search-end", (base + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M"))
    browser.css("#search-topic").send_keys("reports")
    browser.click("#search-go")

    # Then exactly the first two are listed, in due order
    def listed(d: object) -> list[str] | bool:
        rows = browser.all("#results tr.msg-row")
        try:
            return [r.get_attribute("data-msg-id") for r in rows] == ids[:2]
        except StaleElementReferenceException:  # the page re-rendered meanwhile
            return False

    browser.wait(listed, what=f"exactly {ids[:2]} listed")
    assert "start=" in browser.driver.current_url  # the search is a link
    assert_clean(browser, dashboard.base_url)


def test_cancel_by_key_prefix_shows_the_count_first(
    browser: Browser, dashboard: DashboardProc
) -> None:
    # Given three timers of one cart and one of another
    remind = dashboard.app.handle("shop.remind")
    ids = [
        remind.schedule(f"cart {i}", delay=in_an_hour(i), key=f"cart:9:{i}").msg_id
        for i in range(3)
    ]
    other = remind.schedule("other cart", delay=in_an_hour(), key="cart:10:0").msg_id

    # When the prefix is searched and "cancel all" confirmed in the page's dialog
    sign_in(browser, dashboard.base_url, dashboard.token)
    browser.go("#/search?mode=prefix&prefix=cart%3A9%3A")
    browser.wait(lambda d: len(browser.all("#results tr.msg-row")) == 3, what="three results")
    browser.click("#cancel-prefix")
    text = browser.confirm_dialog()

    # Then the dialog named the count, and exactly those three are aborted
    assert re.search(r"\b3 pending messages\b", text), text
    browser.wait_text("#flash", "Cancelled 3")
    for msg_id in ids:
        view = dashboard.broker.query(msg_id)
        assert view is not None and view.state is MessageState.ABORTED
    kept = dashboard.broker.query(other)
    assert kept is not None and kept.state is MessageState.PENDING
    assert_clean(browser, dashboard.base_url)


def test_markup_in_keys_and_arguments_shows_as_text_and_never_runs(
    browser: Browser, dashboard: DashboardProc, tmp_path: Path
) -> None:
    # Given a job whose key and arguments are markup that would run if parsed as HTML
    receipt = dashboard.app.handle("shop.remind").schedule(
        XSS_ARG, delay=in_an_hour(), key=XSS_KEY, note=XSS_KEY
    )
    sign_in(browser, dashboard.base_url, dashboard.token)

    # When the overview, the search results and the message's page show it
    browser.go("#/search?mode=prefix&prefix=" + "%3Cscript%3E")
    results = browser.wait_text("#results", XSS_KEY)
    assert XSS_ARG.replace('"', '\\"') in results  # the argument, JSON-quoted, as text
    browser.go(f"#/message/{receipt.msg_id}")
    assert browser.wait_text("#detail-key", XSS_KEY) == XSS_KEY
    call = browser.text_of("#detail-call")
    assert "window.__xss=2" in call and XSS_KEY in call
    save_shot(browser, tmp_path, "xss-message")
    browser.go("#/overview")
    browser.css("#card-pending")

    # Then nothing ran: no flag, no alert, no <img>/<script> made from data
    assert browser.js("return window.__xss") is None
    assert browser.js("return document.querySelectorAll('img[src=x], #view script').length") == 0
    from selenium.common.exceptions import NoAlertPresentException

    try:
        browser.driver.switch_to.alert.text  # noqa: B018  (raises when there is none)
    except NoAlertPresentException:
        pass
    else:  # pragma: no cover - the failure path
        raise AssertionError("an alert is open")
    assert_clean(browser, dashboard.base_url)


def test_every_page_renders_and_is_saved(
    browser: Browser, dashboard: DashboardProc, tmp_path: Path
) -> None:
    # Given the pages a person can reach from the menu
    sign_in(browser, dashboard.base_url, dashboard.token)
    for route, ready in [
        ("schedules", "#schedules-list"),
        ("dead", "#dead-groups"),
        ("lateness", "#cdf-chart"),
        ("search", "#search-form"),
    ]:
        # When each is opened from the menu
        browser.click(f"#nav a[data-route={route}]")
        browser.css(ready)
        assert f"#/{route}" in browser.driver.current_url
        # Then it rendered without an error box, and is saved
        assert browser.all(".error-box") == []
        save_shot(browser, tmp_path, route)
    assert len(list((tmp_path / "screenshots").glob("*.png"))) == 4
    assert_clean(browser, dashboard.base_url)
