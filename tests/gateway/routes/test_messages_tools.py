"""``POST /v1/messages`` and a client's tools: a real gateway in front of the mock, which
speaks the Messages API for ``claude-*`` models, and the bytes of ``tools`` it receives."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gateway.context.restore import RESTORE_TOOL_NAME
from tests.gateway.codecs.messages.samples import CLAUDE_CODE_TOOLS
from tests.gateway.routes.test_messages import ANSWER, MESSAGES
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream


@pytest.fixture
def gateway(anthropic_gateway: GatewayServer) -> GatewayServer:
    return anthropic_gateway


def test_claude_codes_tools_reach_anthropic_in_the_clients_bytes(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A Claude-Code-like tool list reaches Anthropic tool for tool in the client's bytes,
    every key in the client's order (the prompt cache compares them), and the gateway's
    restore tool after them."""
    upstream.push(JSONReply(ANSWER))
    request = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32_000,
        "messages": MESSAGES,
        "tools": CLAUDE_CODE_TOOLS,
    }
    response = httpx.post(f"{gateway.url}/v1/messages", content=orjson.dumps(request))
    assert response.status_code == 200
    (sent,) = upstream.received
    tools = sent.json()["tools"]
    assert [tool["name"] for tool in tools] == [
        *(tool["name"] for tool in CLAUDE_CODE_TOOLS),
        RESTORE_TOOL_NAME,
    ]
    assert [list(tool.items()) for tool in tools[:-1]] == [
        list(tool.items()) for tool in CLAUDE_CODE_TOOLS
    ]
    assert orjson.dumps(CLAUDE_CODE_TOOLS)[:-1] in sent.body
