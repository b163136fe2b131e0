"""Anthropic Messages requests <-> the OpenAI chat request the pipeline works on, for the
inbound ``/v1/messages`` route (Anthropic SDK clients, Claude-Code-style agents). No I/O.

``parse_request`` checks a body as the Messages API does (``messages.checks``) and splits
it with ``from_request`` into ``chat``, the OpenAI chat request the pipeline works on, and
``native``, the top-level fields the chat format has no exact place for, verbatim. After
the pipeline, ``to_request`` makes the Messages request for an Anthropic upstream
(``to_messages`` with ``native`` laid over it); ``messages_openai`` makes the chat request
for an OpenAI-compatible one and translates its answers.

Messages -> chat (the system prompt, turns and blocks: ``messages.blocks``):

- custom tools -> function tools, their other keys at the tool's top level; server tools
  (and any tool the way back would not give again) as they are. ``tools`` is kept in
  ``native`` too, as sent: the chat form keeps a tool's keys but not their order, and
  the way back gives each tool its keys in the client's order (below).
- ``max_tokens``, ``temperature``, ``top_p``, ``stream`` by name; ``stop_sequences`` ->
  ``stop`` and ``tool_choice`` -> its chat form (``disable_parallel_tool_use`` ->
  ``parallel_tool_calls: false``), ``cache_control`` (automatic caching, one of the
  four breakpoints the ``cache_markers`` stage counts) and ``context_management`` (the
  client's context editing, which the ``thinking`` stage reads) as they are, all four
  also kept in ``native``; every other field, and an empty ``system`` or ``tools``, ->
  ``native``.

So ``to_request`` gives back every valid request, in this canonical form: a string
``content`` or ``system`` is one text block (the API's documented shorthand); consecutive
turns of one role are one turn (the API joins them); an assistant turn's ``tool_use``
blocks come after its other blocks (the order Claude writes them in); a tool's
``"type": "custom"`` (the default) is left out. Each tool has its keys in the order the
client sent them, a key the gateway added (a cache marker) after them, so a tool the
gateway did not change is the client's bytes again: the provider's prompt cache and its
check of the thinking prefix compare them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.codecs.chat_anthropic import anthropic_tool, to_messages
from gateway.codecs.messages.blocks import chat_messages
from gateway.codecs.messages.checks import checked_body

__all__ = ["InboundRequest", "from_request", "parse_request", "to_request"]


@dataclass(frozen=True, slots=True)
class InboundRequest:
    """A Messages request as the pipeline sees it, plus what it does not need to see."""

    chat: dict[str, Any]
    """The OpenAI chat request the pipeline works on."""
    native: dict[str, Any]
    """Top-level Messages fields with no exact chat counterpart, verbatim."""


_BY_NAME: Final = ("max_tokens", "temperature", "top_p", "stream")

_REQUEST_FIRST: Final = ("system", "tools")
"""Fields the way back takes from ``native`` only when they are empty there and the chat
request gave none: ``native`` carries ``system`` only as the client sent it empty, and
``tools`` as the client sent them, for their key order (what the gateway added since,
the restore tool, stays)."""

_READ_FROM_NATIVE: Final = ("cache_control", "context_management", "compaction")
"""``native`` fields the pipeline reads too: automatic caching (one of the four
breakpoints), the client's context editing (``clear_thinking_20251015``) and its
on-demand compaction (``gateway.context.native``)."""


def parse_request(raw: bytes, *, counting: bool = False) -> InboundRequest:
    """The request in ``raw``, checked as the Messages API checks it (``InvalidRequest``
    otherwise, see ``messages.checks``; ``counting``: a ``count_tokens`` request, which
    has no ``max_tokens``), split for the pipeline."""
    return from_request(checked_body(raw, counting=counting))


def from_request(body: Mapping[str, Any]) -> InboundRequest:
    """``body``, a Messages request as ``parse_request`` accepts it, split for the pipeline."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages(body)}
    native: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("model", "messages") or (key == "system" and value):
            continue
        if key in _BY_NAME and value is not None:
            chat[key] = value
        elif key == "tools" and value:
            chat["tools"] = [_tool(tool) for tool in value]
            native["tools"] = value
        else:
            native[key] = value
            if key == "stop_sequences" and value:
                chat["stop"] = list(value)
            elif key in _READ_FROM_NATIVE and value:
                chat[key] = value
            elif key == "tool_choice":
                chat.update(_tool_choice(value))
    return InboundRequest(chat, native)


def to_request(
    chat: Mapping[str, Any], native: Mapping[str, Any], *, default_max_tokens: int
) -> dict[str, Any]:
    """The Messages request for an Anthropic upstream: ``chat`` as the pipeline left it,
    with the fields in ``native`` as the client sent them."""
    request = to_messages(chat, default_max_tokens=default_max_tokens)
    if native.get("tools") and request.get("tools"):
        request["tools"] = _in_client_order(request["tools"], native["tools"])
    request.update(
        {k: v for k, v in native.items() if k not in _REQUEST_FIRST or not (v or k in request)}
    )
    return request


def _in_client_order(tools: list[dict[str, Any]], sent: Sequence[Any]) -> list[dict[str, Any]]:
    """``tools`` with each one's keys in the order of the client's tool of its name in
    ``sent``, then the keys the gateway added to it; a tool the client did not send (the
    restore tool) as it is."""
    by_name: dict[str, Mapping[str, Any]] = {}
    for tool in sent:
        if isinstance(tool, Mapping) and isinstance(tool.get("name"), str):
            by_name.setdefault(tool["name"], tool)
    ordered = []
    for tool in tools:
        name = tool.get("name")
        client = by_name.get(name) if isinstance(name, str) else None
        if client is not None:
            tool = {**{key: tool[key] for key in client if key in tool}, **tool}
        ordered.append(tool)
    return ordered


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The chat tool for ``tool``: a function tool for a custom one, when the way back
    gives the same tool; else ``tool`` as it is."""
    if tool.get("type", "custom") != "custom":
        return dict(tool)
    custom = {key: value for key, value in tool.items() if key != "type"}
    function = {key: tool[key] for key in ("name", "description") if key in tool}
    function["parameters"] = tool.get("input_schema")
    extra = {k: v for k, v in custom.items() if k not in ("name", "description", "input_schema")}
    chat_tool = {"type": "function", "function": function, **extra}
    return chat_tool if anthropic_tool(chat_tool) == custom else dict(tool)


def _tool_choice(choice: Any) -> dict[str, Any]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` for a Messages ``tool_choice``."""
    if not isinstance(choice, Mapping):
        return {}
    out: dict[str, Any] = {}
    kind = choice.get("type")
    if kind in ("auto", "none"):
        out["tool_choice"] = kind
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out
