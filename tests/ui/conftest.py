"""Browser fixtures for the UI tests: Debian's chromium, driven headless by Playwright's sync API.

``make .tools/chromium`` (a prerequisite of ``make test``) installs the browser and notes its
executable in ``.tools/chromium``; Playwright's own browser download is never used (see
``.ci/fetch-chromium``). ``browser`` is one Chromium for this package's tests, ``page`` a
page in a fresh context per test, at a laptop's screen size.

The tests here are plain sync functions. While Playwright's sync API is started, it marks its
own event loop as running in the main thread, so an async test, or ``asyncio.run``, in that
thread fails until it stops: hence one browser per package, not per session, so that it is
gone before the rest of the suite's async tests run. A gateway a test drives runs in a thread
of its own (``tests.harness.GatewayServer``), which is unaffected.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_NOTE = ROOT / ".tools" / "chromium"
LAPTOP = ViewportSize(width=1366, height=800)


def chromium_executable() -> str:
    """The executable ``.ci/fetch-chromium`` noted; fails the test when there is none."""
    if not CHROMIUM_NOTE.is_file():
        pytest.fail(
            f"{CHROMIUM_NOTE} is missing: run `make .tools/chromium` (it installs Debian's"
            " chromium for the browser tests)"
        )
    executable = Path(json.loads(CHROMIUM_NOTE.read_text())["executable"])
    if not executable.is_file():
        pytest.fail(
            f"{executable}, noted in {CHROMIUM_NOTE}, is gone: run `python3 .ci/fetch-chromium`"
        )
    return str(executable)


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """A headless Chromium, shared by the tests of this package."""
    executable = chromium_executable()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page in a context of its own (no cookies or storage from other tests), 1366x800."""
    context = browser.new_context(viewport=LAPTOP)
    yield context.new_page()
    context.close()
