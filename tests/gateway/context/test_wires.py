"""The upstream's side of an exchange, one wire per API: what goes up for the pipeline's
request (and a restore round's turns after it), and what a success must be."""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import orjson
import pytest

from gateway.codecs.chat_anthropic import to_messages
from gateway.config import AnthropicSettings, UpstreamSettings
from gateway.context.wires import ChatWire, MessagesWire
from gateway.errors import UpstreamInvalidAnswer
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import Upstream
from tests.gateway.codecs.chat_anthropic.samples import ANSWER
from tests.mock_upstream import chat_completion

OUTGOING: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "Which flight?"}],
    "metadata": {"note": "kept"},
}
ROUND = [
    {"role": "assistant", "content": "Let me look."},
    {"role": "user", "content": "restored"},
]


def openai_side(sent: list[httpx.Request]) -> Upstream:
    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=chat_completion())

    settings = UpstreamSettings(base_url="http://upstream.test/v1")
    return Upstream(settings, transport=httpx.MockTransport(handler))


def anthropic_side(sent: list[httpx2.Request]) -> AnthropicUpstream:
    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, json=ANSWER)

    return AnthropicUpstream(
        AnthropicSettings(base_url="http://anthropic.test"),
        UpstreamSettings(),
        transport=httpx2.MockTransport(handler),
    )


async def test_chat_sends_the_bytes_at_hand_and_a_round_after_the_messages() -> None:
    sent: list[httpx.Request] = []
    wire = ChatWire(openai_side(sent))
    encoded = b'{"model":"gpt-4o","messages":[]}'  # the request as the client's bytes
    await wire.send(OUTGOING, {}, encoded=encoded)
    await wire.send(OUTGOING, {}, encoded=encoded, extra=ROUND)
    await wire.upstream.aclose()
    assert sent[0].content == encoded
    assert orjson.loads(sent[1].content)["messages"] == [*OUTGOING["messages"], *ROUND]
    assert orjson.loads(sent[1].content)["metadata"] == {"note": "kept"}


async def test_chat_prepares_each_request_before_encoding_it() -> None:
    sent: list[httpx.Request] = []

    def prepare(request: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in request.items() if key != "metadata"}

    wire = ChatWire(openai_side(sent), prepare)
    await wire.send(OUTGOING, {}, encoded=orjson.dumps(OUTGOING))
    await wire.send(OUTGOING, {}, extra=ROUND)
    await wire.upstream.aclose()
    assert ["metadata" in orjson.loads(request.content) for request in sent] == [False, False]


async def test_messages_sends_the_translation_and_a_round_in_its_own_form() -> None:
    sent: list[httpx2.Request] = []
    wire = MessagesWire(anthropic_side(sent), to_messages)
    claude = {**OUTGOING, "model": "claude-sonnet-4", "metadata": None}
    turn = [{"role": "assistant", "content": [{"type": "text", "text": "Let me look."}]}]
    await wire.send(claude, {"authorization": "Bearer sk-ant-0001"})
    await wire.send(claude, {"authorization": "Bearer sk-ant-0001"}, extra=turn)
    await wire.upstream.aclose()
    first, second = (orjson.loads(request.content) for request in sent)
    assert first == to_messages(claude)
    assert second["messages"] == [*first["messages"], *turn]


@pytest.mark.parametrize("for_chat", [False, True])
def test_only_an_answer_for_a_chat_client_must_be_a_message(for_chat: bool) -> None:
    wire = MessagesWire(anthropic_side([]), to_messages, for_chat=for_chat)
    wire.check(orjson.dumps(ANSWER))
    if not for_chat:
        wire.check(b"<html>relayed as it came</html>")
        return
    with pytest.raises(UpstreamInvalidAnswer):
        wire.check(b"<html>not a message</html>")
