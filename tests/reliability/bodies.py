"""Hypothesis strategies for request bodies and headers a client could send the gateway:
valid-ish chat, Messages and dry-run requests, then mutated field by field (wrong types,
odd text, deep nesting, huge values, edge numbers) and byte by byte (truncation, invalid
UTF-8, duplicate keys, literals JSON does not have)."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import strategies as st

NASTY_TEXT = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "x\udc80y",
    "\u202eevil\u202c",
    "\u200b\u200c\u200d\u2060\ufeff",
    "שלום עולם مرحبا",
    "e\u0301\u0301\u0301\u0301",
    "👩‍👩‍👧‍👦🏳️‍🌈",
    "\U0010ffff\ufffe\uffff",
    "\r\n\t\x0b\x0c\x1b[31m",
    "<|endoftext|><|im_start|>system",
    "ctx_AAAAAAAAAAAAAAAAAAAAAAAA",
    "[ctx:ctx_" + "A" * 40 + "]",
    "{{}}%s%n${jndi:x}",
    "data: [DONE]\n\n",
]
MODELS = ["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5", "qwen-max", "o3", "anthropic/claude-x"]
EDGE_NUMBERS: list[Any] = [
    0,
    -0.0,
    1e308,
    -1e308,
    5e-324,
    1.7976931348623157e308,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    10**40,
    -1,
    0.1,
]
DEPTHS = [2, 64, 254, 255, 256, 257, 1_023, 1_024, 1_025, 4_000]
"""Around the codecs' limit (255, what orjson can write back) and the parser's (1,024)."""
HUGE_LENGTHS = [10_000, 200_000, 1_500_000, 4_000_000]

text = st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=60))
numbers = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)
leaves = st.one_of(st.none(), st.booleans(), numbers, text)
json_values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)


def nested(depth: int, kind: str) -> str:
    """A stand-in for a value nested ``depth`` levels deep, expanded by ``encoded`` (a
    Python structure that deep would hit the recursion limit before the gateway does)."""
    return f"\x01DEEP:{depth}:{kind}\x01"


def _expanded(match: re.Match[bytes]) -> bytes:
    depth, kind = int(match[1]), match[2]
    if kind == b"list":
        return b"[" * depth + b'"deep"' + b"]" * depth
    return b'{"a":' * depth + b'"deep"' + b"}" * depth


deep_values = st.builds(nested, st.sampled_from(DEPTHS), st.sampled_from(["list", "dict"]))
huge_strings = st.builds(
    lambda n, c: c * n, st.sampled_from(HUGE_LENGTHS), st.sampled_from("x é🙂")
)
huge_arrays = st.builds(
    lambda n, item: [item] * n,
    st.sampled_from([1_000, 50_000, 300_000]),
    st.sampled_from([0, "x", {"role": "user", "content": "hi"}, None]),
)

# -- valid-ish bodies ----------------------------------------------------------------------

image_url = st.sampled_from(
    [
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAHnOcQAAAAABJRU5ErkJggg==",
        "https://example.com/a.png",
        "data:image/png;base64,!!!not base64",
        "",
    ]
)
chat_parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": text}),
        st.fixed_dictionaries(
            {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": image_url})}
        ),
    ),
    max_size=3,
)
tool_call = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["call_1", "call_2", "", "call_\u200b"]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["lookup", "", "a" * 200]), "arguments": text}
        ),
    }
)
chat_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "function"]),
        "content": st.one_of(st.none(), text, chat_parts),
    },
    optional={
        "tool_calls": st.lists(tool_call, max_size=2),
        "tool_call_id": st.sampled_from(["call_1", "call_2", "nope"]),
        "name": text,
        "reasoning_content": text,
    },
)
function_tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["lookup", "search"])},
            optional={"parameters": json_values, "description": text},
        ),
    }
)
chat_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS), "messages": st.lists(chat_message, min_size=1, max_size=6)},
    optional={
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "max_tokens": numbers,
        "max_completion_tokens": numbers,
        "temperature": numbers,
        "n": st.integers(-1, 3),
        "tools": st.lists(function_tool, max_size=2),
        "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "reasoning_effort": st.sampled_from(["low", "medium", "high", "max"]),
        "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}]),
        "stop": st.one_of(text, st.lists(text, max_size=3)),
        "user": text,
        "metadata": st.dictionaries(text, text, max_size=3),
    },
)

anthropic_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries(
        {
            "type": st.just("image"),
            "source": st.fixed_dictionaries(
                {
                    "type": st.just("base64"),
                    "media_type": st.just("image/png"),
                    "data": st.sampled_from(["iVBORw0KGgo=", "", "%%%"]),
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": st.sampled_from(["toolu_1", "toolu_2"]),
            "name": st.just("lookup"),
            "input": json_values,
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_result"),
            "tool_use_id": st.sampled_from(["toolu_1", "toolu_2", "toolu_x"]),
            "content": st.one_of(
                text,
                st.lists(
                    st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2
                ),
            ),
        },
        optional={"is_error": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"type": st.just("thinking"), "thinking": text, "signature": st.sampled_from(["sig", ""])}
    ),
    st.fixed_dictionaries({"type": st.just("redacted_thinking"), "data": text}),
)
anthropic_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system"]),
        "content": st.one_of(text, st.lists(anthropic_block, max_size=3)),
    }
)
messages_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "max_tokens": st.one_of(st.integers(1, 4096), numbers),
        "messages": st.lists(anthropic_message, min_size=1, max_size=6),
    },
    optional={
        "system": st.one_of(
            text,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2),
        ),
        "stream": st.booleans(),
        "temperature": numbers,
        "top_k": numbers,
        "stop_sequences": st.lists(text, max_size=2),
        "thinking": st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "disabled"]), "budget_tokens": numbers}
        ),
        "tools": st.lists(
            st.fixed_dictionaries({"name": st.just("lookup"), "input_schema": json_values}),
            max_size=2,
        ),
        "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool"])}),
        "metadata": st.fixed_dictionaries({"user_id": text}),
    },
)

# -- mutations -----------------------------------------------------------------------------


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*at, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*at, index)))
    return found


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replaced(value[head], rest, new)
    return copy


def _deleted(value: Any, path: tuple[Any, ...]) -> Any:
    head, rest = path[0], path[1:]
    if rest:
        copy = dict(value) if isinstance(value, dict) else list(value)
        copy[head] = _deleted(value[head], rest)
        return copy
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != head}
    return [v for i, v in enumerate(value) if i != head]


replacements = st.one_of(
    json_values, text, numbers, deep_values, huge_strings, huge_arrays, st.just({}), st.just([])
)


@st.composite
def mutated(draw: st.DrawFn, bodies: st.SearchStrategy[dict[str, Any]]) -> Any:
    """A body from ``bodies`` with up to three fields replaced, deleted or added."""
    body: Any = draw(bodies)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(body)))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and path:
            body = _deleted(body, path)
        elif action == "add":
            key, new = draw(text), draw(replacements)
            target: Any = body
            for step in path:
                target = target[step]
            if isinstance(target, dict):
                body = _replaced(body, path, {**target, key: new})
            elif isinstance(target, list):
                body = _replaced(body, path, [*target, new])
        else:
            body = _replaced(body, path, draw(replacements))
    return body


_DEEP = re.compile(rb'"\\u0001DEEP:(\d+):(list|dict)\\u0001"')


def encoded(value: Any, ascii_only: bool) -> bytes:
    """``value`` as JSON; lone surrogates escaped (``\\ud800``) when ``ascii_only``, else
    written as the (invalid) UTF-8 bytes Python's ``surrogatepass`` makes of them."""
    text = json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)
    return _DEEP.sub(_expanded, text.encode("utf-8", "surrogatepass"))


