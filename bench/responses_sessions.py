"""Chat-format agent sessions (the tau-bench trajectories) as an OpenAI Responses client
sends them, sent through the gateway's Responses codec and the pipeline, and what must
hold of what goes up.

Conversion (``convert``), deterministic, one chat message at a time:

- the first system message -> ``instructions`` (style ``instructions``, as Codex CLI sends
  it) or a ``developer`` message (style ``developer``); a later one -> a developer message;
- a user message -> a ``message`` item: typed, its text one ``input_text`` part (style
  ``instructions``), or the short form with a string (style ``developer``);
- an assistant message -> a synthetic ``reasoning`` item (a one-line summary naming what
  the turn does, and a deterministic ``encrypted_content``: base64 of a Fernet-shaped
  token, 120-184 characters), then its text as an assistant ``message`` with one
  ``output_text`` part, then one ``function_call`` per tool call: the run of items a
  stateless reasoning model returns (``store: false``, ``include:
  ["reasoning.encrypted_content"]``), which its client sends back on the next request;
- a tool message -> a ``function_call_output`` (the chat message's ``name`` has no place
  in it).

A call id the session used before (tau-bench's trajectories reuse some: a chat call is
answered right after it, so that is unambiguous there) gets a suffix (``call_x_2``), and
the output answering it the same: in a Responses input an output names its call by
``call_id`` anywhere after it, so each must be unique, as the API's own are.

A request for the first ``end`` chat messages (``Conversion.body``) sends the items they
became, so that a history the client extends keeps its earlier items byte for byte.

What must hold of a request the gateway sends up (``problems``): every
``function_call_output`` answers a ``function_call`` sent before it, and every call is
answered after it, once; every reasoning item is byte for byte one the client sent,
immediately followed by the item it preceded in the client's input (its follower), and
no follower goes without its reasoning; no key of the codec's leaks into the body. And
over a conversation: every ref the body names restores, transitively
(``unrestorable``); between compaction events each request starts with the items the
previous one sent (``prefix_kept``).
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from gateway.codecs.responses import InboundRequest, chat_messages, parse_request, to_request
from gateway.codecs.responses.items import EXTERNAL, INDEX, INSTRUCTIONS, ITEMS
from pipelines import CompactResult

__all__ = [
    "REF",
    "Conversion",
    "Sends",
    "Sent",
    "Style",
    "chat_form",
    "convert",
    "prefix_kept",
    "problems",
    "reasoning_problems",
    "send",
    "unpaired",
    "unrestorable",
]

Item = dict[str, Any]
Messages = list[dict[str, Any]]
Style = Literal["instructions", "developer"]
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
_CODEC_KEYS = (ITEMS, INDEX, INSTRUCTIONS, EXTERNAL)
_FERNET_TIME = (1_764_000_000).to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class Conversion:
    """A chat session's messages as Responses items."""

    instructions: str | None
    items: list[Item]
    ends: list[int]
    """``ends[k]``: how many items stand for the first ``k`` chat messages."""

    def body(self, end: int, model: str = "gpt-4o") -> dict[str, Any]:
        """The request a stateless Responses client sends for the first ``end`` chat
        messages."""
        body: dict[str, Any] = {"model": model}
        if self.instructions is not None:
            body["instructions"] = self.instructions
        body["input"] = self.items[: self.ends[end]]
        body["store"] = False
        body["include"] = ["reasoning.encrypted_content"]
        return body


def convert(
    messages: Sequence[Mapping[str, Any]],
    style: Style = "instructions",
    *,
    reasoning: bool = True,
) -> Conversion:
    """``messages`` (an OpenAI chat history) as Responses items, as described above
    (without ``reasoning``: no reasoning items, the rest alike)."""
    instructions: str | None = None
    items: list[Item] = []
    ends = [0]
    uses: dict[str, int] = {}
    current: dict[str, str] = {}  # a chat call id -> the call_id it was last sent as
    for position, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else _text(content)
        if role == "system":
            if position == 0 and style == "instructions":
                instructions = text
            else:
                items.append(_developer(text, style))
        elif role == "user":
            items.append(_user(text, style))
        elif role == "assistant":
            calls = [c for c in message.get("tool_calls") or () if isinstance(c, Mapping)]
            ids = []
            for call in calls:
                chat_id = str(call.get("id", ""))
                uses[chat_id] = uses.get(chat_id, 0) + 1
                current[chat_id] = chat_id if uses[chat_id] == 1 else f"{chat_id}_{uses[chat_id]}"
                ids.append(current[chat_id])
            run = _run(calls, ids, text, _seed(position, message))
            items.extend(run if reasoning else run[1:])
        elif role == "tool":
            chat_id = str(message.get("tool_call_id", ""))
            call_id = current.get(chat_id, chat_id)
            items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        ends.append(len(items))
    return Conversion(instructions, items, ends)


