"""The inspector end to end: real requests through the gateway (a tool output offloaded,
a long history compacted), their ledger written by the gateway itself, then read in a real
Chromium with the key the client used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from pipelines import ModelInfo, ModelPrice
from tests.conftest import settings_for
from tests.gateway.routes.test_conversations import KEY, chat, listed
from tests.gateway.routes.test_objects import OUTPUT, history
from tests.harness import GatewayServer
from tests.mock_upstream import MockUpstream


@pytest.fixture
def server(upstream: MockUpstream) -> Iterator[GatewayServer]:
    """A passthrough gateway (callers' own keys) with a 6,000-token model that compacts."""
    settings = settings_for(
        upstream,
        models=(ModelInfo("tiny-*", 6_000, 1_000),),
        prices=(ModelPrice("tiny-*", 1.0, 4.0, 0.1),),
    )
    with GatewayServer(settings) as gateway:
        yield gateway


def long_history() -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Plan the migration."}]
    for n in range(60):
        turns += [
            {"role": "assistant", "content": f"Step {n}: " + "checked the schema again. " * 12},
            {"role": "user", "content": f"Go on with step {n + 1}."},
        ]
    return turns


def test_what_went_through_the_gateway_is_on_the_page(
    page: Page, server: GatewayServer, upstream: MockUpstream
) -> None:
    """The list has both conversations; the compacted one's timeline marks its compaction
    and its request shows what was pruned and added; the other's offloaded tool output is
    a ref whose page holds the original bytes."""
    chat(server, upstream, history(OUTPUT))
    chat(server, upstream, long_history(), model="tiny-1")
    listed(server, count=2)

    page.goto(f"{server.url}/ui/")
    page.get_by_label("The API key your client sends").fill(KEY)
    page.get_by_role("button", name="Show my conversations").click()
    rows = page.locator("table.conversations tbody tr")
    expect(rows).to_have_count(2)

    page.get_by_role("link", name="Plan the migration.").click()
    expect(page.locator("figure.chart > svg path.marker.compaction")).to_have_count(1)
    expect(page.locator("table.requests .badge.compaction")).to_have_count(1)
    page.locator("table.requests tbody tr").first.locator("a").first.click()
    expect(page.locator("table.messages .fate.pruned").first).to_be_visible()
    expect(page.locator("table.messages .fate.added").first).to_be_visible()
    compress = page.locator("table.stages-table tr", has_text="compress")
    expect(compress.locator(".badge.yes")).to_be_visible()

    page.get_by_role("link", name="Conversations").click()
    page.get_by_role("link", name="Export the bookings.").click()
    page.locator("table.requests tbody tr").first.locator("a").first.click()
    offloaded = page.locator("table.messages tr.row-offloaded")
    expect(offloaded).to_have_count(1)
    offloaded.locator("a.ref").first.click()
    expect(page.locator("pre.object")).to_contain_text(OUTPUT.splitlines()[0])
    expect(page.locator("pre.object")).to_contain_text(OUTPUT.splitlines()[-1])
