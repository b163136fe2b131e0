"""Valid Messages requests, generated (Hypothesis): alternating turns with every kind of
block in the places the API takes it, tools of every shape, the optional fields."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import strategies as st

from tests.gateway.codecs.messages.samples import EPHEMERAL

TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
NAME = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
OBJECTS = st.dictionaries(TEXT, JSON, max_size=3)
CACHE = st.sampled_from([EPHEMERAL, {"type": "ephemeral", "ttl": "1h"}])
URLS = st.sampled_from(["https://example.com/a.png", "https://example.org/b?c=d"])
CITATION = TEXT.map(
    lambda text: {
        "type": "char_location",
        "cited_text": text,
        "document_index": 0,
        "document_title": None,
        "start_char_index": 0,
        "end_char_index": len(text),
    }
)
PLAIN_TEXT = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
TEXT_BLOCK = st.fixed_dictionaries(
    {"type": st.just("text"), "text": TEXT},
    optional={"cache_control": CACHE, "citations": st.lists(CITATION, max_size=1)},
)
IMAGE = st.fixed_dictionaries(
    {
        "type": st.just("image"),
        "source": st.one_of(
            st.fixed_dictionaries(
                {
                    "type": st.just("base64"),
                    "media_type": st.sampled_from(["image/png", "image/jpeg", "image/webp"]),
                    "data": st.text(string.ascii_letters + string.digits + "+/=", min_size=1),
                }
            ),
            st.fixed_dictionaries({"type": st.just("url"), "url": URLS}),
            st.fixed_dictionaries({"type": st.just("file"), "file_id": st.just("file_01")}),
        ),
    },
    optional={
        "cache_control": CACHE,
        "transformations": st.just({"oversized_image": "downsize"}),
    },
)
DOCUMENT_BLOCK = st.fixed_dictionaries(
    {
        "type": st.just("document"),
        "source": st.one_of(
            st.fixed_dictionaries(
                {"type": st.just("text"), "media_type": st.just("text/plain"), "data": TEXT}
            ),
            st.fixed_dictionaries(
                {
                    "type": st.just("base64"),
                    "media_type": st.just("application/pdf"),
                    "data": st.just("JVBE"),
                }
            ),
        ),
    },
    optional={"title": TEXT, "cache_control": CACHE, "citations": st.just({"enabled": True})},
)
SEARCH_RESULT = st.fixed_dictionaries(
    {
        "type": st.just("search_result"),
        "source": URLS,
        "title": TEXT,
        "content": st.lists(PLAIN_TEXT, min_size=1, max_size=2),
    },
    optional={"cache_control": CACHE},
)
USER_BLOCK = st.one_of(TEXT_BLOCK, IMAGE, DOCUMENT_BLOCK, SEARCH_RESULT)
THINKING = st.one_of(
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT, "signature": TEXT}),
    st.fixed_dictionaries({"type": st.just("redacted_thinking"), "data": TEXT}),
)
SERVER_TOOL_TURN = TEXT.map(
    lambda query: [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"q": query},
        },
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_1",
            "content": [
                {
                    "type": "web_search_result",
                    "url": "https://e.com",
                    "title": query,
                    "encrypted_content": "E",
                }
            ],
        },
    ]
)


def tool_use(call_id: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": st.just(call_id), "name": NAME, "input": OBJECTS},
        optional={"cache_control": CACHE, "caller": st.just({"type": "direct"})},
    )


def tool_result(call_id: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": st.just(call_id)},
        optional={
            "content": st.one_of(st.text(max_size=12), st.lists(USER_BLOCK, max_size=3)),
            "is_error": st.booleans(),
            "cache_control": CACHE,
            "toolset_name": NAME,
        },
    )


CUSTOM_TOOL = st.fixed_dictionaries(
    {
        "name": NAME,
        "input_schema": st.builds(
            lambda names: {"type": "object", "properties": {n: {"type": "string"} for n in names}},
            st.lists(NAME, max_size=2),
        ),
    },
    optional={
        "type": st.just("custom"),
        "description": TEXT,
        "cache_control": CACHE,
        "strict": st.booleans(),
        "input_examples": st.lists(OBJECTS, max_size=1),
    },
)
SERVER_TOOL = st.sampled_from(
    [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
)
TOOL_CHOICE = st.one_of(
    st.just({"type": "none"}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any"])},
        optional={"disable_parallel_tool_use": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool"), "name": NAME},
        optional={"disable_parallel_tool_use": st.booleans()},
    ),
)
OPTIONAL_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "system": st.one_of(TEXT, st.lists(TEXT_BLOCK, min_size=1, max_size=3)),
        "tools": st.lists(st.one_of(CUSTOM_TOOL, SERVER_TOOL), min_size=1, max_size=3),
        "tool_choice": TOOL_CHOICE,
        "thinking": st.one_of(
            st.just({"type": "disabled"}),
            st.integers(1024, 4096).map(lambda n: {"type": "enabled", "budget_tokens": n}),
        ),
        "metadata": st.fixed_dictionaries({"user_id": TEXT}),
        "temperature": st.floats(0, 1),
        "top_p": st.floats(0, 1),
        "top_k": st.integers(1, 500),
        "stop_sequences": st.lists(TEXT, max_size=4),
        "cache_control": CACHE,
        "stream": st.booleans(),
        "service_tier": st.sampled_from(["auto", "standard_only"]),
        "x_future_field": JSON,
    },
)


SYSTEM_TURN = st.fixed_dictionaries(
    {"role": st.just("system")},
    optional={
        "content": st.one_of(
            TEXT,
            st.lists(
                st.one_of(
                    TEXT_BLOCK,
                    NAME.map(
                        lambda name: {
                            "type": "tool_addition",
                            "tool": {"type": "tool_reference", "name": name},
                        }
                    ),
                ),
                min_size=1,
                max_size=2,
            ),
        ),
        "clear_at": st.sampled_from(["next_user_message", "never"]),
        "output_config": st.sampled_from([{}, {"effort": "medium"}]),
    },
).filter(lambda turn: "content" in turn or "output_config" in turn)
"""A mid-conversation system message (Claude Code's instructions after the user's turn)."""


@st.composite
def messages_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Valid Messages requests: alternating turns, each answer's tool calls answered in
    the next user turn, every kind of block in the places the API takes it, and
    mid-conversation system messages after user turns."""
    turns: list[dict[str, Any]] = []
    calls: list[str] = []
    for number in range(draw(st.integers(1, 6))):
        if number % 2 == 0:
            blocks = [draw(tool_result(call)) for call in calls]
            blocks += draw(st.lists(USER_BLOCK, max_size=3))
            use_string = not calls and (not blocks or draw(st.booleans()))
            turns.append({"role": "user", "content": draw(TEXT) if use_string else blocks})
            turns += draw(st.lists(SYSTEM_TURN, max_size=2))
        else:
            blocks = draw(st.lists(THINKING, max_size=2))
            for piece in draw(
                st.lists(
                    st.one_of(
                        TEXT_BLOCK.map(lambda b: [b]), SERVER_TOOL_TURN, THINKING.map(lambda b: [b])
                    ),
                    max_size=3,
                )
            ):
                blocks += piece
            calls = [f"toolu_{number}_{k}" for k in range(draw(st.integers(0, 2)))]
            blocks += [draw(tool_use(call)) for call in calls]
            if draw(st.booleans()):
                blocks = draw(st.permutations(blocks))
            turns.append({"role": "assistant", "content": blocks or draw(TEXT)})
    request = {
        "model": draw(st.sampled_from(["claude-sonnet-4-5", "claude-opus-4-1"])),
        "max_tokens": draw(st.integers(1, 64_000)),
        "messages": turns,
    }
    return {**request, **draw(OPTIONAL_FIELDS)}
