"""OpenAI Responses requests <-> the OpenAI chat request the pipeline works on, for the
inbound ``/v1/responses`` route (the openai SDK's ``responses``, the Agents SDK, Codex
CLI). No I/O.

``parse_request`` checks a body as far as the pipeline reads it and splits it into
``chat`` (the chat request the pipeline works on: ``model``, the messages of
``instructions`` and ``input`` (``responses.items``), ``tools`` as they are, for the
budget, ``max_output_tokens`` as ``max_completion_tokens``, ``stream`` and
``prompt_cache_key``) and ``native``, the body as it came. After the pipeline,
``to_request`` gives the Responses request again: ``native`` with the pipeline's items,
instructions, tools and ``prompt_cache_key`` laid over it, every other field (``store``,
``include``, ``reasoning``, ``text``, ``client_metadata``, ...) as the client sent it. An
``input`` the pipeline left alone goes up as sent (a string stays a string).

A request that continues server-side state (``previous_response_id`` or
``conversation``) is ``stateful``: the gateway sees only the new items, not the history
they continue, so it manages them (hygiene, offload) and does not compact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.codecs.json_body import json_object, type_error
from gateway.codecs.responses.items import chat_messages, instructions_of, response_items

__all__ = ["InboundRequest", "input_items", "parse_request", "to_request"]

_STATE_FIELDS: Final = ("previous_response_id", "conversation")


@dataclass(frozen=True, slots=True)
class InboundRequest:
    """A Responses request as the pipeline sees it, and as it came."""

    chat: dict[str, Any]
    """The OpenAI chat request the pipeline works on."""
    native: dict[str, Any]
    """The request as received."""

    @property
    def stateful(self) -> bool:
        """Whether it continues state the upstream keeps (``previous_response_id``,
        ``conversation``, or an ``item_reference`` to a stored item): then the gateway
        cannot see, so cannot compact, the history."""
        if any(self.native.get(field) is not None for field in _STATE_FIELDS):
            return True
        items = self.native.get("input")
        return isinstance(items, list) and any(
            isinstance(item, dict) and item.get("type") == "item_reference" for item in items
        )

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages parsing made (for ``to_request``)."""
        found: list[dict[str, Any]] = self.chat["messages"]
        return found

    @property
    def stream(self) -> bool:
        return self.native.get("stream") is True


def parse_request(raw: bytes) -> InboundRequest:
    """The Responses request in ``raw``, checked (``InvalidRequest`` naming what is wrong
    otherwise), split for the pipeline."""
    return from_body(json_object(raw))


def from_body(body: dict[str, Any]) -> InboundRequest:
    """``body``, a Responses request as a dict, checked and split for the pipeline."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise type_error("model", "a non-empty string", model)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise type_error("stream", "a boolean", stream)
    items = _items(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise type_error("instructions", "a string", instructions)
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)
    ):
        raise type_error("tools", "an array of objects", tools)
    chat: dict[str, Any] = {"model": model, "messages": chat_messages(items, instructions)}
    if tools:
        chat["tools"] = tools
    reply = body.get("max_output_tokens")
    if isinstance(reply, int) and not isinstance(reply, bool):
        chat["max_completion_tokens"] = reply
    for field in ("stream", "prompt_cache_key", "user"):
        if body.get(field) is not None:
            chat[field] = body[field]
    return InboundRequest(chat, body)


def _items(value: Any) -> list[dict[str, Any]]:
    """``input`` as items: a string is one user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise type_error("input", "a string or an array of items", value)
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise type_error(f"input[{index}]", "an object", item)
        kind = item.get("type")
        if kind is not None and not isinstance(kind, str):
            raise type_error(f"input[{index}].type", "a string", kind)
        if kind in (None, "message"):
            _check_message(index, item)
    return value


def _check_message(index: int, item: Mapping[str, Any]) -> None:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise type_error(
            f"input[{index}].role", "one of 'user', 'assistant', 'system', 'developer'", role
        )
    content = item.get("content")
    if not isinstance(content, (str, list)):
        raise type_error(f"input[{index}].content", "a string or an array of parts", content)
    if isinstance(content, list):
        for number, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise type_error(
                    f"input[{index}].content[{number}]", "an object with a 'type'", part
                )


def to_request(
    outgoing: Mapping[str, Any],
    native: Mapping[str, Any],
    parsed: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The Responses request for the pipeline's chat request ``outgoing``, made from the
    client's ``native`` request (``parsed``: the messages parsing made, whose untouched
    ones give their items at once: ``InboundRequest.messages``)."""
    request = dict(native)
    messages = outgoing.get("messages") or []
    items = response_items(messages, parsed)
    sent = native.get("input")
    if items != input_items(sent):
        request["input"] = items
    instructions = instructions_of(messages)
    if instructions is not None:
        request["instructions"] = instructions
    for field in ("model", "prompt_cache_key"):
        value = outgoing.get(field)
        if value is not None and value != native.get(field):
            request[field] = value
    tools = outgoing.get("tools")
    if isinstance(tools, list) and tools != native.get("tools"):
        request["tools"] = [_responses_tool(tool) for tool in tools]
    return request


def _responses_tool(tool: Any) -> Any:
    """A tool the pipeline added in the chat form (the gateway's restore tool) in the
    Responses form: its function's fields at the top level. A client's tool as it is."""
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(tool, Mapping) or tool.get("type") != "function" or function is None:
        return tool
    if not isinstance(function, Mapping):
        return tool
    return {"type": "function", "strict": False, **function}


def input_items(value: Any) -> list[Any]:
    """A request's ``input`` as items, unchecked: a string is one user message, anything
    but a list none."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []
