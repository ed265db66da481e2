"""The dashboard in a real browser: Debian's chromium, headless, driven by
Playwright. Marked ``browser``: skipped locally without chromium,
a failure with CI=true (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from wakuwaku.dashboard import DashboardSettings, create_app

from ..conftest import chromium_path
from .kit import DEAD, GROUP, SCRIPT_KEY, STUCK, TOPIC, build, served
from .test_pages import ends

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("WAKUWAKU_ARTIFACTS", ROOT / "build" / "artifacts"))
"""Where the screenshots go (docs/images/dashboard.png is a committed copy)."""


@pytest.fixture
def test_log(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    return url


@pytest.fixture
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def test_the_page_shows_counts_filters_by_key_and_replays_after_a_dry_run(
    test_log: str, browser: Browser
) -> None:
    url = test_log
    app = create_app(DashboardSettings(url, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        dialogs: list[str] = []

        def on_dialog(dialog: Dialog) -> None:  # an alert() that ran would land here
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.goto(base + "/")
        page.click(f"text={TOPIC}")
        assert page.inner_text("#dead-count") == str(DEAD)
        assert page.inner_text("#quarantined-count") == "1"
        assert page.inner_text("#quarantined td.key") == STUCK
        page.screenshot(path=str(ARTIFACTS / "dashboard-test-log.png"), full_page=True)

        page.click("#browse")
        assert page.inner_text("#found-count") == str(DEAD)
        page.fill("#search input[name=key]", SCRIPT_KEY)
        page.click("#search button")
        assert page.inner_text("#found-count") == "1"
        # the key is text on the page, and nothing ran
        assert page.inner_text("#letters td.key") == SCRIPT_KEY
        page.click("#letters a")
        assert page.inner_text("#summary td.key") == SCRIPT_KEY
        assert "<img src=x onerror=alert(1)>" in page.inner_text("#body")
        assert page.locator("#body img").count() == 0
        assert dialogs == []

        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}/dead-letters?key=k-poison")
        assert page.inner_text("#found-count") == "2"
        page.click("#dry-run")
        assert page.inner_text("#would-count") == "2"
        assert ends(url) == 7  # the dry run wrote nothing
        page.click("#confirm")
        assert page.inner_text("#replayed-count") == "2"
        assert ends(url) == 9  # the two copies are in the main topic
        page.close()


def test_a_screenshot_of_the_demo(browser: Browser, tmp_path: Path) -> None:
    """A slice of ``wakuwaku demo flights``, shown by the dashboard; the screenshot
    is saved under ``$WAKUWAKU_ARTIFACTS`` (docs/dashboard.md shows a copy)."""
    work = tmp_path / "demo-out"
    command = [sys.executable, "-m", "wakuwaku", "demo", "flights", "--limit", "3000"]
    subprocess.run(
        [*command, "--workdir", str(work)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    url = f"sqlite:///{work}/log.db"
    app = create_app(DashboardSettings(url, interval=3600.0))
    with served(app) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/topic/flights/group/flights-projection")
        dead = int(page.inner_text("#dead-count"))
        assert dead > 0
        assert page.locator("#dead-chart rect").count() > 0
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard-demo.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        page.goto(f"{base}/topic/flights/group/flights-projection/dead-letters")
        assert page.inner_text("#found-count") == str(dead)
        page.screenshot(path=str(ARTIFACTS / "dashboard-demo-dead-letters.png"))
        page.close()


def test_the_open_page_follows_the_log_by_polling(test_log: str, browser: Browser) -> None:
    """The page's own inline script (allowed by its CSP nonce) swaps in the live
    part: a record published after the page loaded shows up as lag."""
    from concurrent.futures import ThreadPoolExecutor

    from playwright.sync_api import expect

    import wakuwaku as wk

    from .kit import Order

    async def publish() -> None:
        log = wk.open_log(test_log)
        try:
            await wk.Producer(log, TOPIC).publish(Order("k-late", 99))
        finally:
            await log.close()

    app = create_app(DashboardSettings(test_log, interval=0.3))
    with served(app) as base:
        page = browser.new_page()
        console: list[str] = []
        page.on("console", lambda message: console.append(message.text))
        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}")
        assert page.inner_text("#lag") == "0"
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, publish()).result()
        expect(page.locator("#lag")).to_have_text("1", timeout=30_000)
        assert not [m for m in console if "Content Security Policy" in m]
        page.close()


def test_an_operator_pauses_a_key_then_resumes_it_after_confirming_each(
    test_log: str, browser: Browser
) -> None:
    """The topic page's pause form, its confirmation page, the pause listed in
    force, its resume link and confirmation; the control topic says the same."""
    from playwright.sync_api import expect

    from wakuwaku.admin import pauses

    from .test_controls import on_log

    app = create_app(DashboardSettings(test_log, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}")
        expect(page.locator("#no-pauses")).to_be_visible()
        page.fill("#pause-key", SCRIPT_KEY)
        page.click("#pause-key-form button")
        expect(page.locator("#what-happens")).to_contain_text(SCRIPT_KEY)
        assert on_log(test_log, lambda log: pauses(log, GROUP)) == []  # asked, not done
        page.fill("#reason", "investigating")
        page.click("#confirm")
        expect(page.locator("#outcome")).to_contain_text("Paused")
        in_force = on_log(test_log, lambda log: pauses(log, GROUP))
        assert [(p.key, p.reason) for p in in_force] == [(SCRIPT_KEY, "investigating")]

        page.click("#back")
        row = page.locator("#pauses tr", has_text="investigating")
        expect(row).to_contain_text(SCRIPT_KEY)
        expect(row).to_contain_text("UTC")
        row.locator("a.resume").click()
        expect(page.locator("#ending")).to_contain_text(SCRIPT_KEY)
        page.click("#confirm")
        expect(page.locator("#outcome")).to_contain_text("Resumed")
        assert on_log(test_log, lambda log: pauses(log, GROUP)) == []
        page.click("#back")
        expect(page.locator("#no-pauses")).to_be_visible()
        assert dialogs == []  # the key was text on every page
        page.close()
