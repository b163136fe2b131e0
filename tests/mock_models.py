"""Scripted models behind the mock upstream, for agents run end to end (Claude Code,
Codex CLI).

``ClaudeModel`` answers the Messages API (``/v1/messages``, ``count_tokens``),
``ChatModel`` the chat completions API and ``ResponsesModel`` the Responses API (over HTTP
and its WebSocket, with Codex's shell tool), each as a handler of ``MockUpstream``. They
act on the latest user text: every line ``RUN: <command>`` in it is one call of the shell
tool (``Bash``; Codex's ``exec_command``), made in order, one per answer, until each has
its result; then the model answers with text that names the last result's size. Each
checks every request as its API does and answers a refused one with the API's 400,
recording why in ``refusals``:

- Messages: at most 4 ``cache_control`` breakpoints, no 1-hour breakpoint after a
  5-minute one, every ``tool_use`` answered by a ``tool_result`` at the
  head of the next user turn and every ``tool_result`` answering one, no empty text
  block, a thinking block given back as it was signed, and (with thinking on) an
  assistant turn still in its tool loop starting with its thinking block. For a model
  that binds thinking to its prefix (``BOUND``: Claude Opus 5.5 and its kin), a thinking
  block sent back after anything before it changed (tools, system, earlier messages,
  markers aside) is refused, or dropped with every later one when the request asks for
  that (``thinking.block_binding`` under its beta), as the API does;
- chat: every tool call answered by a tool message right after its assistant message,
  and no tool message without its call;
- Responses: see ``ResponsesModel``.

``ClaudeModel`` bills each request on a model of Anthropic's prompt cache
(``bench.prompt_cache.PrefixCache``, which refuses more than 4 breakpoints or a 1-hour one
after a 5-minute one, as the API does); its answers' usage reports it, and ``prompts``
holds each accepted request's prefix digests in cache order (tools, system, messages;
markers are not content), for a test to tell whether a request extends the one before.

``ClaudeModel`` plays Anthropic's server-side context management (beta) too, with
``tests.anthropic_edits``: a request's ``context_management.edits`` are refused without
their ``anthropic-beta``, else applied before the model reads the request (and before it
is billed and counted); the answer reports them (``context_management.applied_edits``, in
the streamed ``message_delta``) and begins with a ``compaction`` block when a compact edit
is due, its summary holding the latest request and how many of its commands were run, so
that the conversation goes on from it once the client sends it back.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from bench.prompt_cache import PrefixCache
from pipelines import TokenCounter
from tests.anthropic_edits import (
    Applied,
    Count,
    EditError,
    apply_edits,
    edits_of,
    json_tokens,
    missing_beta,
)
from tests.mock_upstream import (
    JSONReply,
    Received,
    Reply,
    ResponsesRoutes,
    SSEReply,
    WSReply,
    events_of,
    function_call_item,
    message_item,
    reasoning_item,
    response_body,
    response_events,
    response_usage,
    sse_of_events,
)

__all__ = ["ChatModel", "ClaudeModel", "ResponsesModel", "message_events"]

RUN: Final = re.compile(r"^RUN: (.+)$", re.M)
NOT_A_REQUEST: Final = re.compile(r"not a new request", re.I)
"""What a note the gateway puts in place of removed messages says of itself."""
REMOVED_CALLS: Final = re.compile(r"\b([\w.-]+) x(\d+)\b")
"""A tool and how many of its calls such a note stands for (``exec_command x2``)."""
BOUND: Final = ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5", "claude-fable-5-1")
"""Models whose thinking blocks are bound to the prompt before them."""
BINDING_BETA: Final = "thinking-binding-controls-2026-08-01"
SUMMARY_HEAD: Final = "Summary of the conversation before this point"
COMPACTED: Final = re.compile(rf"^(?:{SUMMARY_HEAD} .*|Commands already run: (\d+)\.)\n?", re.M)
"""The lines a compaction summary adds to the request it holds: its head, and how many of
the request's commands were run before it."""


