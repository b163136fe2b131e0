"""The inspector in a real Chromium, against a real gateway on a loopback socket whose
ledger holds a coding session: log in through the form, read the list, the timeline and
a request, follow a ref to its original, see markup shown as text, see the page update
while the session runs, and see nothing of another tenant's. The three views are
screenshotted into docs/img/inspector-*.png (overwritten each run)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import zlib
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Dialog, Page, expect

from gateway.config import InspectorSettings, Settings, TenantSettings, UpstreamSettings
from gateway.runtime import Gateway
from gateway.tenancy.tenants import hash_key
from tests.gateway.routes.test_inspector import entry, message, stage, summary
from tests.harness import GatewayServer

ACME_KEY = "cg-acme-browser-key-0123456789ab"
GLOBEX_KEY = "cg-globex-browser-key-0123456789ab"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
SCRIPT = "<script>alert(1)</script>"
TITLE = "Fix the flaky checkout test in payments/ and make CI green again"
LOG = "".join(
    f"2025-11-29T10:{i // 60:02d}:{i % 60:02d}Z checkout_test.py::test_pay[{i}] "
    f"{'FAILED' if i % 17 == 0 else 'PASSED'} in 0.{i % 9}3s\n"
    for i in range(1_400)
)


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """``coroutine`` run to its end in a thread of its own: Playwright's sync API holds
    this thread's event loop (tests/ui/conftest.py). The in-memory stores it writes to
    hold no loop's objects."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(coroutine)))
    thread.start()
    thread.join()
    return result[0]


