"""The browser fixtures drive a real Chromium: a page served over loopback, shown and clicked."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import Page, expect

SITE = {
    "/": (
        "text/html; charset=utf-8",
        b"<!doctype html><title>Outbox</title>"
        b"<button>Send</button><p role='status'>Not sent</p>"
        b"<script src='/outbox.js'></script>",
    ),
    "/outbox.js": (
        "text/javascript",
        b"document.querySelector('button').addEventListener('click', () => {"
        b" document.querySelector('[role=status]').textContent = 'Sent'; });",
    ),
}


class SiteHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path not in SITE:
            self.send_error(404)
            return
        content_type, body = SITE[self.path]
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows a failing test's own output, not the server's request log."""


@pytest.fixture
def site() -> Iterator[str]:
    """The base URL of ``SITE``, served on loopback from a thread for one test."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SiteHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_click_runs_the_pages_script_and_shows_its_result(page: Page, site: str) -> None:
    """Clicking Send runs the script the page loaded from its server, and the status reads Sent."""
    page.goto(site)
    status = page.get_by_role("status")
    expect(status).to_have_text("Not sent")
    page.get_by_role("button", name="Send").click()
    expect(status).to_have_text("Sent")


def test_pages_open_at_a_laptop_screen_size(page: Page, site: str) -> None:
    """A page's window is 1366 by 800 CSS pixels, a common laptop screen."""
    page.goto(site)
    assert page.evaluate("[innerWidth, innerHeight]") == [1366, 800]