def message_events(message: Mapping[str, Any]) -> list[bytes]:
    """A whole Messages answer as the stream Anthropic would send for it."""

    def event(data: dict[str, Any]) -> bytes:
        return f"event: {data['type']}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

    def delta(index: int, body: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": index, "delta": body})

    usage = message["usage"]
    opening = {name: value for name, value in usage.items() if name != "iterations"}
    start = {name: value for name, value in message.items() if name != "context_management"}
    start |= {"content": [], "stop_reason": None, "usage": {**opening, "output_tokens": 1}}
    out = [event({"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "thinking":
            empty: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            out.append(
                event({"type": "content_block_start", "index": index, "content_block": empty})
            )
            if block["thinking"]:
                out.append(delta(index, {"type": "thinking_delta", "thinking": block["thinking"]}))
            out.append(delta(index, {"type": "signature_delta", "signature": block["signature"]}))
        elif block["type"] == "compaction":
            empty = {"type": "compaction", "content": None, "encrypted_content": None}
            out.append(
                event({"type": "content_block_start", "index": index, "content_block": empty})
            )
            summary = {key: block.get(key) for key in ("content", "encrypted_content")}
            out.append(delta(index, {"type": "compaction_delta", **summary}))
        elif block["type"] == "text":
            empty = {"type": "text", "text": ""}
            out.append(
                event({"type": "content_block_start", "index": index, "content_block": empty})
            )
            out.append(delta(index, {"type": "text_delta", "text": block["text"]}))
        else:
            empty = {**block, "input": {}}
            out.append(
                event({"type": "content_block_start", "index": index, "content_block": empty})
            )
            arguments = orjson.dumps(block["input"]).decode()
            out.append(delta(index, {"type": "input_json_delta", "partial_json": arguments}))
        out.append(event({"type": "content_block_stop", "index": index}))
    end = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    closing: dict[str, Any] = {"output_tokens": usage["output_tokens"]}
    if "iterations" in usage:
        closing["iterations"] = usage["iterations"]
    final: dict[str, Any] = {"type": "message_delta", "delta": end, "usage": closing}
    if "context_management" in message:
        final["context_management"] = message["context_management"]
    out.append(event(final))
    out.append(event({"type": "message_stop"}))
    return out


def _tokens(value: Any) -> int:
    """A rough token count: a quarter of the JSON's length."""
    return len(orjson.dumps(value)) // 4 + 1


def _latest_user_text(turns: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
    """The text of the last user turn that carries text, and how many tool results
    came after it (the commands already run for it)."""
    results = 0
    for turn in reversed(turns):
        if turn.get("role") != "user":
            continue
        content = turn.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        results += sum(1 for b in blocks if b.get("type") == "tool_result")
        text = "\n".join(
            b.get("text", "")
            for b in blocks
            if b.get("type") == "text" and not b.get("text", "").startswith("<system-reminder>")
        )
        if RUN.search(text) or (
            text.strip() and not any(b.get("type") == "tool_result" for b in blocks)
        ):
            return text, results
    return "", results


def _last_result_size(turns: Sequence[Mapping[str, Any]]) -> int:
    for turn in reversed(turns):
        content = turn.get("content")
        if isinstance(content, list):
            for block in reversed(content):
                if block.get("type") == "tool_result":
                    return len(orjson.dumps(block.get("content")))
    return 0


class ClaudeModel:
    """A Claude behind ``/v1/messages``: checks, a prompt cache, server-side context
    management and scripted answers. ``count`` counts tokens for the edits' triggers and
    what they clear (``tests.anthropic_edits``)."""

    def __init__(self, *, clock: Any = time.monotonic, count: Count = json_tokens) -> None:
        self.count = count
        self.refusals: list[str] = []
        self.requests: list[dict[str, Any]] = []
        """Every Messages request body accepted, in order, as sent."""
        self.edited: list[list[dict[str, Any]]] = []
        """Each accepted request's messages as the model read them: after the drop before
        a compaction block and the context management edits."""
        self.applied: list[list[dict[str, Any]]] = []
        """Each accepted request's applied edits (``[]`` when it asked for none, or none
        cleared anything)."""
        self.compacted: list[bool] = []
        """Whether each accepted request's answer began with a compaction block."""
        self.prompts: list[list[bytes]] = []
        """Each accepted request's prefix digests, one per block in cache order."""
        self.usages: list[dict[str, int]] = []
        self.dropped: list[int] = []
        """Thinking blocks each accepted request had dropped (their prefix changed)."""
        self.cache = PrefixCache(TokenCounter("o200k_base"))
        self._clock = clock
        self._signed: dict[str, bytes] = {}
        """Signature -> the prefix digest its thinking block was written after."""
        self._ids = itertools.count(1)

    def __call__(self, received: Received) -> Reply | None:
        path = received.path.split("?")[0]
        if path == "/v1/messages/count_tokens":
            return self._count_tokens(received)
        if path != "/v1/messages":
            return None
        body = received.json()
        positions = self.cache.positions(body)
        problem = self._refused(body) or self._unbound(body, positions, received.headers)
        applied = None
        if problem is None:
            applied, problem = self._edits(body, received)
        edited = body if applied is None else {**body, "messages": applied.messages}
        usage = None
        if problem is None:
            try:
                usage = self.cache.usage(edited, self._clock())
            except ValueError as exc:  # too many breakpoints, or out of TTL order
                problem = str(exc)
        if problem is not None or usage is None:
            return self._refusal(str(problem))
        self.requests.append(body)
        read = positions if applied is None else self.cache.positions(edited)
        self.prompts.append([p.prefix for p in read])
        self.usages.append(usage)
        self.edited.append(list(edited.get("messages") or ()))
        self.applied.append([] if applied is None else applied.applied_edits)
        self.compacted.append(applied is not None and applied.compaction_due)
        prefix = positions[-1].prefix if positions else b""
        answer = self._answer(edited, usage, prefix, applied, sent=body)
        if body.get("stream"):
            return SSEReply(message_events(answer), headers={"content-type": "text/event-stream"})
        return JSONReply(answer)

    def extends(self, later: int, earlier: int) -> bool:
        """Whether accepted request ``later``'s prompt starts with all of ``earlier``'s."""
        before, after = self.prompts[earlier], self.prompts[later]
        return len(after) >= len(before) and after[len(before) - 1] == before[-1]

    # -- the API's checks ------------------------------------------------------------------

    def _refusal(self, problem: str) -> JSONReply:
        """The API's 400 for a refused request, recorded in ``refusals``."""
        self.refusals.append(problem)
        error = {"type": "error", "error": {"type": "invalid_request_error", "message": problem}}
        return JSONReply(error, status=400)

    def _count_tokens(self, received: Received) -> Reply:
        """``count_tokens``: the prompt's tokens, after its context management (then with
        the count before it, as the API reports it)."""
        body = received.json()
        applied, problem = self._edits(body, received)
        if problem is not None:
            return self._refusal(problem)
        edited = body if applied is None else {**body, "messages": applied.messages}
        answer: dict[str, Any] = {
            "input_tokens": sum(p.tokens for p in self.cache.positions(edited))
        }
        if applied is not None and body.get("context_management") is not None:
            original = sum(p.tokens for p in self.cache.positions(body))
            answer["context_management"] = {"original_input_tokens": original}
        return JSONReply(answer)

    def _edits(
        self, body: Mapping[str, Any], received: Received
    ) -> tuple[Applied | None, str | None]:
        """The request's context management applied (``None`` when it asks for none and
        sends back no compaction block), or why the API refuses it: an edit it does not
        know, or one without its beta in ``anthropic-beta``."""
        try:
            edits = edits_of(body)
            if edits is not None:
                problem = missing_beta(edits, _betas(received))
                if problem is not None:
                    return None, problem
            elif not any(
                block.get("type") == "compaction"
                for turn in body.get("messages") or ()
                for block in _content(turn)
            ):
                return None, None
            return apply_edits(body, self.count), None
        except EditError as exc:
            return None, str(exc)

    def _refused(self, body: Mapping[str, Any]) -> str | None:
        turns = body.get("messages") or []
        thinking_on = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
        chat_turns = [t for t in turns if t.get("role") != "system"]
        for index, turn in enumerate(turns):
            content = turn.get("content")
            if turn.get("role") not in ("user", "assistant", "system"):
                return f"messages.{index}.role: unexpected {turn.get('role')!r}"
            if not isinstance(content, list):
                if content == "" and turn.get("role") != "system":
                    return f"messages.{index}: content must be non-empty"
                continue
            if not content and turn.get("role") != "system":
                return f"messages.{index}: content must be non-empty"
            for number, block in enumerate(content):
                where = f"messages.{index}.content.{number}"
                if block.get("type") == "text" and not block.get("text"):
                    return f"{where}.text: text content blocks must be non-empty"
                if block.get("type") == "thinking" and block.get("signature") not in self._signed:
                    return f"{where}: Invalid `signature` in `thinking` block"
                if block.get("type") == "thinking" and turn.get("role") != "assistant":
                    return f"{where}: thinking blocks are the assistant's"
        for index, turn in enumerate(chat_turns):
            content = turn.get("content") if isinstance(turn.get("content"), list) else []
            if turn.get("role") == "assistant":
                calls = [b["id"] for b in content if b.get("type") == "tool_use"]
                after = chat_turns[index + 1] if index + 1 < len(chat_turns) else None
                head = after.get("content") if after is not None else None
                results = []
                for block in head if isinstance(head, list) else ():
                    if block.get("type") != "tool_result":
                        break
                    results.append(block.get("tool_use_id"))
                if calls and after is not None and sorted(results) != sorted(calls):
                    return (
                        "`tool_use` ids were found without `tool_result` blocks immediately"
                        f" after: {sorted(set(calls) - set(results))} (turn {index})"
                    )
            else:
                earlier = chat_turns[index - 1] if index else {}
                asked = {
                    b.get("id")
                    for b in earlier.get("content") or []
                    if isinstance(b, Mapping) and b.get("type") == "tool_use"
                }
                for block in content:
                    if block.get("type") == "tool_result" and block.get("tool_use_id") not in asked:
                        return (
                            f"unexpected `tool_use_id` in `tool_result`: {block.get('tool_use_id')}"
                        )
        last = chat_turns[-1].get("content") if chat_turns else None
        in_loop = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if thinking_on and in_loop and len(chat_turns) > 1:
            previous = chat_turns[-2].get("content")
            led = previous if isinstance(previous, list) else []
            led = [b for b in led if b.get("type") != "compaction"]
            first = led[0].get("type") if led else None
            if first not in ("thinking", "redacted_thinking"):
                return (
                    f"Expected `thinking` or `redacted_thinking`, but found `{first}`. When"
                    " `thinking` is enabled, a final `assistant` message must start with a"
                    " thinking block"
                )
        return None

    def _unbound(
        self, body: Mapping[str, Any], positions: Sequence[Any], headers: Mapping[str, str]
    ) -> str | None:
        """For a model that binds thinking to its prefix: the refusal of a thinking block
        whose prefix changed; under the beta, when the request asks for it, that block and
        every later one dropped instead (counted in ``dropped``), as the API does."""
        if not str(body.get("model", "")).startswith(BOUND):
            self.dropped.append(0)
            return None
        binding = (body.get("thinking") or {}).get("block_binding") or {}
        drop = binding.get("prefix_mismatch_behavior") == "drop_block"
        if drop and BINDING_BETA not in headers.get("anthropic-beta", ""):
            return f"thinking.block_binding: requires the {BINDING_BETA} beta"
        blocks = [block for turn in body.get("messages") or () for block in _content(turn)]
        start = len(positions) - len(blocks)  # tools and system come first
        failed = dropped = 0
        for index, block in enumerate(blocks):
            if block.get("type") != "thinking":
                continue
            before = positions[start + index - 1].prefix if start + index else b""
            if failed or self._signed.get(block.get("signature", "")) != before:
                if not drop:
                    return (
                        "Invalid `signature` in `thinking` block. The block is bound to a"
                        " different conversation."
                    )
                failed, dropped = 1, dropped + 1
        self.dropped.append(dropped)
        return None

    # -- answers ---------------------------------------------------------------------------

    def _answer(
        self,
        body: Mapping[str, Any],
        usage: dict[str, int],
        prefix: bytes,
        applied: Applied | None = None,
        *,
        sent: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The answer to ``body`` (as the model reads it; ``sent`` as it came, whose
        ``prefix`` a thinking block is bound to): a compaction block first when
        ``applied`` says one is due, then (unless the compaction pauses) a thinking block
        when thinking is on, and the next command's tool use or the closing text."""
        turns = [t for t in body.get("messages") or () if t.get("role") != "system"]
        summary = _summary(turns)
        scripted = turns if summary is None else [_user_text(summary), *turns]
        text, done = _latest_user_text(scripted)
        if summary is not None and text == summary:  # the request the summary holds
            done += _compacted_commands(summary)
        commands = RUN.findall(text)
        content: list[dict[str, Any]] = []
        iterations: list[dict[str, Any]] = []
        if applied is not None and applied.compaction_due:
            block = self._compaction(turns, text, done)
            content.append(block)
            read = {"input_tokens": sum(usage.values())}
            iterations.append(_iteration("compaction", read, self.count(block["content"])))
            if sent is not None:
                compacted = [*sent.get("messages", ()), {"role": "assistant", "content": [block]}]
                prefix = self.cache.positions({**sent, "messages": compacted})[-1].prefix
        edits = None
        if applied is not None and body.get("context_management") is not None:
            edits = applied.applied_edits
        if applied is not None and applied.pause_after_compaction:
            number = next(self._ids)
            return _message(body, number, content, "compaction", usage, iterations, edits)
        thinking = body.get("thinking") or {}
        if thinking.get("type") in ("enabled", "adaptive"):
            shown = (
                "" if thinking.get("display") == "omitted" else f"Thinking about step {done + 1}."
            )
            signature = hashlib.sha256(f"{next(self._ids)}:{shown}".encode()).hexdigest()
            self._signed[signature] = prefix
            content.append({"type": "thinking", "thinking": shown, "signature": signature})
        number = next(self._ids)
        if done < len(commands):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{number:06d}",
                    "name": "Bash",
                    "input": {"command": commands[done], "description": f"Step {done + 1}"},
                }
            )
            stop = "tool_use"
        else:
            size = _last_result_size(turns)
            content.append({"type": "text", "text": f"Done after {done} commands ({size} bytes)."})
            stop = "end_turn"
        if iterations:
            iterations.append(_iteration("message", usage, 20))
        return _message(body, number, content, stop, usage, iterations, edits)

    def _compaction(
        self, turns: Sequence[Mapping[str, Any]], text: str, done: int
    ) -> dict[str, Any]:
        """The compaction block of a conversation whose latest request is ``text``, with
        ``done`` of its commands run: its summary holds both."""
        request = COMPACTED.sub("", text).strip("\n")
        tokens = self.count(list(turns))
        summary = (
            f"{SUMMARY_HEAD} ({len(turns)} turns, {tokens} tokens).\n{request}\n"
            f"Commands already run: {done}."
        )
        secret = base64.b64encode(hashlib.sha256(summary.encode()).digest() * 2).decode()
        return {"type": "compaction", "content": summary, "encrypted_content": secret}


def _betas(received: Received) -> set[str]:
    """The betas a request names in its ``anthropic-beta`` headers."""
    lines = [v for k, v in received.header_lines if k == "anthropic-beta"] or [
        received.headers.get("anthropic-beta", "")
    ]
    return {name.strip() for line in lines for name in line.split(",") if name.strip()}


def _message(
    body: Mapping[str, Any],
    number: int,
    content: list[dict[str, Any]],
    stop: str,
    usage: Mapping[str, int],
    iterations: list[dict[str, Any]],
    edits: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """A whole Messages answer: ``content``, its usage (with ``iterations`` when a
    compaction ran) and the context management ``edits`` applied (``None``: the request
    asked for none)."""
    message: dict[str, Any] = {
        "id": f"msg_{number:06d}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 20},
    }
    if iterations:
        message["usage"]["iterations"] = iterations
    if edits is not None:
        message["context_management"] = {"applied_edits": edits}
    return message


def _user_text(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _compacted_commands(summary: str) -> int:
    """How many commands a compaction summary says were run before it."""
    counts = [int(n) for n in COMPACTED.findall(summary) if n]
    return counts[-1] if counts else 0


def _summary(turns: Sequence[Mapping[str, Any]]) -> str | None:
    """The summary of the compaction block that begins ``turns`` (what the API leaves of
    a compacted conversation), if one does: the scripted model reads it as a user turn
    holding the request it was compacted in."""
    head = _content(turns[0]) if turns and turns[0].get("role") == "assistant" else []
    if head and head[0].get("type") == "compaction" and isinstance(head[0].get("content"), str):
        return str(head[0]["content"])
    return None


def _iteration(kind: str, read: Mapping[str, int], written: int) -> dict[str, Any]:
    """One entry of ``usage.iterations``: ``read`` its input (cache fields absent: 0)."""
    return {
        "type": kind,
        "input_tokens": read.get("input_tokens", 0),
        "output_tokens": written,
        "cache_creation_input_tokens": read.get("cache_creation_input_tokens", 0),
        "cache_read_input_tokens": read.get("cache_read_input_tokens", 0),
    }


def _content(turn: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = turn.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]  # as ``PrefixCache`` counts it
    return list(content or ())


class ChatModel:
    """An OpenAI-compatible model behind ``/v1/chat/completions``, answering as
    ``ClaudeModel`` does, with tool calls and usage (its prompt cache: the longest prefix
    of messages seen before)."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self._seen: set[bytes] = set()
        self._ids = itertools.count(1)

    def __call__(self, received: Received) -> Reply | None:
        if received.path.split("?")[0] != "/v1/chat/completions":
            return None
        body = received.json()
        problem = self._refused(body.get("messages") or [])
        if problem is not None:
            self.refusals.append(problem)
            error = {
                "message": problem,
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
            return JSONReply({"error": error}, status=400)
        self.requests.append(body)
        return self._answer(body)

    def extends(self, later: int, earlier: int) -> bool:
        """Whether accepted request ``later`` starts with all of ``earlier``'s prompt (its
        tools and messages), as the provider's automatic prefix cache needs."""
        before, after = self.requests[earlier], self.requests[later]
        messages = before.get("messages") or []
        return before.get("tools") == after.get("tools") and (
            (after.get("messages") or [])[: len(messages)] == messages
        )

    @staticmethod
    def _refused(messages: Sequence[Mapping[str, Any]]) -> str | None:
        for index, message in enumerate(messages):
            if message.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                return f"messages[{index}].role: unexpected {message.get('role')!r}"
            if message.get("role") == "assistant" and message.get("tool_calls"):
                wanted = {call["id"] for call in message["tool_calls"]}
                after = itertools.takewhile(
                    lambda m: m.get("role") == "tool", messages[index + 1 :]
                )
                answered = {m.get("tool_call_id") for m in after}
                if wanted - answered:
                    return (
                        "An assistant message with 'tool_calls' must be followed by tool messages"
                        f" responding to each 'tool_call_id'. Missing: {sorted(wanted - answered)}"
                    )
            if message.get("role") == "tool":
                earlier = [m for m in messages[:index] if m.get("role") != "tool"]
                calls = (earlier[-1].get("tool_calls") or []) if earlier else []
                if message.get("tool_call_id") not in {c.get("id") for c in calls}:
                    return f"messages[{index}]: a tool message must answer a preceding tool call"
        return None

    def _answer(self, body: Mapping[str, Any]) -> Reply:
        messages = body.get("messages") or []
        prompt = _tokens(messages) + _tokens(body.get("tools") or [])
        cached, digest = 0, hashlib.sha256()
        for message in messages:
            digest.update(orjson.dumps(message))
            if digest.digest() in self._seen:
                cached = _tokens(messages[: messages.index(message) + 1])
        prefix = hashlib.sha256()
        for message in messages:
            prefix.update(orjson.dumps(message))
            self._seen.add(prefix.digest())
        turns = []
        for message in messages:
            if message.get("role") == "tool":
                turns.append(
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "content": message.get("content")}],
                    }
                )
            elif message.get("role") == "user":
                content = message.get("content")
                parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
                turns.append({"role": "user", "content": parts})
        text, done = _latest_user_text(turns)
        commands = RUN.findall(text)
        number = next(self._ids)
        reply: dict[str, Any] = {"role": "assistant", "content": None}
        if done < len(commands):
            arguments = orjson.dumps({"command": commands[done], "description": f"Step {done + 1}"})
            reply["tool_calls"] = [
                {
                    "id": f"call_{number:06d}",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": arguments.decode()},
                }
            ]
            finish = "tool_calls"
        else:
            reply["content"] = f"Done after {done} commands ({_last_result_size(turns)} bytes)."
            finish = "stop"
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": 20,
            "total_tokens": prompt + 20,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt)},
        }
        completion_id = f"chatcmpl-{number:06d}"
        if not body.get("stream"):
            return JSONReply(
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": 1,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                    "usage": usage,
                }
            )

        def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }

        chunks = [chunk({"role": "assistant", "content": ""})]
        if reply.get("tool_calls"):
            call = reply["tool_calls"][0]
            chunks.append(chunk({"tool_calls": [{"index": 0, **call}]}))
        else:
            chunks.append(chunk({"content": reply["content"]}))
        chunks.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**chunk({}), "choices": [], "usage": usage})
        return SSEReply(events_of(chunks))