def png(width: int, height: int) -> bytes:
    """A small PNG screenshot-like image: a window with a title bar and text lines."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    rows = []
    for y in range(height):
        row = bytearray()
        for x in range(width):
            if y < 18:
                pixel = (36, 41, 47)
            elif y > 30 and 8 <= y % 22 <= 12 and 16 <= x < 40 + (y * 37) % (width - 60):
                pixel = (101, 109, 118)
            else:
                pixel = (246, 248, 250)
            row += bytes(pixel)
        rows.append(b"\x00" + bytes(row))
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x02\x00\x00\x00"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


CHECKPOINT = {
    "user_goal": "Make payments/checkout_test.py pass reliably and get CI green",
    "active_task": "Replacing the sleep-based wait in test_pay with an event the fake gateway sets",
    "constraints_and_preferences": [
        "Do not touch the production retry policy",
        "Keep the fixtures in conftest.py",
    ],
    "completed_actions": [
        "Ran the suite 20 times: test_pay fails 1 in 17",
        "Found the race: the fake gateway answers before the webhook is registered",
    ],
    "active_state": "payments/tests/fakes.py has a registered event; test_pay still sleeps",
    "key_findings": ["The flake is in the test, not in checkout.py"],
    "errors_and_fixes": ["ImportError in fakes.py: fixed the relative import"],
    "resolved_questions": ["CI runs the tests in parallel (pytest-xdist, 4 workers)"],
    "pending_user_asks": ["Say which other tests use the same sleep"],
    "files_modified": ["payments/tests/fakes.py", "payments/tests/checkout_test.py"],
    "last_action": "Edited test_pay to wait on gateway.registered",
}


def coding_session(text_ref: str, image_ref: str) -> list[Any]:
    """Forty requests of a coding agent: the context grows, the filter offloads a test
    log, two compactions bring it back under the trigger, a changed system prompt breaks
    the cache once, the model restores a ref once."""
    entries, removed, summarised, now = [], 0, False, time.time()
    for i in range(40):
        client = 14_000 + i * 5_000 + (i * 7_919) % 2_500
        if i == 5:
            removed = 9_000
        upstream = client - removed
        compaction = upstream > 134_265
        if compaction:
            removed = client - 84_000
            upstream = 84_000
            summarised = True
        verdict, reason = ("warm", None)
        if i == 0:
            verdict, reason = "cold", "new"
        elif compaction:
            verdict, reason = "cold", "diverged"
        elif i == 24:
            verdict, reason = "break", "system"
        uncached = upstream if verdict != "warm" else 4_300
        cached = upstream - uncached
        with_gateway = (uncached * 3.0 + cached * 0.3 + 900 * 15.0) / 1e6
        blend = (uncached * 3.0 + cached * 0.3) / upstream
        stages = [
            stage("guard_inbound", client, client),
            stage("native_edits", client, client),
            stage("thinking", client, client),
            stage("media", client, client - 1_600 if i >= 30 else client, changed=i >= 30),
            stage("filter", client, client - 9_000 if i >= 5 else client, changed=i >= 5),
            stage("ttl_prune", upstream, upstream),
            stage(
                "compress",
                client - (9_000 if i >= 5 else 0),
                upstream,
                changed=removed > 9_000,
                note="cut=41, groups=12" if compaction else None,
            ),
            stage("summarize", upstream, upstream, changed=summarised, note="applied=True"),
            stage("normalize", upstream, upstream),
            stage("cache_markers", upstream, upstream, changed=True, note="breakpoints=3"),
            stage("guard_outbound", upstream, upstream),
        ]
        body = summary(
            f"cg-{i + 1:04d}-{(i * 2_654_435_761) % 16**8:08x}",
            now - (40 - i) * 47,
            client=client,
            upstream=upstream,
            compaction=compaction,
            verdict=verdict,
            reason=reason,
            cached=cached,
            cost=(round(with_gateway, 6), round(with_gateway + removed * blend / 1e6, 6)),
            stages=stages,
            refs=[
                {
                    "ref": text_ref,
                    "stage": "filter",
                    "kind": "tool output",
                    "bytes": len(LOG),
                    "replaced": "tool message, 75,432 characters",
                },
                {
                    "ref": image_ref,
                    "stage": "media",
                    "kind": "image",
                    "bytes": 48_211,
                    "replaced": "user message, 1 image",
                },
            ][: (i >= 5) + (i >= 30)],
            checkpoint={"start": 3, "end": 41, "fields": CHECKPOINT} if summarised else None,
            restores=1 if i == 33 else 0,
        )
        body["cache"]["uncached"] = uncached
        entries.append((body, conversation_detail(text_ref, image_ref)))
    return entries


def conversation_detail(text_ref: str, image_ref: str) -> list[dict[str, Any]]:
    placeholder = f"[Tool output offloaded: 1,400 lines, 75,432 characters; ref {text_ref}]"
    return [
        message(
            "kept",
            "system",
            "You are Claude Code, an interactive CLI tool that helps with software tasks.",
            "You are Claude Code, an interactive CLI tool that helps with software tasks.",
        ),
        message("kept", "user", TITLE, TITLE),
        message("summarised", "assistant", "Let me run the test suite a few times.", None),
        message("summarised", "tool", LOG[:2_000] + "…", None),
        message("summarised", "assistant", "The failure is a race in the fake gateway.", None),
        message(
            "added",
            "user",
            None,
            "[Recalled context] Goal: make payments/checkout_test.py pass reliably. "
            "Done: ran the suite 20 times, found the race in the fake gateway. Now: "
            "replacing the sleep in test_pay with an event.",
        ),
        message("offloaded", "tool", LOG, placeholder, [text_ref]),
        message(
            "offloaded",
            "user",
            "Here is what CI shows: [image]",
            f"Here is what CI shows: [image offloaded; ref {image_ref}]",
            [image_ref],
        ),
        message(
            "shortened",
            "assistant",
            "I'll look at fakes.py. " + "The fake gateway registers its webhook late. " * 12,
            "I'll look at fakes.py. The fake gateway registers its webhook late. [… 540 "
            "characters shortened]",
        ),
        message("kept", "assistant", "→ edit_file(payments/tests/fakes.py)", "→ edit_file(...)"),
        message("kept", "tool", "Edited payments/tests/fakes.py (+6 −2)", "Edited (+6 −2)"),
        message(
            "kept",
            "user",
            "Good. Now which other tests use the same sleep?",
            "Good. Now which other tests use the same sleep?",
        ),
    ]


def shorter(requests: int, model: str, title: str, *, priced: bool, seed: int) -> list[Any]:
    """A short conversation of ``requests`` requests, none compacted."""
    now, found = time.time(), []
    for i in range(requests):
        client = 6_000 + i * 2_100
        body = summary(
            f"cg-{seed}{i:03d}",
            now - 3_600 * seed - (requests - i) * 30,
            client=client,
            upstream=client - (1_500 if i > 1 else 0),
            model=model,
            api="responses",
            verdict="cold" if i == 0 else "warm",
            reason="new" if i == 0 else None,
            cost=(0.004 * (i + 1), 0.0046 * (i + 1)) if priced else (None, None),
        )
        found.append((body, None))
    return [(found[0][0], None, title), *((b, d, title) for b, d in found[1:])]


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayServer]:
    """A gateway with two tenants, memory stores, Acme's ledger holding four conversations
    and Globex's one."""
    settings = Settings(
        upstream=UpstreamSettings(base_url="http://127.0.0.1:9/v1", api_key="sk-upstream"),
        tenants=(
            TenantSettings("acme", (hash_key(ACME_KEY),)),
            TenantSettings("globex", (hash_key(GLOBEX_KEY),)),
        ),
        summaries=False,
    )
    with GatewayServer(settings) as gateway_server:
        run(fill(gateway_server.app.state.gateway))
        yield gateway_server


async def fill(gateway: Gateway) -> None:
    objects, ledger = gateway.stores.objects, gateway.stores.ledger
    text_ref = await objects.put("tenant:acme", LOG.encode(), ttl=3_600)
    image = "data:image/png;base64," + base64.b64encode(png(320, 200)).decode()
    image_ref = await objects.put(
        "tenant:acme",
        f'{{"type":"image_url","image_url":{{"url":"{image}"}}}}'.encode(),
        ttl=3_600,
    )
    conversations: list[tuple[str, list[Any]]] = [
        (
            "codex-ui",
            shorter(
                8, "gpt-4.1", "Add a dark mode toggle to the settings page", priced=True, seed=2
            ),
        ),
        (
            "qwen-docs",
            shorter(5, "qwen3-coder-480b", "Write the README for the CLI", priced=False, seed=5),
        ),
        (
            "markup",
            shorter(
                3, "gpt-4o-mini", f"Why does {SCRIPT} not run in my page?", priced=True, seed=1
            ),
        ),
    ]
    for name, requests in conversations:
        for body, detail, title in requests:
            await ledger.add("tenant:acme", name, entry(body, detail, title))
    markup = summary("cg-markup-detail", time.time() - 300, client=900, upstream=900)
    await ledger.add(
        "tenant:acme",
        "markup",
        entry(markup, [message("kept", "user", f"Why does {SCRIPT} not run?", SCRIPT)]),
    )
    for body, detail in coding_session(text_ref, image_ref):
        await ledger.add("tenant:acme", "payments-flake", entry(body, detail, TITLE))
    globex = summary("cg-globex-1", time.time() - 10, client=5_000, upstream=5_000)
    await ledger.add("tenant:globex", "globex-1", entry(globex, None, "Globex quarterly numbers"))
    await objects.put("tenant:globex", b"Globex's own tool output", ttl=3_600)


def log_in(page: Page, server: GatewayServer, key: str) -> None:
    page.goto(f"{server.url}/ui/")
    page.get_by_label("Your gateway key").fill(key)
    page.get_by_role("button", name="Show my conversations").click()
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()


@pytest.fixture
def watched(page: Page) -> tuple[Page, list[str]]:
    """The page, and what it reported that a person should never see: dialogs opened,
    console errors (a CSP violation among them), requests that failed."""
    problems: list[str] = []

    def dialog(shown: Dialog) -> None:
        problems.append(f"dialog: {shown.message}")
        shown.dismiss()

    page.on("dialog", dialog)
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    return page, problems


def test_a_session_read_in_the_browser(
    watched: tuple[Page, list[str]], server: GatewayServer
) -> None:
    """Log in, read the list, the timeline and a request, follow a ref to its original
    text and an image, with screenshots of the three views."""
    page, problems = watched
    page.goto(f"{server.url}/")
    expect(page.get_by_label("Your gateway key")).to_be_visible()
    log_in(page, server, ACME_KEY)

    rows = page.locator("table.conversations tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.first).to_contain_text(TITLE)
    expect(page.get_by_text(f"Why does {SCRIPT} not run in my page?")).to_be_visible()
    qwen = rows.filter(has_text="Write the README for the CLI")
    expect(qwen.locator("td.num .unknown")).to_have_count(3)
    page.screenshot(path=SCREENSHOTS / "inspector-list.png")

    page.get_by_role("link", name=TITLE).click()
    expect(page.get_by_role("heading", name=TITLE)).to_be_visible()
    chart = page.locator("figure.chart > svg")
    expect(chart.locator("path.marker.compaction")).to_have_count(2)
    expect(chart.locator("path.marker.cache-break")).to_have_count(1)
    expect(chart.locator("path.level-budget")).to_have_count(1)
    expect(page.locator("table.requests tbody tr")).to_have_count(40)
    page.screenshot(path=SCREENSHOTS / "inspector-timeline.png")

    page.locator("table.requests tbody tr").first.locator("a").first.click()
    expect(page.get_by_role("heading", name="Request")).to_be_visible()
    expect(page.locator("table.messages tbody tr")).to_have_count(12)
    expect(page.locator("table.messages .fate.offloaded")).to_have_count(2)
    expect(page.get_by_text("Pending user asks")).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "inspector-request.png", full_page=True)

    offloaded = page.locator("table.messages tr.row-offloaded")
    offloaded.first.locator("a.ref").first.click()
    expect(page.locator("pre.object")).to_contain_text("checkout_test.py::test_pay[0] FAILED")
    page.go_back()
    offloaded.nth(1).locator("a.ref").first.click()
    image = page.get_by_role("img", name="The offloaded image")
    expect(image).to_be_visible()
    assert image.evaluate("img => img.naturalWidth") == 320
    assert problems == []


