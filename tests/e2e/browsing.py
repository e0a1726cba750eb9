"""What the browser tests share: Debian's Chromium driven by Playwright for
Python, a logged-in page at a given width, screenshots, and the overflow check.

Screenshots go to tests/output/screenshots/ (gitignored), one per page and
width, for a person to look at; with SESSIOND_SCREENSHOTS=DIR they are copied
there too (that is how docs/img/ was made).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.e2e.harness import Daemon

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 30_000  # a bound on every wait in the page; under load, not a sleep
SHOTS = Path(__file__).resolve().parent.parent / "output" / "screenshots"
DESKTOP, PHONE = 1280, 390
# an ISO time with microseconds: what a person should never have to read
RAW_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}"

if not os.path.exists(CHROMIUM) and os.environ.get("CI") != "true":
    pytest.skip(f"no {CHROMIUM}: apt-get install chromium (.ci/run does)", allow_module_level=True)


# Named fixtures, imported by the test modules (``from tests.e2e.browsing import
# browser_fixture, shots_fixture``): pytest finds them there by their ``name``.
@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module", name="shots")
def shots_fixture() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


def shoot(page: Page, shots: Path, name: str) -> Path:
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("SESSIOND_SCREENSHOTS")
    if extra:
        shutil.copy(path, Path(extra) / path.name)
    return path


def open_console(browser: Browser, d: Daemon, width: int = DESKTOP) -> tuple[Page, str]:
    """A fresh browser context logged in through the URL `sessionctl web` prints."""
    minted = d.json("web")
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto(minted["url"])
    assert page.url == minted["console"] + "/"  # the token left the address bar
    assert page.locator("#user").inner_text() == minted["user"]
    return page, minted["console"]


def overflow(page: Page) -> int:
    """How many pixels the page is wider than the screen (0: nothing runs off it)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))
