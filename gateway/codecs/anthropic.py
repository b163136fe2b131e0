"""OpenAI chat <-> Anthropic Messages, as plain data (issue 6, the codec part).

``to_messages`` turns an OpenAI chat completions request into a Messages API request;
``from_message`` turns a Messages API answer into a chat completion; ``Accumulator`` builds
that answer from the Messages stream's events, and ``ChunkTranslator`` turns the same
events into OpenAI stream chunks as they arrive. No I/O here: the provider that speaks to
Anthropic (and the inbound ``/v1/messages`` route) are built on these.

The mapping:

- system and developer messages -> ``system`` (text blocks, in order, every key of a
  text part kept), except a system turn of the history (``SYSTEM_TURN``: a
  mid-conversation ``role: "system"`` entry a Messages client sent), which stays in its
  place as that entry, content as it came; every other message keeps its place.
- user content: text parts -> text blocks (every key kept); ``image_url`` parts -> image
  blocks (a data URL becomes a base64 source, any other URL a url source); ``file`` parts
  whose ``file_data`` is a base64 data URL -> document blocks (a PDF as a base64 source,
  plain text as a text source; the ``filename`` as the ``title``); a part of a type
  OpenAI does not have (``document``, ``search_result``, ... as the inbound
  ``/v1/messages`` codec carries them) is an Anthropic block already and goes as it is;
  ``refusal`` parts (an assistant's own earlier refusal) -> text blocks. What Claude cannot
  be given (``input_audio``, a ``file`` by OpenAI Files API ``file_id`` or of another
  media type) is a 400 ``unsupported_content`` naming the part (``messages[i].content[j]``),
  never left out: the model would answer without it and the client would not know. Tool
  results and the media restored by ``context_restore`` go through the same conversion.
- assistant: ``thinking_blocks`` (``thinking`` with its signature, ``redacted_thinking``
  with its data) first, as they came (less the ``index`` of a streamed entry), then the
  content's blocks, then each tool call as a
  ``tool_use`` block whose ``input`` is the parsed arguments (a call's ``cache_control``,
  ``caller`` and ``toolset_name`` kept on it).
- tool messages -> ``tool_result`` blocks (``content`` whole, none when the message has
  none; ``is_error`` and ``toolset_name`` kept; a marker inside the content, where the API
  takes none, marks the ``tool_result``); consecutive ones, and the user message
  right after them, form one user turn (the API wants every result of an assistant turn's
  calls in the next user turn).
- a message-level ``cache_control`` (LiteLLM's convention, and the ``cache_markers``
  stage's) goes on the last block the message becomes that can carry one (not a thinking
  block): a tool message's ``tool_result``, an assistant's last ``tool_use`` if any.
- function tools -> ``name``/``description``/``input_schema`` plus the tool's other
  top-level keys (``cache_control``, ``strict``, ...); a tool of another type (an
  Anthropic server tool) goes as it is. ``tool_choice`` auto/none/required/a named
  function -> auto/none/any/tool; ``parallel_tool_calls: false`` ->
  ``disable_parallel_tool_use``.
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

Answers: text blocks joined into ``content``; ``tool_use`` -> ``tool_calls`` (arguments
as JSON; a call cut off by the token limit keeps the partial text it got); thinking
blocks -> ``thinking_blocks`` (lossless, so they can be sent back) and their text as
``reasoning_content``; stop reasons end_turn/stop_sequence/pause_turn -> stop,
max_tokens -> length, tool_use -> tool_calls, refusal -> content_filter; usage with the
cache reads and writes folded into ``prompt_tokens`` and the reads reported as
``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from gateway.errors import InvalidRequest
from pipelines.cache_break import without_markers
from pipelines.messages import SYSTEM_TURN, is_system_turn

__all__ = [
    "THINKING_BINDING_BETA",
    "Accumulator",
    "ChunkTranslator",
    "anthropic_tool",
    "from_message",
    "image_block",
    "sends_thinking",
    "to_messages",
    "unbinding",
    "with_beta",
]

STOP_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
OPENAI_PARTS: Final = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
"""The chat format's content part types; a part of another type is an Anthropic block."""
TOOL_USE_KEYS: Final = ("cache_control", "caller", "toolset_name")
"""Keys of a ``tool_use`` block that its tool call carries as they are."""
TOOL_RESULT_KEYS: Final = ("is_error", "toolset_name")
"""Keys of a ``tool_result`` block that its tool message carries as they are (its
``cache_control`` is the message-level marker)."""
_DATA_URL: Final = re.compile(
    r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?:;[\w.+-]+=[^;,]*)*;base64,(?P<data>.*)", re.S
)
"""A base64 data URL, its parameters (``charset=utf-8``, ``name=...``) skipped."""
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