def test_markup_from_the_ledger_is_text_and_runs_nothing(
    watched: tuple[Page, list[str]], server: GatewayServer
) -> None:
    """A title and a message holding a script tag show it as text; no dialog opens."""
    page, problems = watched
    log_in(page, server, ACME_KEY)
    page.get_by_role("link", name=f"Why does {SCRIPT} not run in my page?").click()
    expect(
        page.get_by_role("heading", name=f"Why does {SCRIPT} not run in my page?")
    ).to_be_visible()
    page.locator("table.requests tbody tr").first.locator("a").first.click()
    expect(page.locator("table.messages").get_by_text(SCRIPT).first).to_be_visible()
    assert page.locator("main script").count() == 0
    assert problems == []


def test_the_timeline_updates_while_the_session_runs(
    watched: tuple[Page, list[str]], server: GatewayServer
) -> None:
    """A request entered while the page is open appears within a poll, without a reload."""
    page, problems = watched
    page.clock.install()  # the poll's 5 s run at once below, not waited out
    log_in(page, server, GLOBEX_KEY)
    page.get_by_role("link", name="Globex quarterly numbers").click()
    expect(page.locator("table.requests tbody tr")).to_have_count(1)
    page.wait_for_load_state("load")  # the navigation's own load is not a reload
    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))
    later = summary("cg-globex-2", time.time(), client=7_500, upstream=7_000)
    ledger = server.app.state.gateway.stores.ledger
    run(ledger.add("tenant:globex", "globex-1", entry(later, None, "")))
    page.clock.run_for(5_000)
    expect(page.locator("table.requests tbody tr")).to_have_count(2, timeout=12_000)
    expect(page.locator("figure.chart circle.dot.upstream")).to_have_count(2)
    assert loads == []
    assert problems == []


def test_another_tenant_sees_nothing_of_acme(
    watched: tuple[Page, list[str]], server: GatewayServer
) -> None:
    """Globex's session lists Globex's conversation only; Acme's pages are 404s to it."""
    page, _ = watched
    log_in(page, server, GLOBEX_KEY)
    expect(page.locator("table.conversations tbody tr")).to_have_count(1)
    expect(page.get_by_text("Globex quarterly numbers")).to_be_visible()
    expect(page.get_by_text(TITLE)).to_have_count(0)
    response = page.goto(f"{server.url}/ui/conversations/payments-flake")
    assert response is not None
    assert response.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_label("Your gateway key")).to_be_visible()


def test_switched_off_the_page_is_not_there(page: Page) -> None:
    """With ``inspector.ui`` off the browser gets 404s where the page was, and the root
    leads nowhere; the JSON API stays."""
    settings = Settings(
        upstream=UpstreamSettings(base_url="http://127.0.0.1:9/v1", api_key="sk-upstream"),
        tenants=(TenantSettings("acme", (hash_key(ACME_KEY),)),),
        inspector=InspectorSettings(ui=False),
        summaries=False,
    )
    with GatewayServer(settings) as off:
        for path in ("/ui/", "/", "/ui/static/inspector.css"):
            response = page.goto(f"{off.url}{path}")
            assert response is not None
            assert response.status == 404
        expect(page.get_by_label("Your gateway key")).to_have_count(0)
        listed = page.request.get(
            f"{off.base_url}/context/conversations",
            headers={"authorization": f"Bearer {ACME_KEY}"},
        )
        assert listed.status == 200
