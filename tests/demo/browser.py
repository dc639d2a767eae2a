"""Headless Chromium for the app tests: Debian's ``chromium`` driven by Playwright for Python (its wheel carries
the driver; no browser download). One browser per test process, launched by the first page a test opens and
closed when the session ends (tests/demo/conftest.py); every page opens in a context of its own, so each test
sees a fresh page load, with no cookies, storage or cache from another."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Guards against a hang, not timings: one generation of the default setting on a 2-core CPU whose other core
# runs the suite's other worker, with margin.
TIMEOUT_MS = 300_000
DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}
_RUNNING: list = []  # [(playwright, browser)] once this process has launched Chromium


def missing() -> str | None:
    """Why no page can be opened here (no Chromium, no Playwright), or None."""
    if not Path(CHROMIUM).is_file():
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    return None


def require_browser() -> None:
    """Skip the test where no page can be opened here; under CI, fail it instead (CI installs Chromium)."""
    reason = missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser test required under CI: {reason}")
        pytest.skip(reason)


def chromium():
    """This process's Chromium, launched on first use (a launch and a close: about 0.5 s on an idle 2-core CPU)."""
    if not _RUNNING:
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        _RUNNING.append((playwright, playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)))
    return _RUNNING[0][1]


def close_chromium() -> None:
    """Close this process's Chromium, if one was launched."""
    while _RUNNING:
        playwright, browser = _RUNNING.pop()
        browser.close()
        playwright.stop()


@contextmanager
def open_page(url: str, viewport: dict | None = None):
    """The app in a fresh headless Chromium page, in a context of its own (a desktop window unless ``viewport``
    says otherwise)."""
    context = chromium().new_context(viewport=viewport or DESKTOP, accept_downloads=True)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        yield page
    finally:
        context.close()
