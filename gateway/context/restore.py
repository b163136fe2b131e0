"""The ``context_restore`` tool: the model takes back what the pipeline offloaded.

The gateway adds one function tool, ``context_restore``, at the end of a conversation's
tools: from its first request when it brings tools of its own (``Settings.restore_tool``,
``from_start``), else from the first request whose outgoing body carries refs; and keeps
adding it on every later request of the conversation (the conversation's record
remembers), so the tools array does not change between turns and the provider's cached
prefix survives (``gateway.context.compaction``).

When the model calls it, the gateway answers the call itself from the store (in the
caller's namespace) and asks the model again with the answer appended, up to
``MAX_ROUNDS`` times; the client only ever sees the final answer, with the usage of every
round added up. If an answer mixes the client's own tool calls with restore calls, the
client's calls go to the client as they are and the restore calls are dropped (counted in
``x-contextgate-restore``). Streamed text passes through at once; a tool call's deltas are
held only until its name says whose it is.

A restore returns at most ``RESTORE_TOKENS`` tokens: a larger object, or range, is cut at
a line boundary and the answer says which lines came and how to ask for the next ones.
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gateway.http.sse import close, event_data
from gateway.store import REF_PATTERN
from pipelines import OffloadStore, StoreError, TokenCounter
from pipelines.stages.media import MEDIA_PARTS

__all__ = [
    "MAX_ROUNDS",
    "RESTORE_TOOL",
    "RESTORE_TOOL_NAME",
    "Resend",
    "ResendStream",
    "RestoreStats",
    "Restorer",
    "add_usage",
    "chain",
    "complete",
    "has_refs",
    "stream",
    "with_restore_tool",
]

Resend = Callable[[list[dict[str, Any]]], Awaitable[bytes]]
"""Sends the next restore round (the turns to add) and returns its whole answer."""
ResendStream = Callable[[list[dict[str, Any]]], Awaitable[tuple[bytes, AsyncIterator[bytes]]]]
"""Sends the next restore round and returns its stream: the first event and the rest."""

RESTORE_TOOL_NAME: Final = "context_restore"
MAX_ROUNDS: Final = 3
"""Rounds of restore calls the gateway answers for one client request."""
RESTORE_TOKENS: Final = 2_000
"""Largest restore round, in tokens (shared by the round's calls)."""
_MIN_ANSWER: Final = 200

RESTORE_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": RESTORE_TOOL_NAME,
        "description": (
            "Restore content that was removed from earlier in this conversation to save"
            " space. Placeholders in the conversation name it by a ref such as"
            " ctx_AbC123...; pass that ref. Large content comes back in line ranges: pass"
            " start_line (and end_line) to read further. Use this instead of guessing what"
            " removed content said."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "The ref, starting with ctx_."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
                "start_char": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Where to go on inside a very long line.",
                },
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}


_REF_BYTES: Final = re.compile(REF_PATTERN.pattern.encode())


def has_refs(body: bytes) -> bool:
    """Whether an outgoing request body names any offloaded object (searched as bytes: a
    resent history is large, and decoding it on every request to look is waste)."""
    return b"ctx_" in body and _REF_BYTES.search(body) is not None


def with_restore_tool(request: dict[str, Any]) -> dict[str, Any] | None:
    """``request`` with the restore tool appended to its tools, or ``None`` when it cannot
    be: the request uses the legacy ``functions`` field, asks for several choices (``n``),
    or defines a tool of that name."""
    if request.get("functions") is not None:
        return None
    n = request.get("n")
    if isinstance(n, int) and n > 1:
        return None
    tools = request.get("tools") or []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == RESTORE_TOOL_NAME:
            return None
    return {**request, "tools": [*tools, RESTORE_TOOL]}


@dataclass(slots=True)
class RestoreStats:
    """What the restore loop did for one request."""

    rounds: int = 0
    calls: int = 0
    mixed: int = 0
    """Answers that mixed client tool calls with restore calls (restore calls dropped)."""
    exhausted: bool = False
    """The model still asked to restore after ``MAX_ROUNDS`` rounds."""

    def header(self) -> str:
        parts = [f"rounds={self.rounds}", f"calls={self.calls}"]
        if self.mixed:
            parts.append(f"mixed={self.mixed}")
        if self.exhausted:
            parts.append("exhausted")
        return ", ".join(parts)