def _text(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(part.get("text", "")) for part in content if isinstance(part, Mapping)
    ).strip()


def _developer(text: str, style: Style) -> Item:
    if style == "instructions":
        return {"type": "message", "role": "developer", "content": text}
    return {"role": "developer", "content": text}


def _user(text: str, style: Style) -> Item:
    if style == "instructions":
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
    return {"role": "user", "content": text}


def _seed(position: int, message: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(b"%d:" % position + orjson.dumps(message)).digest()


def _run(
    calls: Sequence[Mapping[str, Any]], ids: Sequence[str], text: str, seed: bytes
) -> list[Item]:
    """The items of one assistant turn: its reasoning, its text, its calls (``ids``: their
    call ids)."""
    names = [str((c.get("function") or {}).get("name", "")) for c in calls]
    what = f"call {', '.join(names)}" if names else "answer the user"
    if names and text:
        what = f"tell the user, then {what}"
    run: list[Item] = [
        {
            "type": "reasoning",
            "id": f"rs_{seed.hex()[:48]}",
            "summary": [{"type": "summary_text", "text": f"**Next step**\n\nI {what}."}],
            "encrypted_content": _encrypted(seed),
        }
    ]
    if text:
        run.append(
            {
                "type": "message",
                "id": f"msg_{seed.hex()[8:56]}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for number, (call, call_id) in enumerate(zip(calls, ids, strict=True)):
        function = call.get("function") or {}
        run.append(
            {
                "type": "function_call",
                "id": f"fc_{seed.hex()[16:60]}{number:02d}",
                "call_id": call_id,
                "name": str(function.get("name", "")),
                "arguments": str(function.get("arguments", "")),
                "status": "completed",
            }
        )
    return run


def _encrypted(seed: bytes) -> str:
    """A deterministic stand-in for an encrypted reasoning: base64 of a Fernet-shaped
    token (version, time, IV, 32-80 bytes of ciphertext, HMAC), as the API's
    ``encrypted_content`` is."""
    size = 16 * (2 + seed[0] % 4)
    body = hashlib.shake_256(b"reasoning:" + seed).digest(16 + size + 32)
    return base64.urlsafe_b64encode(b"\x80" + _FERNET_TIME + body).decode()


# -- through the gateway -------------------------------------------------------------------


class Sends(Protocol):
    """A conversation carried from request to request (``bench.compaction.Session``)."""

    async def send_request(self, request: dict[str, Any], *, after: float) -> CompactResult: ...


@dataclass(frozen=True, slots=True)
class Sent:
    """One Responses request through the gateway: as received, the pipeline's result, and
    what went up."""

    inbound: InboundRequest
    result: CompactResult
    wire: bytes
    """The body sent up."""
    codec_ms: float = 0.0
    """The time spent in the codec: parsing, and making the request again."""

    @property
    def body(self) -> dict[str, Any]:
        """The body sent up, parsed."""
        body: dict[str, Any] = orjson.loads(self.wire)
        return body


async def send(session: Sends, raw: bytes, *, after: float) -> Sent:
    """``raw`` as the ``/v1/responses`` route sends it: parsed, compacted, made again
    (``to_request``; the bytes as received when the pipeline changed nothing). As on the
    route, ``session`` should store a removed run as the client's items
    (``Session(..., render=gateway.codecs.responses.stored_items)``)."""
    started = time.perf_counter()
    inbound = parse_request(raw)
    parsed = time.perf_counter()
    result = await session.send_request(inbound.chat, after=after)
    compacted = time.perf_counter()
    wire = orjson.dumps(to_request(result.request, inbound.native)) if result.changed else raw
    codec_ms = (parsed - started + time.perf_counter() - compacted) * 1000
    return Sent(inbound, result, wire, codec_ms)


def chat_form(body: Mapping[str, Any]) -> Messages:
    """The chat messages a Responses body stands for (``chat_messages``, without the
    messages it adds for history held upstream, which never go up, and the codec's own
    keys taken off): what its tokens and text units are counted on."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    instructions = body.get("instructions")
    messages = chat_messages(items or [], instructions if isinstance(instructions, str) else None)
    return [_plain(message) for message in messages if message.get(EXTERNAL) is not True]


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in _CODEC_KEYS}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [
            {k: v for k, v in part.items() if k != INDEX} if isinstance(part, dict) else part
            for part in content
        ]
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [{k: v for k, v in c.items() if k != INDEX} for c in calls]
    return out


# -- what must hold ------------------------------------------------------------------------


def unpaired(items: Sequence[Mapping[str, Any]]) -> list[str]:
    """What breaks the pairs of ``items``: an output whose call was not sent before it, an
    output or a call sent twice, a call never answered after it."""
    found: list[str] = []
    called: set[str] = set()
    answered: set[str] = set()
    for position, item in enumerate(items):
        kind, call_id = item.get("type"), str(item.get("call_id"))
        if kind == "function_call":
            if call_id in called:
                found.append(f"input[{position}]: call {call_id} sent twice")
            called.add(call_id)
        elif kind == "function_call_output":
            if call_id not in called:
                found.append(f"input[{position}]: output of {call_id} before any call of it")
            if call_id in answered:
                found.append(f"input[{position}]: output of {call_id} sent twice")
            answered.add(call_id)
    found += [f"call {call_id} never answered" for call_id in sorted(called - answered)]
    return found


def _identity(item: Mapping[str, Any]) -> str:
    """What names an item across requests: its ``id``, else its ``call_id``, else its
    bytes."""
    for key in ("id", "call_id"):
        value = item.get(key)
        if isinstance(value, str):
            return f"{item.get('type')}:{value}"
    return orjson.dumps(item).decode()


def _followers(items: Sequence[Mapping[str, Any]]) -> dict[bytes, str]:
    """Each reasoning item's bytes, and the identity of the item after it (past any
    further reasoning) in ``items``."""
    out: dict[bytes, str] = {}
    waiting: list[bytes] = []
    for item in items:
        if item.get("type") == "reasoning":
            waiting.append(orjson.dumps(item))
            continue
        for reasoning in waiting:
            out[reasoning] = _identity(item)
        waiting = []
    for reasoning in waiting:
        out[reasoning] = ""
    return out


def reasoning_problems(
    client: Sequence[Mapping[str, Any]], sent: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What breaks the reasoning rule: a reasoning item sent that is not byte for byte one
    the client sent, sent twice, or not immediately followed by its follower (past the
    reasoning items that also precede it); a follower sent without the reasoning that
    preceded it."""
    followers = _followers(client)
    needs: dict[str, set[bytes]] = {}
    for reasoning, follower in followers.items():
        needs.setdefault(follower, set()).add(reasoning)
    found: list[str] = []
    seen: set[bytes] = set()
    before: set[bytes] = set()  # the reasoning items right before the current item
    for position, item in enumerate(sent):
        if item.get("type") == "reasoning":
            data = orjson.dumps(item)
            if data not in followers:
                found.append(f"input[{position}]: reasoning {item.get('id')} edited or invented")
            elif data in seen:
                found.append(f"input[{position}]: reasoning {item.get('id')} sent twice")
            seen.add(data)
            before.add(data)
            nxt = next((i for i in sent[position + 1 :] if i.get("type") != "reasoning"), None)
            expected = followers.get(data)
            if expected is not None and (nxt is None or _identity(nxt) != expected):
                found.append(
                    f"input[{position}]: reasoning {item.get('id')} not followed by {expected}"
                )
            continue
        identity = _identity(item)
        missing = needs.get(identity, set()) - before
        if missing:
            found.append(f"input[{position}]: {identity} sent without its reasoning")
        before = set()
    return found


def problems(client: Mapping[str, Any], sent: Mapping[str, Any], wire: bytes) -> list[str]:
    """What breaks a rule in ``sent`` (its bytes ``wire``), the request the gateway sends
    up for the client's ``client``: pairs, reasoning, the codec's keys."""
    items = sent.get("input")
    items = items if isinstance(items, list) else []
    client_items = client.get("input")
    found = unpaired(items)
    found += reasoning_problems(client_items if isinstance(client_items, list) else [], items)
    found += [f"codec key {key} sent" for key in _CODEC_KEYS if f'"{key}"'.encode() in wire]
    return found


async def unrestorable(text: str, fetch: Callable[[str], Awaitable[bytes | None]]) -> list[str]:
    """The refs ``text`` names, and those named in what they restore, that do not
    restore."""
    pending, seen, missing = set(REF.findall(text)), set[str](), []
    while pending:
        ref = pending.pop()
        seen.add(ref)
        content = await fetch(ref)
        if content is None:
            missing.append(ref)
            continue
        pending |= set(REF.findall(content.decode(errors="replace"))) - seen
    return missing


def prefix_kept(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether ``now`` starts as ``before`` did: its instructions, then every item
    ``before`` sent, byte for byte."""
    if before.get("instructions") != now.get("instructions"):
        return False
    old, new = before.get("input") or [], now.get("input") or []
    if len(new) < len(old):
        return False
    return all(orjson.dumps(a) == orjson.dumps(b) for a, b in zip(old, new, strict=False))
