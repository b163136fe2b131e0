"""The restore loop on the Anthropic Messages API: a PDF offloaded on the Messages route
reaches Claude again, as a document block, when the model restores it."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import orjson

from tests.gateway.context.restore.samples import DOCUMENT, PDF, spec_and_screenshots
from tests.gateway.routes.test_messages import ANSWER as MESSAGES_ANSWER
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, Received, Reply


async def test_a_pdf_offloaded_on_the_messages_route_reaches_claude_again_on_restore(
    anthropic_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Through the gateway: the anthropic SDK sends a PDF and two newer screenshots, the
    PDF goes out as a placeholder with a ref, and the model's restore call gets the PDF
    back as a document block."""
    refs: list[str] = []

    def model(received: Received) -> Reply:
        if not refs:
            found = re.search(r"ctx_[A-Za-z0-9_-]{22,}", received.body.decode())
            assert found is not None
            refs.append(found.group())
            restore = {"type": "tool_use", "id": "toolu_r", "name": "context_restore"}
            content = [{**restore, "input": {"ref": refs[0]}}]
            return JSONReply({**ANSWER, "content": content, "stop_reason": "tool_use"})
        return JSONReply(ANSWER)

    upstream.handler = model
    messages = spec_and_screenshots()
    with anthropic.Anthropic(base_url=anthropic_gateway.url, api_key="k", max_retries=0) as sdk:
        answer = sdk.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=500,
            messages=messages,  # type: ignore[arg-type]
        )
    assert answer.content[0].text == "Page 1: scope."  # type: ignore[union-attr]
    first, second = (r.json() for r in upstream.received)
    assert PDF not in orjson.dumps(first).decode()
    assert second["messages"][-1]["content"][-1] == DOCUMENT


ANSWER: dict[str, Any] = {
    **MESSAGES_ANSWER,
    "content": [{"type": "text", "text": "Page 1: scope."}],
}
