"""An OpenAI chat completions request -> an Anthropic Messages API request
(``to_messages``), for a chat client's request to Claude and, with its own fields laid
over it, a Messages client's (``messages.to_request``). No I/O. What each content part
and assistant message becomes, and where a message's cache marker lands, is
``chat_anthropic.blocks``'s.

The mapping:

- system and developer messages -> ``system`` (text blocks, in order, every key of a
  text part kept), except a system turn of the history (``SYSTEM_TURN``: a
  mid-conversation ``role: "system"`` entry a Messages client sent), which stays in its
  place as that entry, content as it came; every other message keeps its place.
- user and assistant messages -> turns of their role, their content as blocks
  (``chat_anthropic.blocks``).
- tool messages -> ``tool_result`` blocks (``content`` whole, none when the message has
  none; ``is_error`` and ``toolset_name`` kept; a marker inside the content, where the API
  takes none, marks the ``tool_result``); consecutive ones, and the user message
  right after them, form one user turn (the API wants every result of an assistant turn's
  calls in the next user turn).
- function tools -> ``name``/``description``/``input_schema`` plus the tool's other
  top-level keys (``cache_control``, ``strict``, ...); a tool of another type (an
  Anthropic server tool) goes as it is. ``tool_choice`` auto/none/required/a named
  function -> auto/none/any/tool; ``parallel_tool_calls: false`` ->
  ``disable_parallel_tool_use``.
- ``thinking`` as the client sent it (as LiteLLM's clients do), else
  ``reasoning_effort`` as a thinking budget (``THINKING_BUDGETS``); ``max_tokens`` is
  raised by the budget when it does not exceed it (the API wants room for the answer).
- ``max_completion_tokens`` or ``max_tokens`` -> ``max_tokens`` (required by the API: the
  given default when absent); ``stop`` -> ``stop_sequences``; ``temperature``, ``top_p``,
  ``stream``, and ``top_k`` (Claude's own sampling field, which clients send through
  OpenAI-compatible gateways) when it is an integer; ``user``, ``safety_identifier`` or
  ``metadata.user_id`` -> ``metadata.user_id`` (Anthropic's end-user id for abuse
  detection); ``service_tier`` auto/priority/fast -> ``auto`` (priority capacity when the
  account has it), default -> ``standard_only``.
- ``response_format``: ``text`` is the default; ``json_schema`` -> ``output_config.format``
  (Claude's structured output, ``{"type": "json_schema", "schema": ...}``; the schema's
  ``name`` and ``strict`` have no place there and output is always held to the schema);
  ``json_object`` (JSON without a schema, which Claude's structured output cannot express)
  or any other type is a 400 ``unsupported_parameter``.
- refused with a 400 ``unsupported_parameter`` naming the field, since the client relies
  on what it asks for and would not get it: ``n`` over 1, the legacy ``functions`` and
  ``function_call`` (send ``tools``), audio output (``audio``, ``modalities`` beyond
  text) and ``web_search_options`` (give Claude Anthropic's web search tool in ``tools``).
- dropped, having no Anthropic equivalent and only tuning sampling or OpenAI's platform:
  the sampling nudges ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``seed``;
  ``logprobs``/``top_logprobs`` (the answer's ``logprobs`` is null, which shows it);
  ``verbosity``; OpenAI platform settings ``store``, ``prediction``, ``moderation``,
  ``prompt_cache_key``, ``prompt_cache_options``, ``prompt_cache_retention`` (the
  ``cache_markers`` stage places Claude's cache breakpoints instead); ``service_tier``
  flex/scale; ``stream_options`` (read by the provider for the usage chunk).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.codecs.chat_anthropic.blocks import turns_of
from gateway.errors import InvalidRequest

__all__ = ["anthropic_tool", "to_messages"]

THINKING_BUDGETS: Final = {"minimal": 1_024, "low": 1_024, "medium": 2_048, "high": 4_096}
"""OpenAI's ``reasoning_effort`` as Claude's thinking budget (LiteLLM's mapping, so that
clients moving from it get what they had)."""

SERVICE_TIERS: Final = {
    "auto": "auto",
    "priority": "auto",
    "fast": "auto",
    "default": "standard_only",
}
"""OpenAI's ``service_tier`` as Anthropic's (``auto`` uses priority capacity when the
account has it); flex and scale have no equivalent."""

REFUSED_FIELDS: Final = {
    "functions": "the legacy functions field is not supported here; send tools instead",
    "function_call": "the legacy function_call field is not supported here; send tool_choice",
    "audio": "Claude does not answer with audio",
    "web_search_options": (
        "web_search_options is OpenAI's; give Claude Anthropic's web search server tool"
        ' in tools (e.g. {"type": "web_search_20250305", "name": "web_search"})'
    ),
}
"""Request fields a client relies on that Claude cannot honour: a 400, not a silent drop."""


def to_messages(
    body: Mapping[str, Any],
    *,
    default_max_tokens: int = 4_096,
    thinking: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Messages API request for OpenAI chat request ``body``; ``InvalidRequest`` for
    what cannot be expressed there (a tool call whose arguments are not a JSON object,
    several choices). ``thinking``, when given, stands for the body's ``thinking`` (a
    binding the chat route asks for: ``unbinding``)."""
    if thinking is not None:
        body = {**body, "thinking": thinking}
    _refuse_unsupported(body)
    system, turns = turns_of(body.get("messages", ()))
    request: dict[str, Any] = {
        "model": body.get("model"),
        "max_tokens": body.get("max_completion_tokens")
        or body.get("max_tokens")
        or default_max_tokens,
        "messages": [
            t if t["role"] == "system" else {"role": t["role"], "content": t["content"]}
            for t in turns
        ],
    }
    if system:
        request["system"] = system
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            request[name] = body[name]
    if body.get("cache_control"):  # automatic caching (``cache_markers`` counts it)
        request["cache_control"] = body["cache_control"]
    top_k = body.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool):
        request["top_k"] = top_k
    tier = SERVICE_TIERS.get(str(body.get("service_tier")))
    if tier is not None:
        request["service_tier"] = tier
    output_format = _output_format(body.get("response_format"))
    if output_format is not None:
        request["output_config"] = {"format": output_format}
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = body.get("tools")
    if tools:
        request["tools"] = [anthropic_tool(t) for t in tools]
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        request["tool_choice"] = choice
    user = (
        body.get("user")
        or body.get("safety_identifier")
        or (body.get("metadata") or {}).get("user_id")
    )
    if isinstance(user, str) and user:
        request["metadata"] = {"user_id": user}
    thinking = _thinking(body)
    if thinking is not None:
        request["thinking"] = thinking
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and request["max_tokens"] <= budget:
            # The API wants room for the answer beyond the thinking budget.
            request["max_tokens"] += budget
    return request


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    """``InvalidRequest`` when ``body`` asks for what Claude cannot do and the client
    would rely on: several choices, legacy functions, audio output, OpenAI's web search."""
    choices = body.get("n")
    if isinstance(choices, int) and not isinstance(choices, bool) and choices > 1:
        raise InvalidRequest(
            f"n={choices}: Claude answers with one choice; ask n times for more.",
            code="unsupported_parameter",
            param="n",
        )
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) is not None:
            raise InvalidRequest(f"{name}: {why}.", code="unsupported_parameter", param=name)
    modalities = body.get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise InvalidRequest(
            f"modalities={modalities}: Claude answers with text only.",
            code="unsupported_parameter",
            param="modalities",
        )


