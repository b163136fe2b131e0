"""Which headers cross the gateway: those of a client's request that go upstream, and those
of an upstream's answer that go back to the client.

Hop-by-hop headers never cross; neither do the gateway's own (``x-contextgate-*``), the
client's cookies, nor what describes a body's encoding on one side of the hop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import httpx

__all__ = ["HOP_BY_HOP", "relayable_response_headers", "upstream_request_headers"]

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED: Final = HOP_BY_HOP | {
    "host",
    "content-length",
    "accept-encoding",
    "cookie",
    "expect",
}
_NOT_RELAYED: Final = HOP_BY_HOP | {
    "content-length",
    "content-encoding",
    "date",
    "server",
    "set-cookie",
}


def upstream_request_headers(
    client_headers: Iterable[tuple[str, str]], api_key: str | None
) -> dict[str, str]:
    """The client's headers minus hop-by-hop and gateway ones; the configured key, if any,
    replaces the caller's ``Authorization``. Without one, a caller presenting its key only
    as ``x-api-key`` (Anthropic's SDK) has it sent as ``Authorization: Bearer``, the header
    OpenAI-compatible upstreams read (and ``gateway.providers.anthropic`` reads either)."""
    headers: dict[str, str] = {}
    for name, value in client_headers:
        lower = name.lower()
        if lower in _NOT_FORWARDED or lower.startswith("x-contextgate-"):
            continue
        headers[lower] = value
    if api_key is None and "authorization" not in headers:
        api_key = headers.get("x-api-key") or None
    if api_key is not None:
        headers["authorization"] = f"Bearer {api_key}"
        headers.pop("x-api-key", None)
    return headers


def relayable_response_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The upstream's response headers that make sense to relay to the client."""
    return [
        (name, value)
        for name, value in headers.multi_items()
        if name.lower() not in _NOT_RELAYED and not name.lower().startswith("x-contextgate-")
    ]
