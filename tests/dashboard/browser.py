"""A real headless Chromium for the dashboard's page tests, driven by Selenium.

Debian's ``chromium`` and ``chromium-driver`` (``bash scripts/setup.sh all`` installs
them): the driver path is passed explicitly and Selenium Manager is kept offline, so
nothing is ever downloaded. Missing binaries skip a test locally and fail it under
``CI=true`` (like ``require_redis_server``).

:class:`Browser` wraps one ``webdriver.Chrome`` with what the tests need: explicit
waits, the browser console's errors, every URL the page requested (from Chrome's
performance log), and screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

T = TypeVar("T")

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: The window every page test (and the README's screenshots) uses.
WINDOW = (1280, 800)
#: The viewer's time zone in the browser: not UTC, so "your time" and UTC differ.
VIEWER_TZ = "Asia/Kolkata"  # UTC+05:30 all year (no DST to make a test date-dependent)
WAIT_S = 15.0


def require_chromium() -> tuple[str, str]:
    """The chromium and chromedriver paths; skip (or fail on CI) when one is missing."""
    chromium = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    driver = CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else shutil.which("chromedriver")
    if chromium is None or driver is None:
        message = (
            "chromium/chromedriver not installed (apt-get install -y chromium chromium-driver)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


class Browser:
    """One headless Chromium (one per test module: starting it costs ~1 s)."""

    def __init__(self, download_dir: Path) -> None:
        chromium, driver_path = require_chromium()
        # Selenium Manager must never look for (or fetch) a driver or a browser.
        os.environ["SE_OFFLINE"] = "true"
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        options = Options()
        options.binary_location = chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--lang=en-US",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        options.add_experimental_option("prefs", {"download.default_directory": str(download_dir)})
        env = {**os.environ, "TZ": VIEWER_TZ}
        service = Service(executable_path=driver_path, env=env)
        # Typed Any: Selenium's WebDriver is only partly annotated.
        self.driver: Any = webdriver.Chrome(options=options, service=service)
        self.driver.set_page_load_timeout(30)
        # --window-size counts the (invisible) browser frame: pin the page's viewport.
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False},
        )

    def close(self) -> None:
        """Quit the browser and its driver."""
        self.driver.quit()

    # waiting -------------------------------------------------------------

    def wait(self, predicate: Callable[[Any], T], timeout: float = WAIT_S, what: str = "") -> T:
        """Wait (polling, no sleeps in the tests) until ``predicate(driver)`` is truthy."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(predicate, what)
        except TimeoutException:
            # Say what the page showed instead: the failure then explains itself.
            shown = self.driver.execute_script(
                "return [location.hash, document.getElementById('flash')?.textContent,"
                " document.getElementById('view')?.innerText.slice(0, 1500)].join(' | ');"
            )
            console = [e["message"] for e in self.driver.get_log("browser")]
            raise AssertionError(
                f"still waiting for {what} after {timeout} s; page: {shown}; console: {console}"
            ) from None

    def open(self, url: str) -> None:
        """Load ``url`` afresh and wait until the app has rendered something beyond
        "Loading"."""
        # Only the fragment differing from the page shown would not reload the document.
        self.driver.get("about:blank")
        self.driver.get(url)
        self.wait(
            lambda d: d.execute_script(
                "const v = document.getElementById('view');"
                "return v && !v.textContent.startsWith('Loading');"
            ),
            what=f"the app to render {url}",
        )

    def go(self, route: str) -> None:
        """Switch the app to a hash route (``#/search?...``) without reloading it."""
        self.driver.execute_script("location.hash = arguments[0];", route)

    def css(self, selector: str, timeout: float = WAIT_S) -> Any:
        """The first element matching ``selector`` once it is displayed."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec

        return self.wait(
            ec.visibility_of_element_located((By.CSS_SELECTOR, selector)),
            timeout,
            what=f"{selector} to be visible",
        )

    def all(self, selector: str) -> list[Any]:
        """Every element matching ``selector`` right now."""
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def text_of(self, selector: str) -> str:
        """The visible text of the first match of ``selector``."""
        return str(self.css(selector).text)

    def wait_text(self, selector: str, needle: str, timeout: float = WAIT_S) -> str:
        """Wait until ``selector``'s text contains ``needle``; return the text."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        def found(d: Any) -> str | bool:
            for e in d.find_elements(By.CSS_SELECTOR, selector):
                try:
                    text = str(e.text)
                except StaleElementReferenceException:  # re-rendered meanwhile: look again
                    return False
                if needle in text:
                    return text
            return False

        return str(self.wait(found, timeout, what=f"{needle!r} in {selector}"))

    def click(self, selector: str) -> None:
        """Click ``selector`` once it is clickable."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec

        element: Any = self.wait(
            ec.element_to_be_clickable((By.CSS_SELECTOR, selector)), what=f"{selector} clickable"
        )
        element.click()

    def set_value(self, selector: str, value: str) -> None:
        """Set an input's value the way typing would end (fires ``input``/``change``).

        ``datetime-local`` fields take keystrokes in a locale-dependent order; setting
        the value is what a user's picker does in the end.
        """
        element = self.css(selector)
        self.driver.execute_script(
            "arguments[0].value = arguments[1];"
            "arguments[0].dispatchEvent(new Event('input', {bubbles: true}));"
            "arguments[0].dispatchEvent(new Event('change', {bubbles: true}));",
            element,
            value,
        )

    def confirm_dialog(self) -> str:
        """Wait for the in-page confirmation dialog, return its text and confirm it."""
        self.wait(
            lambda d: d.execute_script("return document.getElementById('confirm').open"),
            what="the confirmation dialog",
        )
        text = self.text_of("#confirm-text")
        self.click("#confirm-ok")
        self.wait(
            lambda d: not d.execute_script("return document.getElementById('confirm').open"),
            what="the dialog to close",
        )
        return text

    def js(self, script: str, *args: Any) -> Any:
        """Run ``script`` in the page and return its value."""
        return self.driver.execute_script(script, *args)

    # what the page did ---------------------------------------------------

    def console_errors(self) -> list[dict[str, Any]]:
        """The browser console's SEVERE entries since the last call (drains the log)."""
        return [e for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]

    def requested_urls(self) -> list[str]:
        """Every URL the page requested since the last call (drains the performance log)."""
        urls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                urls.append(str(message["params"]["request"]["url"]))
        return urls

    def foreign_requests(self, base_url: str) -> list[str]:
        """Requested URLs that are not on ``base_url``'s host and port (nor data:)."""
        home = urlsplit(base_url).netloc
        return [
            u
            for u in self.requested_urls()
            if not u.startswith("data:") and urlsplit(u).netloc != home
        ]

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the window at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path


