"""The emergency: when even the first cut leaves the request over the budget.

The tail itself is too big, so the largest tool outputs and assistant texts outside the
system prompt and the latest user message are shortened, largest first and ever shorter (a
long preview, a short one, then the ref alone), until the request fits. Tool-call
arguments have their long strings cut first and stay valid JSON. Originals are stored
first; without a store (``lossy``) this runs only when the request could not be sent at
all otherwise, and each shortened text says that no copy is kept.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.messages import Message
from pipelines.preview import trim_json
from pipelines.stage import StageContext
from pipelines.stages.compress.offload import NOT_KEPT, offload, shortened

__all__ = ["ARGUMENT_CHARS", "emergency"]

ARGUMENT_CHARS: Final = 500
"""Strings in tool-call arguments longer than this are cut in an emergency."""
_ARGUMENT_HEAD, _ARGUMENT_TAIL = 200, 50
_PENDING_REF: Final = "@@contextgate-pending-ref@@"
"""Stands for the ref in shortened arguments until the original is stored."""


async def emergency(
    conversation: Conversation, ctx: StageContext, *, keep_chars: int, lossy: bool = False
) -> Conversation:
    """``conversation`` with its largest texts shortened until it fits the budget (or
    nothing is left to shorten); the count in the report as ``emergency_shortened``, or
    ``lossy_shortened``."""
    messages = list(conversation.messages)
    budget = ctx.budget.input_tokens
    size = ctx.tokens.message
    latest_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    candidates = sorted(
        (
            i
            for i, m in enumerate(messages)
            if m.get("role") in ("tool", "assistant", "user")
            and i != latest_user
            and (isinstance(m.get("content"), str) or m.get("tool_calls"))
        ),
        key=lambda i: (-size(messages[i]), i),
    )
    shortened_at: set[int] = set()
    # Ever shorter: a long preview, a short one, then the ref alone; tool-call
    # arguments have their long strings cut first and stay valid JSON.
    total = ctx.tokens(conversation)
    for keep in (keep_chars, keep_chars // 3, 0):
        for index in candidates:
            if total <= budget:
                break
            shorter = await shortened(messages[index], ctx, keep, lossy=lossy)
            if shorter.get("tool_calls"):
                shorter = await _shrunk_arguments(shorter, ctx, lossy=lossy)
            if shorter is not messages[index]:
                total += size(shorter) - size(messages[index])
                messages[index] = shorter
                shortened_at.add(index)
    if not shortened_at:
        return conversation
    ctx.record(**{"lossy_shortened" if lossy else "emergency_shortened": len(shortened_at)})
    result = conversation.with_messages(messages)
    ctx.tokens.remember(result, total)
    return result


async def _shrunk_arguments(message: Message, ctx: StageContext, *, lossy: bool) -> Message:
    """``message`` with its tool calls' arguments made smaller and still valid JSON:
    every string over ``ARGUMENT_CHARS`` cut to its head and tail, and arguments still
    long after that (big arrays or objects of short values) cut by structure. The
    original calls are stored first; each cut string names their ref, and so does a
    note in the message's text when structure was cut."""
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        return message
    shrunk: list[Any] = []
    structural = False
    for call in calls:
        short, cut_structure = _shrunk_call_arguments(_arguments(call))
        structural = structural or cut_structure
        shrunk.append((call, short))
    if all(short is None for _, short in shrunk):
        return message
    ref = NOT_KEPT if lossy else await offload(ctx, orjson.dumps(calls))
    named = ref if lossy else f"the original call is stored as {ref}"
    out = [
        call
        if short is None
        else {
            **call,
            "function": {
                **call["function"],
                "arguments": short.replace(_PENDING_REF, named.replace('"', "'")),
            },
        }
        for call, short in shrunk
    ]
    shorter = {**message, "tool_calls": out}
    if structural and not message.get("content"):
        shorter["content"] = f"[Tool call arguments shortened to fit; {named}.]"
    return shorter


def _shrunk_call_arguments(arguments: str) -> tuple[str | None, bool]:
    """One call's ``arguments`` made smaller, naming ``_PENDING_REF`` where they were cut
    (``None`` when they are short or no smaller), and whether their structure was cut.
    Arguments that are not JSON (a custom tool's free-form input, as Codex's
    ``apply_patch`` sends) are cut as the text they are, head and tail kept."""
    if len(arguments) <= ARGUMENT_CHARS:
        return None, False
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        text = _cut_strings(arguments, _PENDING_REF)
        return (text if isinstance(text, str) and len(text) < len(arguments) else None), False
    if value is None:
        return None, False
    structural = False
    cut = _cut_strings(value, _PENDING_REF)
    if len(orjson.dumps(cut)) > 4 * ARGUMENT_CHARS:
        cut, structural = trim_json(cut, chars=4 * ARGUMENT_CHARS), True
    text = orjson.dumps(cut).decode()
    return (text if len(text) < len(arguments) else None), structural


def _arguments(call: object) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    return arguments if isinstance(arguments, str) else ""


def _cut_strings(value: object, ref: str) -> object:
    if isinstance(value, str) and len(value) > ARGUMENT_CHARS:
        cut = len(value) - _ARGUMENT_HEAD - _ARGUMENT_TAIL
        head, tail = value[:_ARGUMENT_HEAD], value[-_ARGUMENT_TAIL:]
        return f"{head}...[{cut:,} characters cut; {ref}]...{tail}"
    if isinstance(value, dict):
        return {key: _cut_strings(item, ref) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_strings(item, ref) for item in value]
    return value
