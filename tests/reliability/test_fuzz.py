"""Hypothesis against the running gateway: mutated chat, Messages and dry-run bodies with
odd headers never get a server error, every error comes in the route's envelope, and the
gateway still serves afterwards. ``CONTEXTGATE_FUZZ=deep`` runs many more examples."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.reliability.bodies import (
    chat_bodies,
    damaged,
    encoded,
    headers,
    messages_bodies,
    mutated,
)
from tests.reliability.oracle import POST_ROUTES, assert_alive, check_answer

settings.register_profile(
    "fuzz-fast",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz-deep",
    max_examples=3_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(f"fuzz-{os.environ.get('CONTEXTGATE_FUZZ', 'fast')}")
"""``fast`` (CI, the module in well under a minute) or ``deep`` (``make fuzz-deep``)."""

CHAT_ROUTES = ("/v1/chat/completions", "/v1/context/compact")
MESSAGES_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")


@st.composite
def fuzzed_requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, bytes]]:
    """A POST route, a body meant (mostly) for it, mutated and maybe damaged, and headers."""
    route = draw(st.sampled_from(POST_ROUTES))
    own = chat_bodies if route in CHAT_ROUTES else messages_bodies
    other = messages_bodies if route in CHAT_ROUTES else chat_bodies
    body: Any = draw(mutated(st.one_of(own, own, own, other)))
    raw = draw(damaged(encoded(body, draw(st.booleans()))))
    return route, raw, draw(headers())


@PROFILE
@given(fuzzed_requests())
def test_fuzzed_requests(
    fuzz_client: httpx.Client, request: tuple[str, bytes, dict[str, bytes]]
) -> None:
    """Whatever the body and headers: no 5xx, and each error is a documented 4xx in the
    route's envelope."""
    route, raw, sent_headers = request
    response = fuzz_client.post(route, content=raw, headers=sent_headers)
    event(f"status {response.status_code}")
    check_answer(route, response)


@PROFILE
@given(st.sampled_from(CHAT_ROUTES), mutated(chat_bodies))
def test_mutated_chat_bodies(fuzz_client: httpx.Client, route: str, body: Any) -> None:
    """Well-formed JSON chat bodies, mutated field by field: no 5xx, errors enveloped."""
    raw = encoded(body, ascii_only=True)
    response = fuzz_client.post(route, content=raw, headers={"content-type": "application/json"})
    event(f"status {response.status_code}")
    check_answer(route, response)


@PROFILE
@given(st.sampled_from(MESSAGES_ROUTES), mutated(messages_bodies))
def test_mutated_messages_bodies(fuzz_client: httpx.Client, route: str, body: Any) -> None:
    """Well-formed JSON Messages bodies, mutated field by field: no 5xx, Anthropic's
    envelope on every error."""
    raw = encoded(body, ascii_only=True)
    response = fuzz_client.post(route, content=raw, headers={"content-type": "application/json"})
    event(f"status {response.status_code}")
    check_answer(route, response)


@pytest.mark.parametrize("route", POST_ROUTES)
def test_body_over_the_limit(fuzz_client: httpx.Client, route: str) -> None:
    """A body over ``max_body_bytes`` (32 MiB) is a 413 in the route's envelope."""
    raw = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "' + b"x" * (33 << 20)
    response = fuzz_client.post(route, content=raw + b'"}]}')
    assert response.status_code == 413
    check_answer(route, response)


def test_alive_after_fuzzing(fuzz_client: httpx.Client) -> None:
    """After everything above, the gateway is healthy and serves valid requests."""
    assert_alive(fuzz_client)