def _output_format(response_format: Any) -> dict[str, Any] | None:
    """Claude's ``output_config.format`` for OpenAI ``response_format``; ``None`` for
    plain text, ``InvalidRequest`` for a format Claude's structured output cannot give."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise InvalidRequest(
                "response_format.json_schema.schema: Claude's structured output needs the"
                " JSON Schema of the answer.",
                code="unsupported_parameter",
                param="response_format.json_schema.schema",
            )
        return {"type": "json_schema", "schema": dict(schema)}
    raise InvalidRequest(
        f"response_format {kind!r}: Claude's structured output needs a JSON Schema; send"
        ' {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}.',
        code="unsupported_parameter",
        param="response_format",
    )


def _thinking(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Claude's ``thinking`` for an OpenAI request: its own ``thinking`` field when it sends
    one (as LiteLLM's clients do), else its ``reasoning_effort``."""
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping):
        return dict(thinking)
    budget = THINKING_BUDGETS.get(str(body.get("reasoning_effort")))
    return {"type": "enabled", "budget_tokens": budget} if budget is not None else None


def anthropic_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API tool for chat tool ``tool``: a function tool's ``name``,
    ``description`` and ``input_schema`` with its other top-level keys; any other tool
    as it is."""
    if tool.get("type", "function" if "function" in tool else None) != "function":
        return dict(tool)
    function = tool.get("function") or {}
    out: dict[str, Any] = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description") is not None:
        out["description"] = function["description"]
    out.update({key: value for key, value in tool.items() if key not in ("type", "function")})
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None and parallel is not False:
        return None
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        out: dict[str, Any] = {"type": "any"}
    elif isinstance(choice, Mapping):
        out = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    else:
        out = {"type": "auto"}
    if parallel is False:
        out["disable_parallel_tool_use"] = True
    return out
