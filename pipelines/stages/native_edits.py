"""Stage 1: the client's native context edits, applied by the gateway where the upstream
cannot apply them (``pipelines.native``, a ``polyfill`` plan).

- ``clear_tool_uses_20250919``: over its trigger (the request's input tokens, or its tool
  uses), the result of every tool use but the latest ``keep`` is cleared, oldest first,
  the uses of ``exclude_tools`` left alone, as the API does; with ``clear_tool_inputs``,
  the cleared uses' arguments too. Unlike the API, what is cleared is written to the
  offload store first and the placeholder names its ref, so the model (``context_restore``)
  or the client can have it back; a result the store did not take stays as it is. With
  ``clear_at_least``, nothing is cleared unless that many tokens would be.
- ``clear_thinking_20251015``: the thinking (blocks and ``reasoning_content``) of every
  assistant turn but the latest ``keep`` thinking turns is dropped (without ``keep``, the
  model's default: all kept on a model that keeps earlier thinking, the latest turn's on
  another).

Each edit applied is recorded in the API's ``applied_edits`` shape (``applied_edits`` in
the stage's details), which the gateway puts in its answer. The clearing depends only on
the request, so the same history is cleared the same way on every request (refs are
content-addressed): the outgoing prefix moves only when the trigger or ``keep`` moves it.
``compact_20260112`` is the host's (``gateway.context.native_request``): it needs the
answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from pipelines.conversation import Conversation
from pipelines.lru import Lru, text_bytes
from pipelines.messages import Message, original_bytes
from pipelines.native import CLEAR_THINKING, CLEAR_TOOL_USES, ClearThinking, ClearToolUses
from pipelines.preview import text_digest
from pipelines.stage import REF_PATTERN, StageContext

__all__ = ["NativeEdits", "cleared_placeholder"]

_REFS_KEPT: Final = 4_096
_REFS_BYTES: Final = 512 * 1024
_SAMPLE_REF: Final = "ctx_FNHy43GQUKimepCWtDjuhAj3"
"""A ref as long as real ones, to count a placeholder before its content is stored."""
_SAMPLE_INPUT: Final = '{"cleared_to_save_context":"ctx_FNHy43GQUKimepCWtDjuhAj3"}'
_THINKING_PARTS: Final = frozenset({"thinking", "redacted_thinking"})
_THINKING_KEYS: Final = ("thinking_blocks", "reasoning_content")


def cleared_placeholder(name: str, size: int, ref: str) -> str:
    """What a cleared tool result becomes: what it was and the ref that restores it."""
    return (
        f"[Tool result of {name} cleared to save context ({size:,} characters), stored as"
        f" {ref}. Restore it if it is needed again; do not guess its content.]"
    )


@dataclass(frozen=True, slots=True)
class NativeEdits:
    name: str = "native_edits"
    _refs: Lru[tuple[str, bytes], str] = field(
        default_factory=lambda: Lru(entries=_REFS_KEPT, max_bytes=_REFS_BYTES),
        repr=False,
        compare=False,
    )
    """Refs of contents stored on earlier requests: the same results are cleared again on
    every request, and a ref still in the store is only renewed."""

    async def __call__(self, conversation: Conversation, ctx: StageContext) -> Conversation:
        plan = ctx.native
        if plan is None or not plan.polyfilled:
            return conversation
        messages = list(conversation.messages)
        applied: list[dict[str, Any]] = []
        ctx.record(input_tokens=_input_tokens(conversation, ctx))
        if plan.edits.clear_thinking is not None:
            applied += _clear_thinking(messages, plan.edits.clear_thinking, ctx)
        if plan.edits.clear_tool_uses is not None:
            before = conversation.with_messages(messages)
            applied += await self._clear_tool_uses(
                messages, plan.edits.clear_tool_uses, before, ctx
            )
        ctx.record(applied_edits=applied)
        if not applied:
            return conversation
        return conversation.with_messages(messages)

    async def _clear_tool_uses(
        self,
        messages: list[Message],
        edit: ClearToolUses,
        conversation: Conversation,
        ctx: StageContext,
    ) -> list[dict[str, Any]]:
        uses = _tool_uses(messages)
        client_tokens = _input_tokens(conversation, ctx)
        over = (len(uses) if edit.trigger_kind == "tool_uses" else client_tokens) > edit.trigger
        if not over:
            return []
        older = uses[: max(0, len(uses) - edit.keep)]
        chosen = [
            (index, call, at)
            for index, call, at in older
            if _tool_name(call) not in edit.exclude_tools
            and not (at is not None and _is_placeholder(messages[at]))
        ]
        saving = sum(
            _saving(messages[at], _tool_name(call), ctx) for _, call, at in chosen if at is not None
        )
        if not chosen or saving < edit.clear_at_least:
            return []
        cleared = tokens = 0
        for index, call, result_at in chosen:
            name = _tool_name(call)
            if result_at is None:
                continue
            result = messages[result_at]
            received = ctx.as_received(result)
            ref = await self._stored(ctx, original_bytes(received))
            if ref is None:
                continue
            new = {**result, "content": cleared_placeholder(name, _characters(received), ref)}
            tokens += ctx.tokens.message(result) - ctx.tokens.message(new)
            messages[result_at] = new
            cleared += 1
            if edit.clears_input(name):
                tokens += await self._clear_input(messages, index, call, ctx)
        if not cleared:
            return []
        # A result shorter than its placeholder grows when cleared (the API's placeholder
        # is shorter): cleared all the same, as the API would, and counted as no saving.
        edit_report = {"type": CLEAR_TOOL_USES, "cleared_tool_uses": cleared}
        return [{**edit_report, "cleared_input_tokens": max(0, tokens)}]

    async def _clear_input(
        self, messages: list[Message], index: int, call: dict[str, Any], ctx: StageContext
    ) -> int:
        """Clear ``call``'s arguments in the assistant message at ``index`` (offloaded
        first); the tokens it saved."""
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str) or len(arguments) <= len(_SAMPLE_INPUT):
            return 0  # as short as its placeholder: nothing to save
        ref = await self._stored(ctx, arguments.encode())
        if ref is None:
            return 0
        message = messages[index]
        placeholder = orjson.dumps({"cleared_to_save_context": ref}).decode()
        calls = [
            {**c, "function": {**function, "arguments": placeholder}} if c is call else c
            for c in message["tool_calls"]
        ]
        new = {**message, "tool_calls": calls}
        saved = ctx.tokens.message(message) - ctx.tokens.message(new)
        messages[index] = new
        return saved

    async def _stored(self, ctx: StageContext, content: bytes) -> str | None:
        if ctx.store is None:
            ctx.details["skipped"] = "no store"
            return None
        key = (ctx.namespace, text_digest(content.decode(errors="replace")))
        ref = self._refs.get(key)
        if ref is not None and await ctx.confirmed(ref):
            return ref
        ref = await ctx.offload(content)
        if ref is None:
            return None
        self._refs.put(key, ref, text_bytes(ref) + text_bytes(key[0]) + len(key[1]))
        return ref


def _clear_thinking(
    messages: list[Message], edit: ClearThinking, ctx: StageContext
) -> list[dict[str, Any]]:
    if edit.keep is None or (not edit.given and ctx.model.keeps_thinking):
        return []  # all kept: asked, or the model's default
    turns = [i for i, m in enumerate(messages) if _thinks(m)]
    older = turns[: max(0, len(turns) - edit.keep)]
    tokens = 0
    for index in older:
        message = messages[index]
        new = {
            k: v for k, v in message.items() if k not in ("thinking_blocks", "reasoning_content")
        }
        content = new.get("content")
        if isinstance(content, list):
            kept = [
                p for p in content if not (isinstance(p, dict) and p.get("type") in _THINKING_PARTS)
            ]
            new["content"] = kept or None
        tokens += ctx.tokens.message(message) - ctx.tokens.message(new)
        messages[index] = new
    if not older:
        return []
    return [
        {
            "type": CLEAR_THINKING,
            "cleared_thinking_turns": len(older),
            "cleared_input_tokens": tokens,
        }
    ]


def _is_placeholder(message: Message) -> bool:
    """Whether a tool result is a placeholder the gateway wrote on an earlier request (one
    a checkpoint of its compaction holds): cleared already, its original behind the ref
    it names."""
    content = message.get("content")
    return (
        isinstance(content, str)
        and content.startswith("[Tool result of ")
        and "cleared to save context" in content
        and REF_PATTERN.search(content) is not None
    )


def _tool_uses(messages: list[Message]) -> list[tuple[int, dict[str, Any], int | None]]:
    """Every tool use, in order: its assistant message's index, the call, and the index of
    its result (the tool message answering its id right after that assistant message; an
    id used again later is another use with its own result)."""
    uses: list[tuple[int, dict[str, Any], int | None]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        answers: dict[Any, int] = {}
        after = index + 1
        while after < len(messages) and messages[after].get("role") == "tool":
            answers.setdefault(messages[after].get("tool_call_id"), after)
            after += 1
        uses.extend(
            (index, call, answers.pop(call.get("id"), None))
            for call in message["tool_calls"]
            if isinstance(call, dict)
        )
    return uses


def _input_tokens(conversation: Conversation, ctx: StageContext) -> int:
    """The request's input tokens as the client sent it, which its input-tokens triggers
    are compared with: without the tools the host added (``NativePlan.host_tools``: the
    gateway's restore tool)."""
    total = ctx.tokens(conversation)
    plan, tools = ctx.native, conversation.tools
    if plan is None or not plan.host_tools or not tools:
        return total
    own = [t for t in tools if _tool_name(t) not in plan.host_tools]
    if len(own) == len(tools):
        return total
    return total - ctx.counter.count_tools(tools) + ctx.counter.count_tools(own)


def _saving(result: Message, name: str, ctx: StageContext) -> int:
    """The tokens clearing ``result`` would save (its placeholder counted with a ref as
    long as a real one)."""
    placeholder = cleared_placeholder(name, _characters(result), _SAMPLE_REF)
    return ctx.tokens.message(result) - ctx.tokens.message({**result, "content": placeholder})


def _characters(message: Message) -> int:
    """The size of a message's content as offloaded, in characters."""
    return len(original_bytes(message).decode(errors="replace"))


def _thinks(message: Message) -> bool:
    if message.get("role") != "assistant":
        return False
    if message.get("thinking_blocks") or message.get("reasoning_content"):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(map(_is_thinking, content))


def _is_thinking(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in _THINKING_PARTS


def _tool_name(call: dict[str, Any]) -> str:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""