def save_shot(browser: Browser, tmp_path: Path, name: str, *, publish: bool = False) -> Path:
    """Screenshot into the test's ``tmp_path``; with ``publish`` and env
    ``CHRONOQ_SCREENSHOTS=DIR`` also as ``DIR/dashboard-<name>.png`` (the README's)."""
    shot = browser.screenshot(tmp_path / "screenshots" / f"{name}.png")
    target = os.environ.get("CHRONOQ_SCREENSHOTS")
    if publish and target:
        out = Path(target) / f"dashboard-{name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        _small_png(shot, out)
    return shot


def _small_png(source: Path, target: Path) -> None:
    """Copy a screenshot as a 256-colour optimised PNG (about a third of the bytes; the
    pages' flat colours survive it), or as it is without Pillow."""
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with the report extra (matplotlib)
        shutil.copyfile(source, target)
        return
    with Image.open(source) as image:
        image.convert("RGB").quantize(colors=256).save(target, optimize=True)


def sign_in(browser: Browser, base_url: str, token: str | None) -> None:
    """Open the dashboard and sign in with ``token`` through the page's form (when the
    page asks for one); waits until the overview shows."""
    browser.open(base_url + "#/overview")
    if token is not None and browser.all("#sign-in-form"):
        browser.css("#token-input").send_keys(token)
        browser.click("#sign-in")
    browser.css("#card-pending")


@pytest.fixture(name="browser", scope="module")
def browser_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One headless Chromium for the test module (import ``browser_fixture`` to use
    the ``browser`` fixture)."""
    b = Browser(tmp_path_factory.mktemp("downloads"))
    try:
        yield b
    finally:
        b.close()