class ResponsesModel:
    """A model behind OpenAI's Responses API, as Codex CLI talks to it: ``POST
    /v1/responses`` (streamed when asked) and ``response.create`` on its WebSocket, both
    answered with the same events. It plays the model of the other two with Codex's shell
    tool (``exec_command``, arguments ``{"cmd": ...}``), each answer led by a reasoning
    item whose encrypted content it remembers (when the request ``include``s it): a call
    while the latest prompt has ``RUN:`` lines left, then the text ``Done after N commands
    (S bytes).``; a ``generate: false`` request (Codex's WebSocket prewarm) gets an answer
    with no output. A user message that says it is
    "not a new request" (the gateway's note for messages it removed) is not the prompt,
    and the calls it says it stands for (``exec_command x2``) count as made, as a model
    reading it would take them. It keeps each response's whole history for a
    ``previous_response_id`` to continue.

    It checks each request as the API does and answers a refused one with a 400 (an
    ``error`` event over the WebSocket), recording why in ``refusals``: a
    ``previous_response_id`` must name a response it can continue (stored, or with
    ``store: false`` one made on the same WebSocket connection), no two items share an
    id, every tool output answers a call before it and every call has its output, and
    every reasoning item carries encrypted content the model issued, byte for byte.

    Its usage bills the whole input (a quarter of its JSON's length) with a prefix cache:
    the longest run of leading items (after the instructions and tools) seen in an earlier
    request, counted in 128-token steps from 1,024 tokens on, as OpenAI's cache does."""

    ROLES: Final = ("user", "assistant", "system", "developer")
    OUTPUTS: Final = frozenset({"function_call_output", "custom_tool_call_output"})
    CALLS: Final = frozenset({"function_call", "custom_tool_call"})

    def __init__(self, *, tool: str = "exec_command") -> None:
        self.tool = tool
        self.refusals: list[str] = []
        self.requests: list[dict[str, Any]] = []
        """Every request accepted, as it came (a WebSocket message without its ``type``)."""
        self.inputs: list[list[dict[str, Any]]] = []
        """Each accepted request's whole input: the history its ``previous_response_id``
        continues, then its own items."""
        self.outputs: list[list[dict[str, Any]]] = []
        """Each accepted request's output items."""
        self.transports: list[str] = []
        """How each accepted request came: ``"http"`` or ``"ws"``."""
        self.usages: list[dict[str, Any]] = []
        self.issued: dict[str, str] = {}
        """The encrypted content of each reasoning item issued -> the item's id."""
        self._responses: dict[str, tuple[list[dict[str, Any]], bool, str | None]] = {}
        """Response id -> its whole history (input and output), whether it is stored, and
        the WebSocket connection it was made on (its handshake's key)."""
        self._seen: set[bytes] = set()
        self._ids = itertools.count(1)

    def __call__(self, received: Received) -> Reply | None:
        connection: str | None = None
        if received.method == "WS":
            message = received.json()
            if not isinstance(message, dict) or message.get("type") != "response.create":
                return None
            body = {key: value for key, value in message.items() if key != "type"}
            connection = received.headers.get("sec-websocket-key", "")
        elif received.method == "POST" and received.path.split("?")[0] == "/v1/responses":
            body = received.json()
        else:
            return None
        whole, problem = self._history(body, connection)
        problem = problem or self._refused(whole, body)
        if problem is not None:
            self.refusals.append(problem)
            error = {
                "message": problem,
                "type": "invalid_request_error",
                "param": "input",
                "code": None,
            }
            return JSONReply({"error": error}, status=400)
        self.requests.append(body)
        self.inputs.append(whole)
        self.transports.append("http" if connection is None else "ws")
        response = self._answer(body, whole, connection)
        events = response_events(response)
        if connection is not None:
            return WSReply(events)
        if body.get("stream"):
            return SSEReply(sse_of_events(events))
        return JSONReply(response)

    def extends(self, later: int, earlier: int) -> bool:
        """Whether accepted request ``later`` starts with all of ``earlier``'s prompt (its
        instructions, tools and whole input), as the prefix cache needs."""
        before, after = self.requests[earlier], self.requests[later]
        items = self.inputs[earlier]
        return (
            before.get("instructions") == after.get("instructions")
            and before.get("tools") == after.get("tools")
            and self.inputs[later][: len(items)] == items
        )

    # -- the API's checks ------------------------------------------------------------------

    def _history(
        self, body: Mapping[str, Any], connection: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The whole input of ``body``: the history it continues, then its items; or why
        the response it continues cannot be found."""
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
        previous = body.get("previous_response_id")
        if previous is None:
            return list(items), None
        kept = self._responses.get(previous)
        if kept is None or not (kept[1] or (connection is not None and kept[2] == connection)):
            return [], f"Previous response with id '{previous}' not found."
        return [*kept[0], *items], None

    def _refused(self, items: Sequence[Mapping[str, Any]], body: Mapping[str, Any]) -> str | None:
        ids: set[str] = set()
        called: set[Any] = set()
        answered = {item.get("call_id") for item in items if item.get("type") in self.OUTPUTS}
        for index, item in enumerate(items):
            kind = item.get("type", "message")
            item_id = item.get("id")
            if isinstance(item_id, str):
                if item_id in ids:
                    return (
                        f"Duplicate item found with id {item_id}. Remove duplicate items from"
                        " your input and try again."
                    )
                ids.add(item_id)
            if kind == "message" and item.get("role") not in self.ROLES:
                return f"input[{index}].role: unexpected {item.get('role')!r}"
            if kind in self.CALLS:
                if item.get("call_id") not in answered:
                    return f"No tool output found for function call {item.get('call_id')}."
                called.add(item.get("call_id"))
            if kind in self.OUTPUTS and item.get("call_id") not in called:
                return (
                    "No tool call found for function call output with call_id"
                    f" {item.get('call_id')}."
                )
            if kind == "reasoning":
                secret = item.get("encrypted_content")
                if secret is None and body.get("store") is False:
                    return (
                        f"Item with id '{item_id}' not found. Items are not persisted when"
                        " `store` is set to false. Try again with `store` set to true, or"
                        " remove this item from your input."
                    )
                if secret is not None and secret not in self.issued:
                    return (
                        f"input[{index}].encrypted_content: the encrypted content of item"
                        f" '{item_id}' could not be verified."
                    )
        return None

    # -- answers ---------------------------------------------------------------------------

    def _answer(
        self, body: Mapping[str, Any], whole: list[dict[str, Any]], connection: str | None
    ) -> dict[str, Any]:
        number = next(self._ids)
        output: list[dict[str, Any]] = []
        if body.get("generate") is not False:
            prompt, done = self._latest_prompt(whole)
            commands = RUN.findall(prompt)
            if "reasoning.encrypted_content" in (body.get("include") or ()):
                secret = (
                    "gAAAAAB"
                    + base64.b64encode(
                        hashlib.sha512(f"reasoning {number}".encode()).digest() * 3
                    ).decode()
                )
                self.issued[secret] = f"rs_{number:06d}"
                summary = [f"Step {done + 1}."]
                output.append(
                    reasoning_item(f"rs_{number:06d}", encrypted_content=secret, summary=summary)
                )
            if done < len(commands):
                arguments = {"cmd": commands[done]}
                call = function_call_item(
                    self.tool, arguments, f"call_{number:06d}", f"fc_{number:06d}"
                )
                output.append(call)
            else:
                size = next(
                    (
                        len(orjson.dumps(item.get("output")))
                        for item in reversed(whole)
                        if item.get("type") in self.OUTPUTS
                    ),
                    0,
                )
                text = f"Done after {done} commands ({size} bytes)."
                output.append(message_item(text, f"msg_{number:06d}"))
        usage = self._usage(body, whole)
        self.usages.append(usage)
        self.outputs.append(output)
        response_id = f"resp_{number:06d}"
        self._responses[response_id] = (
            [*whole, *output],
            body.get("store") is not False,
            connection,
        )
        settings = {name: body[name] for name in ResponsesRoutes.ECHOED if name in body}
        return response_body(
            body.get("model", "gpt-5.5"), output, id=response_id, usage=usage, **settings
        )

    def _latest_prompt(self, items: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
        """The text of the latest user message that is a request (not one of Codex's own
        ``<...>`` blocks, nor a note that says it is not a new request), and how many calls
        of the shell tool came after it: those in the input, and those a note says it
        stands for (``exec_command x2``), as a model reading it would count them."""
        calls = 0
        for item in reversed(items):
            if item.get("type") == "function_call" and item.get("name") == self.tool:
                calls += 1
            if item.get("type", "message") != "message" or item.get("role") != "user":
                continue
            content = item.get("content")
            parts = (
                [{"type": "input_text", "text": content}] if isinstance(content, str) else content
            )
            text = "\n".join(
                p.get("text", "") for p in parts or () if p.get("type") == "input_text"
            )
            if NOT_A_REQUEST.search(text):
                calls += sum(int(n) for name, n in REMOVED_CALLS.findall(text) if name == self.tool)
            elif text.strip() and not text.lstrip().startswith("<"):
                return text, calls
        return "", calls

    def _usage(self, body: Mapping[str, Any], whole: Sequence[Any]) -> dict[str, Any]:
        head = [body.get("instructions"), body.get("tools")]
        prompt = _tokens([*head, *whole])
        digest = hashlib.sha256(orjson.dumps(head))
        cached = 0
        for index, item in enumerate(whole):
            digest.update(orjson.dumps(item))
            key = digest.digest()
            if key in self._seen:
                cached = _tokens([*head, *whole[: index + 1]])
            self._seen.add(key)
        cached = cached // 128 * 128 if cached >= 1024 else 0
        return response_usage(prompt, 30, cached_tokens=min(cached, prompt), reasoning_tokens=10)