THINKING_BINDING_BETA: Final = "thinking-binding-controls-2026-08-01"
"""The beta under which a request may ask the API to drop thinking blocks whose prefix
changed instead of refusing the request (``thinking.block_binding``)."""


def unbinding(thinking: Any) -> dict[str, Any] | None:
    """The ``thinking`` setting ``thinking`` (``None``: the client gave none) with thinking
    blocks whose prefix changed since the model wrote them dropped by the API rather than
    refused (``block_binding.prefix_mismatch_behavior: "drop_block"``); ``None`` to leave
    the request as it is: thinking turned off, or a ``block_binding`` of the client's own.
    Models that bind thinking to its prefix think adaptively by default, so giving the
    setting where the client gave none changes nothing else."""
    binding = {"prefix_mismatch_behavior": "drop_block"}
    if thinking is None:
        return {"type": "adaptive", "block_binding": binding}
    if not isinstance(thinking, Mapping) or thinking.get("type") not in ("adaptive", "enabled"):
        return None
    if thinking.get("block_binding") is not None:
        return None
    return {**thinking, "block_binding": binding}


def sends_thinking(chat: Mapping[str, Any]) -> bool:
    """Whether chat request ``chat`` sends thinking blocks back (an assistant message's
    ``thinking_blocks``, or thinking parts in its content)."""
    for message in chat.get("messages") or ():
        if message.get("role") != "assistant":
            continue
        if message.get("thinking_blocks"):
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(part, Mapping) and part.get("type") in ("thinking", "redacted_thinking")
            for part in content
        ):
            return True
    return False


def with_beta(headers: Mapping[str, str], beta: str) -> dict[str, str]:
    """``headers`` (lower-case names) with ``beta`` among their ``anthropic-beta`` values."""
    betas = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
    if beta not in betas:
        betas.append(beta)
    return {**headers, "anthropic-beta": ",".join(betas)}


