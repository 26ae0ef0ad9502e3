"""Dashboard pages in headless Chromium on a broker with 1,000,000 pending messages.

The same broker as ``bench/dashboard_page.py`` (``--pending`` job runs of ten jobs
due over the coming week, 20 dead letters, 50 interval schedules; the dashboard a
client of this process's ``rocksdb://`` directory), then Debian's Chromium
(headless, the system chromedriver, nothing downloaded) opens each page
``--loads`` times (default 10) and times it from navigation start to the page
showing its data (``performance.now()`` in the page, checked every animation
frame): what a person waits for. Then the overview stays open ``--soak`` seconds
(default 60) with its 2 s live polling, and the JS heap and DOM element count before
and after show whether redrawing leaks (the heap figure is Chrome's coarse
``performance.memory``, garbage included; the elements grow by one dot and its
tooltip per fire-rate sample until the 15-minute window is full, then stay flat).

Printed: per page P50 / max in ms, DOM nodes, the soak figures and the load
average before and after (2 shared cores: other work on the machine shows up).

Run from the project root::

    .venv/bin/python bench/dashboard_browser.py                   # 1,000,000 pending
    .venv/bin/python bench/dashboard_browser.py --pending 100000 --soak 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the checkout's root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.dashboard_page import GROUP, populate, start_dashboard, stop_dashboard
from bench.stats import load_average, ms, num, percentiles, print_block
from broker_adapter import open_broker
from tests.dashboard.browser import Browser

#: Each page's hash route and the in-page condition of "its data is shown".
PAGES: list[tuple[str, str, str]] = [
    (
        "overview",
        "#/overview",
        (
            "document.querySelector('#card-pending .card-value')?.textContent !== '…'"
            " && document.querySelector('#due-chart svg')"
            " && document.querySelector('#topics-chart svg')"
        ),
    ),
    (
        "search job=job3 (50 rows)",
        "#/search?mode=job&job=job3",
        "document.querySelectorAll('#results tr.msg-row').length === 50",
    ),
    (
        "search key prefix tenant:7:",
        "#/search?mode=prefix&prefix=tenant%3A7%3A",
        "document.querySelectorAll('#results tr.msg-row').length === 50",
    ),
    ("message detail", "#/message/{some_id}", "document.querySelector('#detail-state .badge')"),
    (
        "schedules (50)",
        "#/schedules",
        "document.querySelectorAll('#schedules tbody tr').length === 50",
    ),
    (
        f"dead letters of {GROUP}",
        f"#/dead/{GROUP}",
        "document.querySelector('#dead-table tbody tr')",
    ),
]

#: Resolves with performance.now() at the first animation frame where ``ready`` holds.
WAIT_READY = """
const ready = new Function("return " + arguments[0]);
const done = arguments[arguments.length - 1];
const t0 = performance.now();
(function check() {
  let ok = false;
  try { ok = Boolean(ready()); } catch (e) { ok = false; }
  if (ok) done(performance.now());
  else if (performance.now() - t0 > 60000) done(null);
  else requestAnimationFrame(check);
})();
"""


def page_ms(browser: Browser, url: str, ready: str) -> float | None:
    """Load ``url`` afresh; ms from navigation start until ``ready`` held."""
    browser.driver.get("about:blank")
    browser.driver.get(url)
    return browser.driver.execute_async_script(WAIT_READY, ready)  # type: ignore[no-any-return]


def heap_and_nodes(browser: Browser) -> tuple[int, int]:
    """The page's used JS heap (bytes) and its number of DOM elements."""
    heap, nodes = browser.js(
        "return [performance.memory.usedJSHeapSize, document.getElementsByTagName('*').length];"
    )
    return int(heap), int(nodes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pending", type=int, default=1_000_000)
    p.add_argument("--loads", type=int, default=10)
    p.add_argument("--soak", type=float, default=60.0, help="seconds of live overview")
    args = p.parse_args()
    load0 = load_average()
    tmp = Path(tempfile.mkdtemp(prefix="chronoq-dash-browser-"))
    url = f"rocksdb://{tmp / 'data'}"
    broker = open_broker(url)
    proc = None
    browser = None
    try:
        now = int(time.time() * 1000)
        rate, some_id = populate(broker, args.pending, now)
        print_block(
            "fill", [("pending", num(args.pending)), ("batched sends", f"{num(rate)} msgs/s")]
        )
        proc, base = start_dashboard(url, tmp / "dashboard.log")
        browser = Browser(tmp / "downloads")
        rows = []
        for label, route, ready in PAGES:
            target = base + route.format(some_id=some_id)
            page_ms(browser, target, ready)  # warm-up: caches, the dashboard's first reads
            took = [page_ms(browser, target, ready) for _ in range(args.loads)]
            if any(t is None for t in took):
                rows.append((label, "never showed its data within 60 s"))
                continue
            pct = percentiles([t for t in took if t is not None], (50.0,))
            nodes = heap_and_nodes(browser)[1]
            rows.append(
                (label, f"P50 {ms(pct['p50'])}  max {ms(pct['max'])} ms  {num(nodes)} elements")
            )
        print_block(f"page shown with its data, {args.loads} loads each (ms)", rows)
        if args.soak > 0:
            page_ms(browser, base + PAGES[0][1], PAGES[0][2])
            heap0, nodes0 = heap_and_nodes(browser)
            time.sleep(args.soak)  # the page polls every 2 s meanwhile
            heap1, nodes1 = heap_and_nodes(browser)
            errors = browser.console_errors()
            print_block(
                f"overview left open {args.soak:g} s (live polling every 2 s)",
                [
                    ("JS heap", f"{heap0 / 1e6:.1f} -> {heap1 / 1e6:.1f} MB"),
                    ("DOM elements", f"{num(nodes0)} -> {num(nodes1)}"),
                    ("console errors", str(len(errors))),
                ],
            )
        print_block(
            "machine",
            [
                ("load before", load0),
                ("load after", load_average()),
            ],
        )
    finally:
        if browser is not None:
            browser.close()
        if proc is not None:
            stop_dashboard(proc)
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
