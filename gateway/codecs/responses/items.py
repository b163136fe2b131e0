"""A Responses request's items <-> the chat messages the pipeline works on. No I/O.

Items -> messages (``chat_messages``), in order:

- ``instructions`` (a string) -> the first system message, marked as such;
- a ``message`` item (or the short form, a ``role`` and ``content`` without ``type``) of
  role ``user``, ``system`` or ``developer`` -> one chat message of that role (``system``
  for ``developer``: a developer message ranks as a system prompt in the pipeline); a
  system or developer message after the history began is a system turn
  (``pipelines.messages.SYSTEM_TURN``), kept where it stands. Its content as it is: a
  string, or its parts (``input_text`` is read as text, ``input_image`` and
  ``input_file`` as media by the pipeline);
- a run of the model's items (assistant ``message``, ``reasoning``, calls, hosted tool
  calls such as ``web_search_call``) -> one assistant message: calls (every item with a
  ``call_id`` that is not an output, and ``mcp_approval_request``) as ``tool_calls`` whose
  id is the call's pairing key, the other items as content parts in their order (a
  message's parts, a reasoning or hosted item as a part of its own type). A run that is
  one message with one plain ``output_text`` part has that text as its content, so that
  compression may shorten a long final answer;
- an output (``*_output``, ``mcp_approval_response``) -> a tool message answering its
  call by the pairing key (``call_id``; a ``local_shell_call_output``'s ``id``; an
  approval's ``approval_request_id``), its content the output: a string, or its parts;
- an item the model did not write and the pipeline need not understand (``compaction``,
  ``item_reference``, ``additional_tools``, an unknown type outside a run) -> a system
  turn whose one part is the item: pinned (never removed, edited or moved) and counted.
  An unknown item inside a run stays in the run.

Every message keeps the items it came from (``ITEMS``), verbatim, and each part and call
that came from one of them its index there (``INDEX``), so that the way back
(``response_items``) gives every item the pipeline left alone as it was sent, byte for
byte, and rebuilds only what a stage changed: a shortened text, an offloaded output, a
removed call. A reasoning item goes with the item that follows it in its run: kept,
moved or removed only with it. An output whose call the request does not hold (a request
continuing server-side state) is answered by an assistant message marked ``EXTERNAL``,
which the way back leaves out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import orjson

from pipelines.messages import CARRIED, SYSTEM_TURN

__all__ = [
    "EXTERNAL",
    "INDEX",
    "INSTRUCTIONS",
    "ITEMS",
    "StoredItems",
    "chat_messages",
    "instructions_of",
    "pairing_key",
    "response_items",
    "stored_items",
]

ITEMS: Final = CARRIED
"""The key of a chat message holding the items it came from, as they came (the
pipeline's key for what a host carries: never read, counted or keyed on)."""
INDEX: Final = "response_item"
"""The key of a content part or tool call holding the index of its item in ``ITEMS``."""
INSTRUCTIONS: Final = "response_instructions"
"""The key (``true``) of the system message that holds the request's ``instructions``."""
EXTERNAL: Final = "response_external"
"""The key (``true``) of a message standing for history held server-side (an assistant
message with the calls whose outputs the request sends, and the user turn before it):
the pipeline sees the pairs whole; it never goes up."""
OPAQUE: Final = "response_output"
"""The part type of an output the pipeline may count but never shorten."""

_HOSTED: Final = frozenset(
    {
        "reasoning",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
    }
)
"""Items the model writes that need no answer from the client: part of the model's run."""
_PINNED: Final = frozenset(
    {"compaction", "item_reference", "additional_tools", "configuration_update"}
)
"""Items that stand for history or settings: kept where they stand, never edited."""
_CALL_FIELDS: Final = {"function_call": "arguments", "custom_tool_call": "input"}
"""Calls whose payload is one string field, sent as their tool call's arguments."""
_MCP_REQUEST: Final = "mcp_approval_request"
_MCP_RESPONSE: Final = "mcp_approval_response"
_ENVELOPE_KEYS: Final = frozenset({"type", "id", "call_id", "status"})


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type (``message`` for the short form without one)."""
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message"


def is_output(item: Mapping[str, Any]) -> bool:
    kind = item_type(item)
    return kind.endswith("_output") or kind == _MCP_RESPONSE


def is_call(item: Mapping[str, Any]) -> bool:
    kind = item_type(item)
    if kind == _MCP_REQUEST:
        return True
    return not is_output(item) and kind != "message" and isinstance(item.get("call_id"), str)


def pairing_key(item: Mapping[str, Any]) -> str | None:
    """The key that pairs a call with its output: ``call_id``, a local shell output's
    ``id``, an MCP approval's request id."""
    kind = item_type(item)
    if kind == _MCP_REQUEST:
        found = item.get("id")
    elif kind == _MCP_RESPONSE:
        found = item.get("approval_request_id")
    elif kind == "local_shell_call_output":
        found = item.get("call_id", item.get("id"))
    else:
        found = item.get("call_id")
    return found if isinstance(found, str) else None


def _place(item: Mapping[str, Any]) -> str:
    """Where an item goes in the chat form, its type read once: ``run`` (one the model
    writes: an assistant message, reasoning, a call, a hosted call), ``output``,
    ``message`` (a user, system or developer message), ``pinned``, or ``other`` (an
    unknown type without a call id)."""
    kind = item.get("type")
    if not isinstance(kind, str) or kind == "message":
        return "run" if item.get("role") == "assistant" else "message"
    if kind in _HOSTED or kind == _MCP_REQUEST:
        return "run"
    if kind.endswith("_output") or kind == _MCP_RESPONSE:
        return "output"
    if kind in _PINNED:
        return "pinned"
    return "run" if isinstance(item.get("call_id"), str) else "other"


def chat_messages(
    items: Sequence[Mapping[str, Any]], instructions: str | None
) -> list[dict[str, Any]]:
    """The chat messages for a Responses request's ``instructions`` and ``input`` items
    (checked already: every item an object)."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions, INSTRUCTIONS: True})
    run: list[Mapping[str, Any]] = []
    began = False
    calls: set[str] = set()
    for item in items:
        place = _place(item)
        if (
            place == "run"
            or (place == "other" and run)
            or (place == "pinned" and any(True for _ in _keys(run)))
        ):
            # An unknown item inside a run stays there; so does a pinned one between
            # calls and their outputs, so that the outputs still follow their calls.
            run.append(item)
            continue
        if run:
            messages.append(_assistant(run))
            calls.update(_keys(run))
            run = []
        if place == "output":
            key = pairing_key(item)
            if key is not None and key not in calls:
                messages.append(_external(key))
                calls.add(key)
            messages.append(_tool(item, key))
        elif place == "message":
            messages.append(_message(item, turn=began))
        else:
            messages.append(_pinned(item))
        began = began or not (place == "message" and item.get("role") in ("system", "developer"))
    if run:
        messages.append(_assistant(run))
    opening = next((i for i, m in enumerate(messages) if m.get("role") != "system"), None)
    if opening is not None and messages[opening].get("role") != "user":
        # A history that opens with the model (or with outputs of calls held upstream):
        # the user turn the pipeline expects first, never sent, so that pair repair adds
        # none the client did not send.
        messages.insert(opening, dict(_EXTERNAL_OPENING))
    return messages


def _keys(run: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    for item in run:
        key = pairing_key(item) if is_call(item) else None
        if key is not None:
            yield key


def _message(item: Mapping[str, Any], *, turn: bool) -> dict[str, Any]:
    role = item.get("role")
    system = role in ("system", "developer")
    message: dict[str, Any] = {
        "role": "system" if system else role,
        "content": _content_in(item.get("content")),
        ITEMS: [item],
    }
    if system and turn:
        message[SYSTEM_TURN] = True
    return message


def _content_in(content: Any) -> Any:
    """A message's or output's content for the pipeline: a string as it is, parts as
    copies (the pipeline never mutates them, but the way back compares them)."""
    if isinstance(content, list):
        return [dict(part) if isinstance(part, Mapping) else part for part in content]
    return content


def _tool(item: Mapping[str, Any], key: str | None) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": key or "", "content": _output_of(item), ITEMS: [item]}


def _output_of(item: Mapping[str, Any]) -> Any:
    """An output item's content for the pipeline: its ``output`` when that is text or
    content parts (the filter reads ``input_text`` parts as text); else one opaque part
    that no stage shortens, since no preview would be a valid value of the field: a
    computer screenshot (counted as an image), or what the item carries (a shell's
    results, a tool search's tools; counted as its JSON)."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, list) and not _structured(output):
        return _content_in(output)
    if isinstance(output, Mapping) and output.get("type") == "computer_screenshot":
        return [dict(output)]
    return [{"type": OPAQUE, "value": _payload(item)}]


def _structured(output: Any) -> bool:
    """Whether ``output`` is a list of something other than content parts (a shell's
    results)."""
    return isinstance(output, list) and any(
        not isinstance(part, Mapping) or not isinstance(part.get("type"), str) for part in output
    )


_EXTERNAL_OPENING: Final = {
    "role": "user",
    "content": "(The conversation so far is held by the upstream.)",
    EXTERNAL: True,
}
"""Before a history that does not open with a user turn (it opens with the model, or
with outputs of calls the upstream holds): the user turn the pipeline expects to open a
history (pair repair would otherwise add one); never sent."""


def _external(key: str) -> dict[str, Any]:
    call = {"id": key, "type": "function", "function": {"name": "external", "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call], EXTERNAL: True}


def _pinned(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": "system", "content": [dict(item)], SYSTEM_TURN: True, ITEMS: [item]}


def _assistant(run: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    for index, item in enumerate(run):
        kind = item_type(item)
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "output_text", "text": content}]
            parts.extend(
                {**part, INDEX: index} if isinstance(part, Mapping) else part
                for part in (content if isinstance(content, list) else ())
            )
        elif is_call(item):
            name, arguments = _call_of(item)
            key = pairing_key(item) or ""
            function = {"name": name, "arguments": arguments}
            calls.append({"id": key, "type": "function", "function": function, INDEX: index})
        else:
            parts.append({**item, INDEX: index})
    message: dict[str, Any] = {"role": "assistant", "content": _plain(run, parts)}
    if calls:
        message["tool_calls"] = calls
    message[ITEMS] = list(run)
    return message


def _plain(run: Sequence[Mapping[str, Any]], parts: list[Any]) -> Any:
    """A run's content: one plain answer's text as a string, else its parts (``None``
    when it has none: calls only)."""
    if len(run) == 1 and len(parts) == 1 and isinstance(parts[0], dict):
        part = parts[0]
        plain = not part.get("annotations") and not part.get("logprobs")
        if part.get("type") == "output_text" and plain and isinstance(part.get("text"), str):
            return part["text"]
    return parts or None


def _call_of(item: Mapping[str, Any]) -> tuple[str, str]:
    """A call's tool name and its payload as a string."""
    kind = item_type(item)
    field = _CALL_FIELDS.get(kind)
    name = item.get("name")
    if field is not None or kind == _MCP_REQUEST:
        value = item.get(field or "arguments")
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        return (name if isinstance(name, str) else kind), text
    return kind, orjson.dumps(_payload(item)).decode()


def _payload(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _ENVELOPE_KEYS}


def instructions_of(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The ``instructions`` the messages carry, if any."""
    for message in messages:
        if message.get(INSTRUCTIONS) is True:
            content = message.get("content")
            return content if isinstance(content, str) else _text_of(content)
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else ()
    return "\n".join(
        part["text"]
        for part in parts
        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
    )


# -- the way back -------------------------------------------------------------------------


def stored_items(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """A run of removed messages as their items' JSON (``StoredItems``, without its
    memory: for a caller that renders once)."""
    return orjson.dumps(response_items(messages))


class StoredItems:
    """How one request's removed runs are stored behind a ref (``pipelines.ports.
    Rendering``): the JSON of the items they came from, so that a restore gives the
    client its own items. Compression stores a run for each cut it weighs, the same
    messages again and again: each message's items are made once per request."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[int, tuple[Mapping[str, Any], bytes]] = {}

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> bytes:
        kinds: dict[str, str] | None = None
        pieces = []
        for message in messages:
            found = self._made.get(id(message))
            if found is not None and found[0] is message:
                piece = found[1]
            else:
                if kinds is None:
                    kinds = _call_kinds(messages)
                piece = orjson.dumps(_items_of(message, kinds))[1:-1]
                if message.get(ITEMS) is not None and message.get("role") != "tool":
                    self._made[id(message)] = (message, piece)
            if piece:
                pieces.append(piece)
        return b"[" + b",".join(pieces) + b"]"


def response_items(
    messages: Sequence[Mapping[str, Any]], parsed: Sequence[Mapping[str, Any]] = ()
) -> list[Any]:
    """The Responses ``input`` for the pipeline's chat messages: each item the pipeline
    left alone as it came, what a stage changed or added in the Responses form.
    ``parsed``: the messages ``chat_messages`` made of the request; one the pipeline
    passed on as it was (the same object: stages never edit a message in place) gives
    its items at once."""
    originals = {id(message): message for message in parsed}
    kinds: dict[str, str] | None = None
    out: list[Any] = []
    for message in messages:
        if originals.get(id(message)) is message:
            out.extend(_verbatim(message))
            continue
        if kinds is None:
            kinds = _call_kinds(messages)
        out.extend(_items_of(message, kinds))
    return out


def _verbatim(message: Mapping[str, Any]) -> list[Any]:
    """The items of a message as ``chat_messages`` made it."""
    if message.get(INSTRUCTIONS) is True or message.get(EXTERNAL) is True:
        return []
    items = message.get(ITEMS)
    return items if isinstance(items, list) else []


def _items_of(message: Mapping[str, Any], kinds: Mapping[str, str]) -> list[Any]:
    """One chat message's items (``kinds``: each call's item type, by its key)."""
    if message.get(INSTRUCTIONS) is True or message.get(EXTERNAL) is True:
        return []
    items = message.get(ITEMS)
    role = message.get("role")
    if role == "assistant":
        return _run_back(message, items if isinstance(items, list) else [])
    if role == "tool":
        made = _tool_back(message, items[0] if items else None, kinds)
        return [made] if made is not None else []
    if items and not _message_like(items[0]):
        return [items[0]]  # pinned: as it came
    return [_message_back(message, items[0] if items else None)]


def _message_like(item: Any) -> bool:
    return isinstance(item, Mapping) and item_type(item) == "message"


def _call_kinds(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The item type of each call, by its pairing key."""
    kinds: dict[str, str] = {}
    for message in messages:
        for item in message.get(ITEMS) or ():
            if isinstance(item, Mapping) and is_call(item):
                key = pairing_key(item)
                if key is not None:
                    kinds[key] = item_type(item)
    return kinds


def _message_back(message: Mapping[str, Any], item: Mapping[str, Any] | None) -> dict[str, Any]:
    content = message.get("content")
    if item is not None:
        if content == item.get("content"):
            return dict(item)
        return {**item, "content": _parts_back(content, "input_text", item.get("content"))}
    role = message.get("role")
    role = role if role in ("user", "system", "developer") else "user"
    return {"type": "message", "role": role, "content": _parts_back(content, "input_text", None)}


def _parts_back(content: Any, text_type: str, original: Any) -> Any:
    """Chat content in a Responses message: a string stays one when the original was one
    (or there was none), else parts; the pipeline's ``text`` parts become ``text_type``."""
    if isinstance(content, str):
        if original is None or isinstance(original, str):
            return content
        return [_text_part(content, text_type)]
    parts = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(_text_part(str(part.get("text", "")), text_type))
        elif isinstance(part, Mapping):
            parts.append({k: v for k, v in part.items() if k not in (INDEX, "cache_control")})
    return parts


def _text_part(text: str, text_type: str) -> dict[str, Any]:
    if text_type == "output_text":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": text_type, "text": text}


def _tool_back(
    message: Mapping[str, Any], item: Mapping[str, Any] | None, kinds: Mapping[str, str]
) -> dict[str, Any] | None:
    content = message.get("content")
    if item is not None:
        output = item.get("output")
        if content == _output_of(item) or not isinstance(output, (str, list)):
            return dict(item)  # unchanged, or an opaque output (no stage shortens those)
        if _structured(output):
            return dict(item)
        return {**item, "output": _parts_back(content, "input_text", output)}
    key = str(message.get("tool_call_id", ""))
    text = content if isinstance(content, str) else _text_of(content)
    return _made_output(kinds.get(key, "function_call"), key, text)


def _made_output(kind: str, key: str, text: str) -> dict[str, Any] | None:
    """An output the pipeline made for a call left without one (pair repair's
    "interrupted" result), in the form the call's kind takes; ``None`` for a call no made
    up output may answer (a computer call wants a screenshot, an MCP approval the user's
    decision, an unknown kind an unknown shape): it goes up unanswered, as the client
    sent it."""
    if kind == "function_call":
        return {"type": "function_call_output", "call_id": key, "output": text}
    if kind == "custom_tool_call":
        return {"type": "custom_tool_call_output", "call_id": key, "output": text}
    if kind == "local_shell_call":
        return {"type": "local_shell_call_output", "id": key, "output": text}
    if kind == "shell_call":
        outcome = {"type": "exit", "exit_code": 1}
        result = {"stdout": "", "stderr": text, "outcome": outcome}
        return {"type": "shell_call_output", "call_id": key, "output": [result]}
    if kind == "apply_patch_call":
        return {
            "type": "apply_patch_call_output",
            "call_id": key,
            "status": "failed",
            "output": text,
        }
    return None


def _run_back(message: Mapping[str, Any], run: list[Any]) -> list[Any]:
    """An assistant message's items: those of its run that survived, in their order,
    each as it came unless a stage changed it; what a stage added, as new items."""
    content = message.get("content")
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    slots: dict[int, list[Any]] = {}
    loose: list[Any] = []
    if isinstance(content, str):
        only = _single_message(run)
        if only is not None and content:
            slots[only] = [_answer_part(run[only], content)]
        elif content:
            loose.append(_text_part(content, "output_text"))
    elif isinstance(content, list):
        for part in content:
            index = part.get(INDEX) if isinstance(part, Mapping) else None
            if isinstance(index, int) and 0 <= index < len(run):
                slots.setdefault(index, []).append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                target = _last_message_slot(slots, run)
                text = _text_part(str(part.get("text", "")), "output_text")
                (slots.setdefault(target, []) if target is not None else loose).append(text)
            else:
                loose.append(part)
    new_calls: list[dict[str, Any]] = []
    for call in calls:
        index = call.get(INDEX) if isinstance(call, Mapping) else None
        if isinstance(index, int) and 0 <= index < len(run):
            slots.setdefault(index, []).append(call)
        elif isinstance(call, Mapping):
            new_calls.append(dict(call))
    for index, item in enumerate(run):
        if _message_like(item) and not item.get("content"):
            slots.setdefault(index, [])  # an empty answer: nothing a stage could take
    kept = _with_reasoning(run, slots)
    out: list[Any] = []
    if loose:
        out.append(_new_answer(loose))
    out.extend(_item_back(run[index], slots.get(index, [])) for index in kept)
    out.extend(_new_call(call) for call in new_calls)
    return out


def _answer_part(item: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The one ``output_text`` part of a plain answer whose text is ``text``: as it came
    when the text is unchanged."""
    content = item.get("content")
    part = content[0] if isinstance(content, list) and content else None
    if not isinstance(part, Mapping):
        return _text_part(text, "output_text")
    if part.get("text") == text:
        return dict(part)
    return {**{k: v for k, v in part.items() if k != "logprobs"}, "text": text, "annotations": []}


def _single_message(run: Sequence[Any]) -> int | None:
    indices = [i for i, item in enumerate(run) if _message_like(item)]
    return indices[0] if len(indices) == 1 else None


def _last_message_slot(slots: Mapping[int, list[Any]], run: Sequence[Any]) -> int | None:
    found = [i for i in slots if _message_like(run[i])]
    return max(found) if found else _single_message(run)


def _with_reasoning(run: Sequence[Any], slots: Mapping[int, list[Any]]) -> list[int]:
    """The indices of the run's items to send: each that survived, and each reasoning
    item whose part survived only when the item after it (its reason) did too."""
    kept: list[int] = []
    for index in range(len(run)):
        if index not in slots:
            continue
        if item_type(run[index]) == "reasoning":
            follower = next(
                (i for i in range(index + 1, len(run)) if item_type(run[i]) != "reasoning"),
                None,
            )
            if follower is not None and follower not in slots:
                continue
        kept.append(index)
    return kept


def _item_back(item: Mapping[str, Any], found: list[Any]) -> Any:
    """One item of a run again, from what of it survived."""
    kind = item_type(item)
    if kind == "message":
        original = item.get("content")
        parts = [
            {k: v for k, v in part.items() if k != INDEX} if isinstance(part, Mapping) else part
            for part in found
        ]
        same_text = (
            isinstance(original, str) and len(parts) == 1 and parts[0].get("text") == original
        )
        if same_text or parts == original or (not parts and not original):
            return dict(item)
        return {**item, "content": _unchanged_parts(parts, original)}
    if is_call(item):
        call = found[0]
        arguments = _call_of(item)[1]
        now = call.get("function", {}).get("arguments") if isinstance(call, Mapping) else None
        if not isinstance(now, str) or now == arguments:
            return dict(item)
        field = _CALL_FIELDS.get(kind) or ("arguments" if kind == _MCP_REQUEST else None)
        if field is not None:
            return {**item, field: now}
        try:
            payload = orjson.loads(now)
        except orjson.JSONDecodeError:
            return dict(item)
        if not isinstance(payload, dict) or not _same_shape(payload, _payload(item)):
            return dict(item)  # cut where the item's schema allows no cut: as it came
        return {**item, **payload}
    return dict(item)  # reasoning, hosted or unknown: never edited


def _same_shape(now: Any, was: Any) -> bool:
    """Whether ``now`` has ``was``'s structure: the same keys and the same kinds of value
    all the way down, lists no longer; strings may differ (a cut string is still one)."""
    if isinstance(was, dict):
        return (
            isinstance(now, dict)
            and now.keys() == was.keys()
            and all(_same_shape(now[key], was[key]) for key in was)
        )
    if isinstance(was, list):
        return (
            isinstance(now, list)
            and len(now) == len(was)
            and all(_same_shape(a, b) for a, b in zip(now, was, strict=True))
        )
    return type(now) is type(was)


def _unchanged_parts(parts: list[Any], original: Any) -> list[Any]:
    """A message's surviving parts: each as sent when it is; a text that changed loses
    the annotations (positions in it) it had."""
    sent = original if isinstance(original, list) else []
    out = []
    for part in parts:
        if part in sent or not isinstance(part, Mapping):
            out.append(part)
        elif part.get("type") == "output_text":
            out.append({**part, "annotations": []} if part.get("annotations") else part)
        else:
            out.append(part)
    return out


def _new_answer(parts: list[Any]) -> dict[str, Any]:
    content = [
        {k: v for k, v in part.items() if k != INDEX} if isinstance(part, Mapping) else part
        for part in parts
    ]
    return {"type": "message", "role": "assistant", "content": content}


def _new_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    return {
        "type": "function_call",
        "call_id": str(call.get("id", "")),
        "name": str(function.get("name", "")),
        "arguments": str(function.get("arguments", "")),
    }
