"""GET /v1/context/objects/{ref}: what the pipeline offloaded, restored exactly, by the
caller that sent it and nobody else."""

from __future__ import annotations

import asyncio
import base64
import os
import re
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import settings_for
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
OUTPUT = "".join(
    f"{i:05d} booking BK{i:06d} status=confirmed seat {i % 40}A\n" for i in range(5_000)
)


def history(output: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "export", "arguments": "{}"}}
    return [
        {"role": "user", "content": "Export the bookings."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]


def offload(gateway: GatewayServer, upstream: MockUpstream, key: str, messages: Any) -> str:
    """Send ``messages`` with ``key``; the ref the upstream saw in their place."""
    upstream.push(JSONReply(chat_completion()))
    with openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0) as client:
        client.chat.completions.create(model="gpt-4o", messages=messages)
    sent = orjson.dumps(upstream.received[-1].json()["messages"]).decode()
    found = REF.search(sent)
    assert found is not None, "nothing was offloaded"
    return found.group()


def fetch(gateway: GatewayServer, ref: str, key: str, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{gateway.base_url}/context/objects/{ref}",
        params=params,
        headers={"authorization": f"Bearer {key}"},
    )


def test_a_large_tool_output_restores_byte_for_byte(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    ref = offload(gateway, upstream, "sk-alice", history(OUTPUT))
    response = fetch(gateway, ref, "sk-alice")
    assert response.status_code == 200
    assert response.content == OUTPUT.encode()
    assert response.headers["x-contextgate-object-bytes"] == str(len(OUTPUT.encode()))
    assert response.headers["x-contextgate-object-lines"] == "5000"
    assert response.headers["content-type"].startswith("text/plain")


def test_a_screenshot_restores_byte_for_byte(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """An image the media window removed comes back as the exact part that was sent."""

    def screenshot() -> dict[str, Any]:
        data = base64.b64encode(os.urandom(90_000)).decode()
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}

    messages = [
        {"role": "user", "content": [{"type": "text", "text": f"screen {n}"}, screenshot()]}
        for n in range(3)
    ]
    ref = offload(gateway, upstream, "sk-alice", messages)
    restored = fetch(gateway, ref, "sk-alice")
    assert restored.status_code == 200
    assert orjson.loads(restored.content) == messages[0]["content"][1]


def test_another_key_gets_404(gateway: GatewayServer, upstream: MockUpstream) -> None:
    ref = offload(gateway, upstream, "sk-alice", history(OUTPUT + "alice\n"))
    stranger = fetch(gateway, ref, "sk-mallory")
    assert stranger.status_code == 404
    assert stranger.json()["error"]["code"] == "not_found"
    assert OUTPUT[:50] not in stranger.text
    assert fetch(gateway, ref, "sk-alice").status_code == 200


def test_line_ranges(gateway: GatewayServer, upstream: MockUpstream) -> None:
    ref = offload(gateway, upstream, "sk-alice", history(OUTPUT))
    lines = OUTPUT.splitlines(keepends=True)
    part = fetch(gateway, ref, "sk-alice", start_line=10, end_line=12)
    assert part.text == "".join(lines[9:12])
    assert part.headers["x-contextgate-object-range"] == "lines=10-12"
    assert part.headers["x-contextgate-object-lines"] == "5000"
    tail = fetch(gateway, ref, "sk-alice", start_line=4_999)
    assert tail.text == "".join(lines[4998:])
    bad = fetch(gateway, ref, "sk-alice", start_line=5, end_line=2)
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_range"
    assert fetch(gateway, ref, "sk-alice", start_line="x").status_code == 400


def test_anything_not_a_ref_is_404(gateway: GatewayServer) -> None:
    for name in ("ctx_short", "notaref", "ctx_" + "A" * 24):
        response = fetch(gateway, name, "sk-alice")
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_each_object_names_its_type_and_charset_once(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A text object, a range of it and an image part (JSON) are ``text/plain;
    charset=utf-8``, the charset said once."""
    text = offload(gateway, upstream, "sk-alice", history(OUTPUT + "charset\n"))
    data = base64.b64encode(os.urandom(90_000)).decode()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    screens = [{"role": "user", "content": [{"type": "text", "text": "s"}, image]}] * 3
    media = offload(gateway, upstream, "sk-alice", screens)
    for response in (
        fetch(gateway, text, "sk-alice"),
        fetch(gateway, text, "sk-alice", start_line=2, end_line=3),
        fetch(gateway, media, "sk-alice"),
    ):
        assert response.status_code == 200
        assert response.headers.get_list("content-type") == ["text/plain; charset=utf-8"]


def test_an_object_that_is_not_utf8_is_octet_stream(upstream: MockUpstream) -> None:
    """Bytes that are not UTF-8 come back as ``application/octet-stream``, no charset."""
    with GatewayServer(settings_for(upstream)) as server:
        stores = server.app.state.gateway.stores

        async def put() -> str:
            namespace = await stores.namespace_of("sk-alice")
            return await stores.objects.put(namespace, b"\xff\xfe binary\n", ttl=60)

        ref = asyncio.run(put())
        response = fetch(server, ref, "sk-alice")
    assert response.status_code == 200
    assert response.content == b"\xff\xfe binary\n"
    assert response.headers.get_list("content-type") == ["application/octet-stream"]


@pytest.mark.parametrize("value", ["²", "9" * 5_000, "-1", "0"])
def test_odd_line_numbers_are_refused(value: str) -> None:
    from gateway.errors import InvalidRequest
    from gateway.routes.objects import _line_param

    with pytest.raises(InvalidRequest):
        _line_param(value, "start_line")
