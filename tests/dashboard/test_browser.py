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

from wakuwaku._control import Action
from wakuwaku.admin import list_dead_letters, read_commands, replay_dead_letters
from wakuwaku.dashboard import DashboardSettings, create_app
from wakuwaku.logs import Log

from ..conftest import chromium_path
from .kit import DEAD, GROUP, SCRIPT_KEY, STUCK, TOPIC, build, served
from .test_controls import committed, on_log
from .test_pages import ends

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page

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

    app = create_app(DashboardSettings(test_log, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        dialogs: list[str] = []

        def on_dialog(dialog: Dialog) -> None:  # an alert() that ran would land here
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
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


KEY_CONTROLS = {
    "retry-now": (Action.RETRY_NOW, "runs at once", "Asked for the next attempt now"),
    "give-up": (Action.GIVE_UP, "given_up_by_operator", "Gave up"),
}
"""A quarantined key's controls: the command, what the confirmation says, the outcome."""


@pytest.mark.parametrize("control", list(KEY_CONTROLS))
def test_an_operator_retries_or_gives_up_a_quarantined_key_after_confirming(
    test_log: str, browser: Browser, control: str
) -> None:
    """The quarantined key's link on the topic page, its confirmation page
    (nothing written yet), the confirm: one command in the control topic,
    naming the dashboard."""
    from playwright.sync_api import expect

    app = create_app(DashboardSettings(test_log, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}")
        row = page.locator("#quarantined tr", has_text=STUCK)
        action, asks, done = KEY_CONTROLS[control]
        row.locator(f"a.{control}").click()
        expect(page.locator("#what-happens")).to_contain_text(asks)
        expect(page.locator("#what-happens")).to_contain_text(STUCK)
        assert on_log(test_log, lambda log: read_commands(log, GROUP)) == []  # asked, not done
        page.fill("#reason", "row lock held by a migration")
        page.click("#confirm")
        expect(page.locator("#outcome")).to_contain_text(done)
        expect(page.locator("#scope")).to_contain_text(STUCK)
        written = [r.command for r in on_log(test_log, lambda log: read_commands(log, GROUP))]
        assert [(c.action, c.topic, c.key) for c in written if c] == [(action, TOPIC, STUCK)]
        command = written[0]
        assert command is not None
        assert command.reason == "row lock held by a migration"
        assert command.by.endswith("via dashboard from 127.0.0.1")
        page.close()


def test_an_operator_resets_the_offsets_after_seeing_the_plan(
    test_log: str, browser: Browser
) -> None:
    """The topic page's reset form, the plan per partition (from, to) with
    nothing stored, the confirm: the committed offsets are the plan's."""
    from playwright.sync_api import expect

    before = committed(test_log)
    assert sum(c or 0 for c in before.values()) == 7
    app = create_app(DashboardSettings(test_log, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}")
        page.fill("#reset-form input[name=to]", "earliest")
        page.click("#reset-form button")
        expect(page.locator("#what-happens")).to_contain_text("nothing is stored yet")
        assert _plan(page) == {p: (c or 0, 0) for p, c in before.items()}
        assert page.inner_text("#replayed") == "7"
        assert committed(test_log) == before  # the plan wrote nothing
        page.click("#confirm")
        expect(page.locator("#outcome")).to_contain_text("Stored the offsets")
        assert page.locator("#changed").count() == 0  # as planned
        assert committed(test_log) == {0: 0, 1: 0}
        page.close()


def test_an_offset_reset_is_refused_while_a_member_holds_a_partition(
    test_log: str, browser: Browser
) -> None:
    from playwright.sync_api import expect

    async def hold(log: Log) -> None:
        assert await log.acquire_partition(GROUP, TOPIC, 1, "worker-a", ttl=600.0)

    before = committed(test_log)
    on_log(test_log, hold)
    app = create_app(DashboardSettings(test_log, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}/reset-offsets?to=earliest")
        expect(page.locator("#running")).to_contain_text("worker-a")
        with page.expect_response("**/control/reset-offsets") as answer:
            page.click("#confirm")
        assert answer.value.status == 409
        expect(page.locator("#message")).to_contain_text("worker-a")
        expect(page.locator("#message")).to_contain_text("stop them first")
        assert committed(test_log) == before
        page.close()


def test_an_operator_purges_dead_letters_from_the_list_after_the_counts(
    test_log: str, browser: Browser
) -> None:
    """From the dead-letter list: the replayed ones first (2 of 3), then the
    rest of their reason; each after a dry run's counts, each read back."""
    from playwright.sync_api import expect

    def listed() -> list[str | None]:
        letters = on_log(test_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP))
        return [letter.key for letter in letters]

    on_log(test_log, lambda log: replay_dead_letters(log, TOPIC, group=GROUP, key="k-poison"))
    app = create_app(DashboardSettings(test_log, allow_replay=True, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}/dead-letters")
        page.click("#purge-link")
        page.check("#purge-choose input[name=replayed]")
        page.click("#purge-choose button")
        expect(page.locator("#would-count")).to_have_text("2")
        expect(page.locator("#by-reason")).to_contain_text("unrecoverable")
        assert listed() == ["k-poison", "k-poison", SCRIPT_KEY]  # a dry run wrote nothing
        page.click("#confirm")
        expect(page.locator("#purged-count")).to_have_text("2")
        assert page.locator("#changed").count() == 0  # as counted
        assert listed() == [SCRIPT_KEY]

        page.goto(f"{base}/topic/{TOPIC}/group/{GROUP}/dead-letters?reason=unrecoverable")
        expect(page.locator("#found-count")).to_have_text("1")
        page.click("#purge-link")  # carries the reason
        expect(page.locator("#would-count")).to_have_text("1")
        expect(page.locator("#already")).to_contain_text("2 matching dead letters were purged")
        page.click("#confirm")
        expect(page.locator("#purged-count")).to_have_text("1")
        assert listed() == []
        page.click("text=the dead letters")
        expect(page.locator("#found-count")).to_have_text("0")
        page.close()


def test_a_read_only_dashboard_shows_no_control_and_refuses_their_pages(
    test_log: str, browser: Browser
) -> None:
    from playwright.sync_api import expect

    before = committed(test_log)
    app = create_app(DashboardSettings(test_log, interval=3600.0))
    with served(app) as base:
        page = browser.new_page()
        topic_page = f"{base}/topic/{TOPIC}/group/{GROUP}"
        page.goto(topic_page)
        expect(page.locator("#read-only")).to_contain_text("--allow-replay")
        expect(page.locator("#quarantined")).to_contain_text(STUCK)  # the key is listed...
        controls = "#controls, form[id$='-form'], a.retry-now, a.give-up, a.pause, a.resume"
        assert page.locator(controls).count() == 0  # ...with no control beside it
        assert page.locator("#purge-link").count() == 0
        page.goto(f"{topic_page}/dead-letters")
        expect(page.locator("#found-count")).to_have_text(str(DEAD))
        assert page.locator("#replay-form, #purge-link, button#dry-run").count() == 0
        for path in (
            f"pause?key={STUCK}",
            "resume",
            f"retry-now?key={STUCK}",
            f"give-up?key={STUCK}",
            "reset-offsets?to=earliest",
            "purge?everything=yes",
        ):
            answer = page.goto(f"{topic_page}/{path}")
            assert answer is not None and answer.status == 403, path
            expect(page.locator("#message")).to_contain_text("read-only")
            expect(page.locator("#message")).to_contain_text("--allow-replay")
            assert page.locator("#confirm, #confirm-form").count() == 0, path
        page.close()
    assert on_log(test_log, lambda log: read_commands(log, GROUP)) == []
    assert committed(test_log) == before
    assert len(on_log(test_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP))) == DEAD


def _plan(page: Page) -> dict[int, tuple[int, int]]:
    """The reset plan's table: partition -> (from, to)."""
    rows = page.locator("#plan tr").all()[1:]
    cells = [[int(c) for c in row.locator("td").all_inner_texts()[:3]] for row in rows]
    return {p: (f, t) for p, f, t in cells}