@dataclass(slots=True)
class Restorer:
    """Answers restore calls for one request."""

    store: OffloadStore
    namespace: str
    counter: TokenCounter
    stats: RestoreStats = field(default_factory=RestoreStats)
    room: int | None = None
    """Tokens the restore answers of this request may add in all (the input budget less
    what was sent); ``None``: only the per-round cap applies."""
    _media: list[dict[str, Any]] = field(default_factory=list)

    async def answer(self, call: Mapping[str, Any], budget: int = RESTORE_TOKENS) -> dict[str, Any]:
        """The tool message answering one restore call, in at most ``budget`` tokens."""
        self.stats.calls += 1
        return {
            "role": "tool",
            "tool_call_id": call.get("id"),
            "content": await self._content(_arguments(call), max(budget, _MIN_ANSWER)),
        }

    async def answer_all(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages answering ``calls``, which share this round's budget: a tool
        message each, then, if any restored object was an image (or other media part),
        one user message carrying them, since a tool message can only hold text."""
        round_budget = min(RESTORE_TOKENS, self.room) if self.room is not None else RESTORE_TOKENS
        each = round_budget // max(1, len(calls))
        messages = [await self.answer(call, each) for call in calls]
        if self.room is not None:
            self.room -= sum(self.counter.count_message(m) for m in messages)
        if self._media:
            parts: list[dict[str, Any]] = [
                {"type": "text", "text": "[Restored media, as requested with context_restore.]"}
            ]
            parts.extend(self._media)
            messages.append({"role": "user", "content": parts})
            self._media = []
        return messages

    async def _content(self, arguments: str, budget: int) -> str:
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return 'context_restore: the arguments are not valid JSON; pass {"ref": "ctx_..."}.'
        ref = args.get("ref") if isinstance(args, dict) else None
        if not isinstance(ref, str) or not REF_PATTERN.fullmatch(ref.strip()):
            return 'context_restore: pass the ref named in a placeholder, e.g. {"ref": "ctx_..."}.'
        ref = ref.strip()
        start, end, char = args.get("start_line"), args.get("end_line"), args.get("start_char")
        if not all(v is None or (type(v) is int and v >= 1) for v in (start, end, char)):
            return (
                "context_restore: start_line, end_line and start_char must be whole numbers from 1."
            )
        try:
            content = await self.store.get(self.namespace, ref)
        except StoreError:
            return f"context_restore: the store is unavailable right now; {ref} cannot be read."
        if content is None:
            return f"context_restore: nothing is stored as {ref} (it may have expired)."
        media = _media_part(content)
        if media is not None:
            self._media.append(media)
            return f"[{ref} is a {media['type']} part; it follows in the next message.]"
        # Lines as the objects route counts them (bytes.splitlines).
        lines = [line.decode("utf-8", "replace") for line in content.splitlines(keepends=True)]
        first = start or 1
        last = min(end or len(lines), len(lines))
        if first > len(lines) or first > last:
            return (
                f"context_restore: {ref} has {len(lines)} lines; lines {first}-{end or first}"
                " are not in it."
            )
        shown: list[str] = []
        used = 0
        offset = (char or 1) - 1
        for number in range(first, last + 1):
            line = lines[number - 1][offset:] if number == first else lines[number - 1]
            tokens = self.counter.count_text(line)
            if used + tokens <= budget:
                shown.append(line)
                used += tokens
                continue
            if shown:
                break
            # One line over the budget on its own: a piece of it, and where to go on.
            piece = _fitting(line, budget, self.counter)
            cut_at = offset + len(piece) + 1
            return (
                f"[{ref}: line {number} of {len(lines)}, characters {offset + 1}-{cut_at - 1}"
                f" of {len(lines[number - 1])}. Call again with start_line={number},"
                f" start_char={cut_at} for more.]\n{piece}"
            )
        through = first + len(shown) - 1
        if first == 1 and not offset and through == len(lines):
            return "".join(shown)
        more = (
            f" Call again with start_line={through + 1} for more." if through < len(lines) else ""
        )
        part = f", from character {offset + 1}" if offset else ""
        return f"[{ref}: lines {first}-{through} of {len(lines)}{part}.{more}]\n" + "".join(shown)


def _fitting(text: str, budget: int, counter: TokenCounter) -> str:
    """The longest head of ``text`` within ``budget`` tokens (a few halvings at most)."""
    size = min(len(text), budget * 4)
    while size > 1 and counter.count_text(text[:size]) > budget:
        size = size * budget // max(counter.count_text(text[:size]), 1) * 9 // 10 or size // 2
    return text[:size]


_PART_KEYS: Final = frozenset(
    {"type", "source", "file", "title", "context", "citations", "cache_control"}
)
"""Keys a stored media part may have besides its type-named payload (those of Anthropic's
image and document blocks, and a marker)."""
_PAYLOADS: Final = ("source", "file")
"""Keys that hold a part's payload whatever its type."""


def _media_part(content: bytes) -> dict[str, Any] | None:
    """The media part stored in ``content`` (the media stage stores each part's JSON), or
    ``None`` for anything else.

    A part is an object of a media type (``MEDIA_PARTS``) with its payload, in the form the
    request carried it: OpenAI's under a key named after the type (``image_url``,
    ``input_audio``, ``file``), Anthropic's under ``source`` (``image``, ``document``
    blocks), or a ``file`` object; and with no key a content part lacks, so that a tool's
    JSON output that merely has such a ``type`` comes back as the text it is."""
    # "type" is looked for anywhere: a part's keys may come in any order, the payload first.
    if not content.startswith(b"{") or b'"type"' not in content:
        return None
    try:
        part = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in MEDIA_PARTS or not set(part) <= _PART_KEYS | {kind}:
        return None
    if isinstance(part.get(kind), dict | str) or any(
        isinstance(part.get(k), dict) for k in _PAYLOADS
    ):
        return part  # type: ignore[no-any-return]
    return None


def _arguments(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    return arguments if isinstance(arguments, str) else ""


def _is_restore(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == RESTORE_TOOL_NAME


def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    """Usage objects added field by field (nested detail objects too)."""
    if not isinstance(usage, dict):
        return total
    if total is None:
        return copy.deepcopy(usage)
    for key, value in usage.items():
        mine = total.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and isinstance(mine, int | float):
            total[key] = mine + value
        elif isinstance(value, dict):
            total[key] = add_usage(mine if isinstance(mine, dict) else None, value)
        elif key not in total:
            total[key] = value
    return total


async def complete(body: bytes, restorer: Restorer, resend: Resend) -> bytes:
    """A non-streamed answer with its restore calls answered: while the model asks only to
    restore, answer and ask again (``resend`` returns the next answer's body, or raises
    ``GatewayError``). Returns the body the client gets."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    while True:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(answer, dict):
            return body
        usage = add_usage(usage, answer.get("usage"))
        choices = answer.get("choices")
        choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or not isinstance(choice, dict):
            break
        calls = message.get("tool_calls") or []
        restores = [c for c in calls if _is_restore(c)]
        if not restores:
            break
        others = [c for c in calls if not _is_restore(c)]
        if others or stats.rounds >= MAX_ROUNDS:
            stats.mixed += bool(others)
            stats.exhausted = stats.exhausted or not others
            if others:
                message["tool_calls"] = others
            else:
                del message["tool_calls"]
                choice["finish_reason"] = "stop"
                message["content"] = message.get("content") or _EXHAUSTED
            break
        stats.rounds += 1
        extra.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": restores}
        )
        extra.extend(await restorer.answer_all(restores))
        body = await resend(list(extra))
    if usage is not None:
        answer["usage"] = usage
    return orjson.dumps(answer)


_EXHAUSTED: Final = (
    "(The model asked to restore removed context more times than allowed for one request.)"
)


async def stream(
    first: bytes,
    events: AsyncIterator[bytes],
    restorer: Restorer,
    resend: ResendStream,
) -> AsyncIterator[bytes]:
    """A streamed answer relayed with its restore calls answered in place: text deltas at
    once, the client's tool-call deltas once their name is known (renumbered to leave no
    gap), restore calls held and answered, the next round's stream continuing the same
    stream for the client (same id), the usage totals where the upstream put its usage (a
    chunk of their own, or the final chunk) and one ``[DONE]`` at the end. ``resend``
    opens the next round's stream (its first event and the rest).
    Only for single-choice requests (``with_restore_tool`` refuses ``n > 1``)."""
    stats = restorer.stats
    extra: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    # Whether the upstream sent its usage in a chunk of its own (no choices): the totals go
    # so too; else on the final chunk, where it put them (a chunk without choices would
    # surprise a client that did not ask for one).
    usage_apart = False
    stream_id: Any = None
    template: dict[str, Any] = {"object": "chat.completion.chunk"}
    round_events: AsyncIterator[bytes] = chain(first, events)
    thinking_before = thinking_seen = 0
    while True:
        thinking_before = thinking_seen
        calls = _Calls()
        text: list[str] = []
        finish: dict[str, Any] | None = None
        done: bytes | None = None
        round_usage: Any = None
        try:
            async for event in round_events:
                data = event_data(event)
                if data.strip() == b"[DONE]":
                    done = event
                    continue
                try:
                    chunk = orjson.loads(data)
                except orjson.JSONDecodeError:
                    yield event
                    continue
                if not isinstance(chunk, dict):
                    yield event
                    continue
                if stream_id is None:
                    stream_id = chunk.get("id")
                    template = {
                        k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk
                    }
                elif "id" in chunk:
                    chunk["id"] = stream_id
                if "usage" in chunk:
                    # Some providers repeat a running total in every chunk: the last counts.
                    round_usage = chunk.pop("usage") or round_usage
                    if not chunk.get("choices"):
                        usage_apart = True
                        continue
                choices = chunk.get("choices")
                if not isinstance(choices, list) or len(choices) != 1:
                    yield _event(chunk)
                    continue
                choice = choices[0]
                delta = choice.get("delta") or {}
                if stats.rounds:
                    # A later round is the same answer to the client: its role chunk would
                    # make an SDK's accumulated role "assistantassistant".
                    delta.pop("role", None)
                if isinstance(delta.get("content"), str):
                    text.append(delta["content"])
                for block in delta.get("thinking_blocks") or ():
                    # Numbered per round upstream; the client's one answer numbers on.
                    if isinstance(block, dict) and isinstance(block.get("index"), int):
                        block["index"] += thinking_before
                        thinking_seen = max(thinking_seen, block["index"] + 1)
                deltas = delta.pop("tool_calls", None)
                if isinstance(deltas, list):
                    passed = calls.take(deltas)
                    if passed:
                        delta["tool_calls"] = passed
                if choice.get("finish_reason") is not None:
                    # Held until the round's outcome is known; what else it carries goes now.
                    finish = {**chunk, "choices": [{**choice, "delta": {}}]}
                    choice["finish_reason"] = None
                if delta or choice.get("logprobs"):
                    yield _event(chunk)
        finally:
            await close(round_events)
        usage = add_usage(usage, round_usage)
        leftover = calls.flush()
        if leftover:
            yield _event({**template, "choices": [{"index": 0, "delta": {"tool_calls": leftover}}]})
        restores = calls.restores()
        if restores and not calls.client and stats.rounds < MAX_ROUNDS:
            stats.rounds += 1
            extra.append(
                {"role": "assistant", "content": "".join(text) or None, "tool_calls": restores}
            )
            extra.extend(await restorer.answer_all(restores))
            next_first, next_events = await resend(list(extra))
            round_events = chain(next_first, next_events)
            continue
        if restores:
            stats.mixed += bool(calls.client)
            stats.exhausted = stats.exhausted or not calls.client
        if finish is not None:
            choice = finish["choices"][0]
            if restores and not calls.client:
                choice["finish_reason"] = "stop"
                if not text:
                    choice["delta"] = {"content": _EXHAUSTED}
            if usage is not None and not usage_apart:
                finish["usage"], usage = usage, None
            yield _event(finish)
        if usage is not None:
            yield _event({**template, "choices": [], "usage": usage})
        if done is not None:
            yield done
        return


class _Calls:
    """The tool calls of one streamed round: whose each is, decided by its name."""

    __slots__ = ("_held", "_order", "_restore", "client")

    def __init__(self) -> None:
        self._restore: dict[Any, dict[str, Any]] = {}
        self.client: dict[Any, int] = {}
        """Client calls by their upstream key, with the index the client sees."""
        self._held: dict[Any, list[dict[str, Any]]] = {}
        self._order: list[Any] = []

    def take(self, deltas: list[Any]) -> list[dict[str, Any]]:
        """The deltas the client gets now (renumbered); restore deltas are kept."""
        passed: list[dict[str, Any]] = []
        for position, part in enumerate(deltas):
            if not isinstance(part, dict):
                continue
            key = _call_key(part, position, self._order)
            if key in self._restore:
                _accumulate(self._restore[key], part)
            elif key in self.client:
                passed.append({**part, "index": self.client[key]})
            else:
                held = self._held.setdefault(key, [])
                held.append(part)
                name = next((_name(p) for p in held if _name(p)), None)
                if name is None:
                    continue  # not known yet whose it is
                del self._held[key]
                if name == RESTORE_TOOL_NAME:
                    call = {k: v for k, v in held[0].items() if k != "index"}
                    call["type"] = "function"
                    call["function"] = {"name": RESTORE_TOOL_NAME, "arguments": ""}
                    for piece in held:
                        _accumulate(call, piece)
                    self._restore[key] = call
                else:
                    self.client[key] = len(self.client)
                    passed.extend({**p, "index": self.client[key]} for p in held)
        return passed

    def flush(self) -> list[dict[str, Any]]:
        """Deltas still held at the end of the round (no name ever came): the client's."""
        passed: list[dict[str, Any]] = []
        for key, held in self._held.items():
            self.client[key] = len(self.client)
            passed.extend({**p, "index": self.client[key]} for p in held)
        self._held.clear()
        return passed

    def restores(self) -> list[dict[str, Any]]:
        return [self._restore[key] for key in self._order if key in self._restore]


def _call_key(part: dict[str, Any], position: int, order: list[Any]) -> Any:
    """Which call a delta belongs to: its ``index``, else its id, else its position."""
    index = part.get("index")
    key = index if isinstance(index, int) else part.get("id") or f"position {position}"
    if key not in order:
        order.append(key)
    return key


def _name(part: dict[str, Any]) -> str | None:
    function = part.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def _accumulate(call: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    function = part.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]
    return call


def _event(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def chain(first: bytes, events: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """``first``, then ``events``; ``events`` closed when the iteration ends."""
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await close(events)