INVALID_UTF8 = [
    b"\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xc0\xaf",
    b"\x80",
]


@st.composite
def damaged(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` broken at the byte level, or as it is."""
    how = draw(
        st.sampled_from(
            ["none", "none", "truncate", "invalid_utf8", "duplicate", "literal", "prefix", "suffix"]
        )
    )
    if how == "truncate" and raw:
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "invalid_utf8":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from(INVALID_UTF8)) + raw[at:]
    if how == "duplicate" and raw.startswith(b"{"):
        key = draw(st.sampled_from([b'"model"', b'"messages"', b'"stream"', b'"max_tokens"']))
        value = draw(st.sampled_from([b"1", b"null", b'"gpt-4o"', b"[]", b"true"]))
        return b"{" + key + b":" + value + b"," + raw[1:]
    if how == "literal":
        return raw.replace(
            b"1", draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"01"])), 1
        )
    if how == "prefix":
        return draw(st.sampled_from([b"\xef\xbb\xbf", b" \n\t", b"\x00", b"//c\n"])) + raw
    if how == "suffix":
        return raw + draw(st.sampled_from([b"}", b",", b"\x00", b" {}", b"garbage"]))
    return raw


# -- headers -------------------------------------------------------------------------------

POLICY_KEYS = [
    "mode",
    "max-input",
    "prepare",
    "light",
    "trigger",
    "emergency",
    "target",
    "tail-ratio",
    "keep-images",
    "filter-tokens",
    "compact-json",
    "soft-ratio",
    "hard-ratio",
    "block-tokens",
    "summary-model",
    "summary-timeout",
    "offload-ttl",
    "cache-markers",
    "keep_images",
    "x",
]
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=80
)
policy_values = st.one_of(
    st.sampled_from(["truncate", "off", "summarize", "?1", "?0", '"gpt-4o"', "0.6", "1e3", ""]),
    st.integers(-(10**16), 10**16).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    header_text,
).map(str.strip)
policies = st.one_of(
    st.lists(
        st.tuples(st.sampled_from(POLICY_KEYS), policy_values).map(lambda kv: f"{kv[0]}={kv[1]}"),
        max_size=4,
    ).map(", ".join),
    header_text,
)
content_types = st.sampled_from(
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/xml",
        "",
        "*/*",
    ]
)
header_names = st.from_regex(r"\A[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}\Z")
FORBIDDEN = {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade"}


@st.composite
def headers(draw: st.DrawFn) -> dict[str, bytes]:
    """A content type, maybe a policy and a conversation id, and a few random headers
    (values in Latin-1, as HTTP/1.1 carries them)."""
    out: dict[str, str] = {}
    kind = draw(content_types)
    if kind is not None:
        out["content-type"] = kind
    if draw(st.booleans()):
        out["x-contextgate-policy"] = draw(policies).strip()
    if draw(st.integers(0, 4)) == 0:
        out["x-contextgate-conversation"] = draw(header_text).strip()
    for name, value in draw(st.lists(st.tuples(header_names, header_text), max_size=3)):
        value = value.strip()  # HTTP/1.1 trims a value's edges; h11 refuses them unsent
        if name.lower() not in FORBIDDEN and name.lower() not in out:
            out[name.lower()] = value
    return {name: value.encode("latin-1") for name, value in out.items()}
