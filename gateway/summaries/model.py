"""The summary model's calls, whoever serves it: a chat request in, a chat completion (or
an error in OpenAI's envelope) out. To an OpenAI-compatible upstream the request goes as it
is; to Claude as its Messages translation, the answer translated back
(``gateway.codecs.chat_anthropic``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson

from gateway.codecs.chat_anthropic import from_message, openai_error, to_messages
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import ChatUpstream, json_answer
from gateway.summaries.summarizer import ChatPost

__all__ = ["chat_post"]


def chat_post(
    provider: ChatUpstream | AnthropicUpstream,
    headers: Mapping[str, str],
    max_tokens_for: Callable[[str], int],
) -> ChatPost:
    """The summarizer's calls to ``provider`` with ``headers``: a chat completions request
    there, or its Messages translation to Claude (``max_tokens_for`` the model the call
    names when it sets none: the summarizer may call the request's own model when the
    summary model's window is too small), with the answer made a chat completion and an
    error put in OpenAI's envelope."""
    headers = {**headers, "content-type": "application/json"}

    async def post(body: dict[str, Any]) -> tuple[int, bytes]:
        if not isinstance(provider, AnthropicUpstream):
            content = orjson.dumps(body)
            response = await provider.send(
                "POST", "chat/completions", headers=headers, content=content
            )
            return response.status_code, await provider.read_body(response, _limit(response))
        request = to_messages(body, default_max_tokens=max_tokens_for(str(body.get("model", ""))))
        response = await provider.send_messages(orjson.dumps(request), headers)
        answer = await provider.read_body(response, _limit(response))
        if not response.is_success:
            return response.status_code, openai_error(response.status_code, answer)
        message = json_answer(answer, "a message", listing="content")
        return 200, orjson.dumps(from_message(message, created=int(time.time())))

    def _limit(response: httpx.Response) -> int | None:
        return None if response.is_success else provider.settings.max_error_body_bytes

    return post
