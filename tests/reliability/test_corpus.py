"""The checked-in fuzz corpus (``tests/fixtures/fuzz/``), replayed on every POST route."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.reliability.conftest import CORPUS
from tests.reliability.oracle import POST_ROUTES, assert_alive, check_answer

INPUTS = sorted(p for p in CORPUS.iterdir() if p.name != "README.md")


def test_corpus_is_seeded() -> None:
    """The corpus holds at least the 30 hand-written inputs it started with."""
    assert len(INPUTS) >= 30


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_corpus_input(fuzz_client: httpx.Client, path: Path) -> None:
    """The input gets a success or a documented 4xx in each route's envelope, never a 5xx."""
    raw = path.read_bytes()
    for route in POST_ROUTES:
        response = fuzz_client.post(
            route, content=raw, headers={"content-type": "application/json"}
        )
        check_answer(route, response)


def test_alive_after_corpus(fuzz_client: httpx.Client) -> None:
    """After the whole corpus, the gateway is healthy and serves valid requests."""
    assert_alive(fuzz_client)