def to_messages(body: Mapping[str, Any], *, default_max_tokens: int = 4_096) -> dict[str, Any]:
    """The Messages API request for OpenAI chat request ``body``; ``InvalidRequest`` for
    what cannot be expressed there (a tool call whose arguments are not a JSON object,
    several choices)."""
    _refuse_unsupported(body)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(body.get("messages", ())):
        role = message.get("role")
        where = f"messages[{index}].content"
        if is_system_turn(message):
            turns.append(_system_turn(message))
        elif role in ("system", "developer"):
            system.extend(_marked(_text_blocks(message.get("content")), message))
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
            }
            if message.get("content") is not None:
                block.update(_result_content(message["content"], where))
            block.update({key: message[key] for key in TOOL_RESULT_KEYS if key in message})
            _append(turns, "user", _marked([block], message))
        elif role == "assistant":
            _append(turns, "assistant", _marked(_assistant_blocks(message, where), message))
        else:
            _append(turns, "user", _marked(_blocks(message.get("content"), where), message))
    # The API refuses empty turns (an assistant answer that was empty, a user message of
    # parts it cannot carry): they are left out, their neighbours joined.
    turns = _joined([t for t in turns if t["role"] == "system" or t["content"]])
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


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add ``blocks`` as a turn of ``role``, joining the previous turn when it has the same
    role (tool results and the user message after them make one user turn)."""
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": list(blocks)})


def _system_turn(message: Mapping[str, Any]) -> dict[str, Any]:
    """A system message that is a turn of the history, as the ``role: "system"`` entry of
    ``messages`` it came as: its content as it is (a message-level marker on its last
    block), its other keys (``clear_at``, ``output_config``) kept. Never joined with a
    neighbour."""
    turn = {
        key: value
        for key, value in message.items()
        if key not in (SYSTEM_TURN, "cache_control", "name")
    }
    turn["role"] = "system"
    if "cache_control" in message:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        turn["content"] = _marked([dict(b) for b in blocks or ()], message)
    return turn


def _joined(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in turns:
        if out and out[-1]["role"] == turn["role"] and turn["role"] != "system":
            out[-1]["content"].extend(turn["content"])
        else:
            out.append(turn)
    return out


def _marked(blocks: list[dict[str, Any]], message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``blocks`` with ``message``'s message-level ``cache_control``, if any, on the last
    block that can carry one."""
    if "cache_control" in message:
        for index in range(len(blocks) - 1, -1, -1):
            if blocks[index].get("type") not in ("thinking", "redacted_thinking"):
                blocks[index] = {**blocks[index], "cache_control": message["cache_control"]}
                break
    return blocks


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [
        dict(part)
        for part in content or ()
        if isinstance(part, Mapping) and part.get("type") == "text" and part.get("text")
    ]


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """The blocks for a message's ``content`` (found at ``where``, for errors)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(content or ()):
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "image_url":
            blocks.append(image_block(part))
        elif kind == "text":
            blocks.extend(_text_blocks([part]))
        elif kind == "file":
            blocks.append(_document_block(part, where=f"{where}[{index}]"))
        elif kind == "refusal":
            refusal = part.get("refusal")
            if isinstance(refusal, str) and refusal:
                blocks.append({"type": "text", "text": refusal})
        elif kind not in OPENAI_PARTS:
            blocks.append(dict(part))
        else:
            raise _unsupported(f"{where}[{index}]", f"Claude does not take {kind} parts")
    return blocks


def image_block(part: Mapping[str, Any]) -> dict[str, Any]:
    """The image block for OpenAI ``image_url`` part ``part``."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    url = url if isinstance(url, str) else ""
    found = _DATA_URL.fullmatch(url)
    if found is not None:
        source = {"type": "base64", "media_type": found["type"], "data": found["data"]}
    else:
        source = {"type": "url", "url": url}
    block: dict[str, Any] = {"type": "image", "source": source}
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _document_block(part: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """The document block for OpenAI ``file`` part ``part`` (found at ``where``): a PDF
    data URL as a base64 source, a plain-text one as a text source. ``InvalidRequest``
    for a file Claude cannot be given so: one named by a Files API ``file_id`` (OpenAI's
    ids mean nothing to Anthropic), or of another media type."""
    file = part.get("file")
    file = file if isinstance(file, Mapping) else {}
    data = file.get("file_data")
    found = _DATA_URL.fullmatch(data) if isinstance(data, str) else None
    if found is None:
        raise _unsupported(
            where,
            "Claude takes a file as its content, a base64 data URL in file.file_data"
            " (data:application/pdf;base64,...), not by an uploaded file's file_id",
        )
    media_type = found["type"].lower()
    source: dict[str, Any]
    if media_type == "application/pdf":
        source = {"type": "base64", "media_type": media_type, "data": found["data"]}
    elif media_type == "text/plain":
        source = {"type": "text", "media_type": media_type, "data": _text_of(found["data"], where)}
    else:
        raise _unsupported(where, f"Claude reads PDF and plain-text files, not {media_type}")
    block: dict[str, Any] = {"type": "document", "source": source}
    filename = file.get("filename")
    if isinstance(filename, str) and filename:
        block["title"] = filename
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _text_of(data: str, where: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"{where}: the file's data is not base64 of UTF-8 text.",
            code="invalid_value",
            param=where,
        ) from exc


def _unsupported(where: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {why}.", code="unsupported_content", param=where)


def _result_content(content: Any, where: str) -> dict[str, Any]:
    """A ``tool_result``'s ``content``, and its ``cache_control``: the API takes none
    inside the content (``invalid_cache``), so the last marker there marks the result."""
    if isinstance(content, str):
        return {"content": content}
    blocks = _blocks(content, where)
    marker = _last_marker(blocks)
    if marker is None:
        return {"content": blocks}
    return {"content": without_markers(blocks), "cache_control": marker}


def _last_marker(value: Any) -> Any:
    """The last ``cache_control`` in ``value`` in prompt order (a block's own after those
    of the blocks nested in it), or ``None``."""
    found = None
    if isinstance(value, list):
        for item in value:
            found = _last_marker(item) or found
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key != "cache_control":
                found = _last_marker(item) or found
        found = value.get("cache_control") or found
    return found


def _assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    blocks = [
        _thinking_block(b) for b in message.get("thinking_blocks") or () if isinstance(b, Mapping)
    ]
    blocks.extend(_blocks(message.get("content"), where))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise InvalidRequest(
                f"tool call {call.get('id')} has arguments that are not a JSON object",
                param="messages",
            )
        block = {
            "type": "tool_use",
            "id": call.get("id"),
            "name": function.get("name"),
            "input": parsed,
        }
        block.update({key: call[key] for key in TOOL_USE_KEYS if key in call})
        blocks.append(block)
    return blocks


def _thinking_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """A ``thinking_blocks`` entry as the Messages API takes it back: without the
    ``index`` that streamed entries carry (``ChunkTranslator``)."""
    return {key: value for key, value in block.items() if key != "index"}


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


def from_message(message: Mapping[str, Any], *, created: int = 0) -> dict[str, Any]:
    """The chat completion for Messages API answer ``message``."""
    text: list[str] = []
    thinking: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text", ""))
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(dict(block))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": block["partial_json"]
                        if isinstance(block.get("partial_json"), str)
                        else orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        reply["tool_calls"] = calls
    if thinking:
        reply["thinking_blocks"] = thinking
        reasoning = "".join(b.get("thinking", "") for b in thinking if b["type"] == "thinking")
        if reasoning:
            reply["reasoning_content"] = reasoning
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": STOP_REASONS.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": usage_of(message.get("usage") or {}),
    }


def usage_of(usage: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI usage for Anthropic ``usage``: cache reads and writes are input tokens too."""
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + written
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": read},
    }


class Accumulator:
    """The Messages API answer built from its stream's events, in order (``add`` each
    event's data); ``message`` is the answer so far. An ``error`` event is kept as
    ``error``."""

    __slots__ = ("_json", "error", "message")

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None
        self._json: dict[int, str] = {}

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = dict(event.get("message") or {})
            self.message["content"] = list(self.message.get("content") or [])
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            if block.get("type") == "tool_use":
                self._json[int(event.get("index", 0))] = ""
            self._blocks().append(block)
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            index = int(event.get("index", 0))
            partial = self._json.get(index)
            if partial is not None:
                try:
                    self._blocks()[index]["input"] = orjson.loads(partial) if partial else {}
                except orjson.JSONDecodeError:
                    return  # left to ``finish``, which keeps the partial text
                del self._json[index]
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self.message.update({k: v for k, v in delta.items() if v is not None})
            usage = dict(self.message.get("usage") or {})
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            self.message["usage"] = usage
        elif kind == "message_stop":
            self.finish()
        elif kind == "error":
            self.error = dict(event.get("error") or {})

    def finish(self) -> None:
        """End the blocks the stream left open: a tool call whose input was cut off (the
        answer ran out of tokens) keeps the text it got as ``partial_json``."""
        for index, partial in sorted(self._json.items()):
            block = self._blocks()[index]
            try:
                block["input"] = orjson.loads(partial) if partial else {}
            except orjson.JSONDecodeError:
                block["input"] = {}
                block["partial_json"] = partial
        self._json.clear()

    def _blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = self.message.setdefault("content", [])
        return blocks

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self._blocks()[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta.get("partial_json", "")


class ChunkTranslator:
    """Messages stream events -> OpenAI ``chat.completion.chunk`` objects, as they arrive.

    ``add(event)`` returns the chunks an event makes (often none); text, reasoning and
    tool-call argument deltas pass through at once, tool calls numbered in the order they
    start; each thinking block, once complete, comes as a ``thinking_blocks`` entry
    numbered (``index``) as tool calls are, so that the OpenAI SDK can add them up.
    ``message_delta`` gives the chunk with the finish reason and, when ``include_usage``,
    a last chunk with the usage and no choices. An ``error`` event gives
    ``{"error": ...}``, which the caller sends as the terminal event."""

    __slots__ = (
        "_arguments",
        "_calls",
        "_thinking",
        "_thoughts",
        "created",
        "id",
        "include_usage",
        "model",
        "usage",
    )

    def __init__(self, *, created: int = 0, include_usage: bool = False) -> None:
        self.created, self.include_usage = created, include_usage
        self.id, self.model = "", ""
        self.usage: dict[str, Any] = {}
        self._calls: dict[int, int] = {}
        """Block index -> tool call index."""
        self._thinking: dict[int, dict[str, Any]] = {}
        self._thoughts = 0
        """Thinking blocks sent so far: the ``index`` of the next one."""
        self._arguments: set[int] = set()
        """Tool-call blocks that streamed some arguments."""

    def add(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.id, self.model = str(message.get("id", "")), str(message.get("model", ""))
            self.usage = dict(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            return self._start(int(event.get("index", 0)), event.get("content_block") or {})
        if kind == "content_block_delta":
            return self._delta(int(event.get("index", 0)), event.get("delta") or {})
        if kind == "content_block_stop":
            index = int(event.get("index", 0))
            if index in self._calls and index not in self._arguments:
                # A call without arguments streams none; "{}" keeps it parseable.
                call = {"index": self._calls[index], "function": {"arguments": "{}"}}
                return [self._chunk({"tool_calls": [call]})]
            block = self._thinking.pop(index, None)
            if block is None:
                return []
            # Numbered as tool calls are, for the OpenAI SDK's accumulator, which cannot
            # add up list entries without an index.
            entry = {"index": self._thoughts, **block}
            self._thoughts += 1
            return [self._chunk({"thinking_blocks": [entry]})]
        if kind == "message_delta":
            self.usage.update(
                {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            )
            reason = (event.get("delta") or {}).get("stop_reason")
            chunks = [self._chunk({}, STOP_REASONS.get(str(reason), "stop"))]
            if self.include_usage:
                chunks.append({**self._chunk({}), "choices": [], "usage": usage_of(self.usage)})
            return chunks
        if kind == "error":
            return [{"error": dict(event.get("error") or {})}]
        return []

    def _start(self, index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = block.get("type")
        if kind == "tool_use":
            number = self._calls[index] = len(self._calls)
            call = {
                "index": number,
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if kind in ("thinking", "redacted_thinking"):
            self._thinking[index] = dict(block)
        if kind == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = delta.get("type")
        if kind == "text_delta":
            return [self._chunk({"content": delta.get("text", "")})]
        if kind == "thinking_delta":
            block = self._thinking.setdefault(index, {"type": "thinking", "thinking": ""})
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            return [self._chunk({"reasoning_content": delta.get("thinking", "")})]
        if kind == "signature_delta":
            block = self._thinking.setdefault(index, {"type": "thinking", "thinking": ""})
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
            return []
        if kind == "input_json_delta" and index in self._calls:
            if not delta.get("partial_json"):
                return []
            self._arguments.add(index)
            call = {
                "index": self._calls[index],
                "function": {"arguments": delta.get("partial_json", "")},
            }
            return [self._chunk({"tool_calls": [call]})]
        return []

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
