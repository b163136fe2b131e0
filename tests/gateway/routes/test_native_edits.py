"""Anthropic's ``context_management.edits`` through real sockets, the official SDKs as
clients: polyfilled by the gateway for OpenAI-compatible models (on ``/v1/messages`` and
``/v1/chat/completions``; what is cleared restorable through its ref, ``applied_edits`` in
the answer as Anthropic's), honoured by Anthropic for Claude (sent up as written, the
gateway's own tool-output filter stepping back)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from anthropic.types.beta import (
    BetaClearThinking20251015EditResponse,
    BetaClearToolUses20250919EditResponse,
)

from pipelines.cache_break import without_markers
from tests.harness import GatewayServer
from tests.mock_models import ChatModel
from tests.mock_upstream import JSONReply, MockUpstream, Received

BETA = "context-management-2025-06-27"
KEY = "sk-ant-mine"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
CLEAR_4_KEEP_1: Any = {
    "edits": [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 1},
        }
    ]
}
READ = {
    "name": "read",
    "description": "Read a log file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
READ_FUNCTION = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a log file.",
        "parameters": READ["input_schema"],
    },
}
ANSWER: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "Found it."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 20, "output_tokens": 3},
}


def output(i: int) -> str:
    """A log file's content, about 600 tokens, different for each ``i`` (non-ASCII too)."""
    lines = "".join(f"  line {i}.{j}: status ok — latency {j * 37} ms\n" for j in range(60))
    return f"logs/{i}.txt\n{lines}"


def tool_history(pairs: int = 4) -> list[Any]:
    """A Messages history of ``pairs`` tool_use/tool_result pairs, the last result
    followed by the user's question."""
    messages: list[Any] = [{"role": "user", "content": "Why did the deploy fail?"}]
    for i in range(pairs):
        use = {"type": "tool_use", "id": f"toolu_{i:02d}", "name": "read"}
        messages.append({"role": "assistant", "content": [{**use, "input": {"path": f"{i}.txt"}}]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i:02d}", "content": output(i)}
        messages.append({"role": "user", "content": [result]})
    messages[-1]["content"].append({"type": "text", "text": "What did you find?"})
    return messages


def chat_history(pairs: int = 4) -> list[Any]:
    """The same history in chat completions' form."""
    messages: list[Any] = [{"role": "user", "content": "Why did the deploy fail?"}]
    for i in range(pairs):
        arguments = orjson.dumps({"path": f"{i}.txt"}).decode()
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output(i)})
    messages.append({"role": "user", "content": "What did you find?"})
    return messages


@pytest.fixture
def gateway(anthropic_gateway: GatewayServer) -> GatewayServer:
    return anthropic_gateway


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def chat_model(upstream: MockUpstream) -> ChatModel:
    """An OpenAI-compatible model behind the mock that refuses a broken tool pairing."""
    model = ChatModel()
    upstream.handler = model
    return model


def sent_chat(upstream: MockUpstream) -> dict[str, Any]:
    """The last chat completions request the upstream got."""
    chats = [r for r in upstream.received if r.path == "/v1/chat/completions"]
    assert chats, "nothing reached the upstream"
    body: dict[str, Any] = chats[-1].json()
    return body


def tool_contents(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def restored(gateway: GatewayServer, ref: str, key: str = KEY) -> httpx.Response:
    return httpx.get(f"{gateway.base_url}/context/objects/{ref}", headers={"x-api-key": key})


def assert_cleared_and_restorable(
    gateway: GatewayServer, body: dict[str, Any], cleared: int, total: int = 4
) -> None:
    """The first ``cleared`` of the ``total`` tool results went up as placeholders, each
    naming a ref that gives back the original to the same caller only; the others went
    as they were."""
    contents = tool_contents(body)
    assert len(contents) == total
    for i, content in enumerate(contents[:cleared]):
        assert output(i) not in content
        assert content.startswith("[Tool result of read cleared to save context")
        found = REF.search(content)
        assert found is not None
        got = restored(gateway, found.group())
        assert got.status_code == 200
        assert got.content == output(i).encode()
        assert restored(gateway, found.group(), key="sk-ant-someone-else").status_code == 404
    assert contents[cleared:] == [output(i) for i in range(cleared, total)]


# -- /v1/messages to an OpenAI-compatible model: the gateway applies the edits ------------


def test_messages_polyfill_clears_old_tool_results_and_reports_it(
    client: anthropic.Anthropic,
    gateway: GatewayServer,
    upstream: MockUpstream,
    chat_model: ChatModel,
) -> None:
    """Over its tool-use trigger, the oldest 3 of 4 results go up as placeholders naming
    refs that restore them; the field does not go up; the answer reports the edit as
    Anthropic's would, typed by the SDK."""
    message = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=300,
        betas=[BETA],
        context_management=CLEAR_4_KEEP_1,
        tools=[READ],  # type: ignore[list-item]
        messages=tool_history(),
    )
    assert message.context_management is not None
    (edit,) = message.context_management.applied_edits
    assert isinstance(edit, BetaClearToolUses20250919EditResponse)
    assert edit.type == "clear_tool_uses_20250919"
    assert edit.cleared_tool_uses == 3
    assert edit.cleared_input_tokens > 1_000
    assert message.content[0].type == "text"
    body = sent_chat(upstream)
    assert "context_management" not in body
    assert chat_model.refusals == []
    assert_cleared_and_restorable(gateway, body, cleared=3)


def test_messages_polyfill_streamed_reports_in_message_delta(
    client: anthropic.Anthropic,
    gateway: GatewayServer,
    upstream: MockUpstream,
    chat_model: ChatModel,
) -> None:
    """Streamed, the message_delta event carries context_management, and the SDK's final
    message has it; the upstream got the same cleared request."""
    with client.beta.messages.stream(
        model="gpt-4o",
        max_tokens=300,
        betas=[BETA],
        context_management=CLEAR_4_KEEP_1,
        tools=[READ],  # type: ignore[list-item]
        messages=tool_history(),
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e for e in events if e.type == "message_delta"]
    assert len(deltas) == 1
    delta = deltas[0]
    assert delta.context_management is not None
    (edit,) = delta.context_management.applied_edits
    assert isinstance(edit, BetaClearToolUses20250919EditResponse)
    assert edit.cleared_tool_uses == 3
    assert edit.cleared_input_tokens > 1_000
    assert final.context_management == delta.context_management
    assert all(getattr(e, "context_management", None) is None for e in events if e is not delta)
    body = sent_chat(upstream)
    assert body["stream"] is True
    assert "context_management" not in body
    assert_cleared_and_restorable(gateway, body, cleared=3)


def test_messages_polyfill_streamed_raw_create(
    client: anthropic.Anthropic, upstream: MockUpstream, chat_model: ChatModel
) -> None:
    """``create(stream=True)`` yields the same message_delta with the applied edit."""
    stream = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=300,
        betas=[BETA],
        context_management=CLEAR_4_KEEP_1,
        messages=tool_history(),
        stream=True,
    )
    deltas = [e for e in stream if e.type == "message_delta"]
    assert len(deltas) == 1
    assert deltas[0].context_management is not None
    (edit,) = deltas[0].context_management.applied_edits
    assert isinstance(edit, BetaClearToolUses20250919EditResponse)
    assert edit.cleared_tool_uses == 3


def test_messages_polyfill_under_its_trigger_reports_nothing(
    client: anthropic.Anthropic, upstream: MockUpstream, chat_model: ChatModel
) -> None:
    """Under its trigger nothing is cleared, and the answer has no applied edits."""
    management: Any = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    message = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=300,
        betas=[BETA],
        context_management=management,
        messages=tool_history(),
    )
    assert message.context_management is None
    body = sent_chat(upstream)
    assert tool_contents(body) == [output(i) for i in range(4)]
    assert "context_management" not in body


def thinking_history(turns: int) -> list[Any]:
    """A Messages history whose ``turns`` assistant turns each begin with thinking."""
    messages: list[Any] = [{"role": "user", "content": "Plan the migration."}]
    for i in range(turns):
        thinking = {
            "type": "thinking",
            "thinking": f"Weighing step {i}. " * 40,
            "signature": f"sig{i}",
        }
        messages.append(
            {"role": "assistant", "content": [thinking, {"type": "text", "text": f"Step {i}."}]}
        )
        messages.append({"role": "user", "content": f"And after step {i}?"})
    return messages


def test_messages_polyfill_clear_thinking_is_reported(
    client: anthropic.Anthropic, upstream: MockUpstream, chat_model: ChatModel
) -> None:
    """clear_thinking on an OpenAI-compatible model: the thinking of all but the latest
    kept turn is dropped and the answer reports how many turns lost it."""
    management: Any = {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
        ]
    }
    message = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=300,
        betas=[BETA],
        context_management=management,
        messages=thinking_history(3),
    )
    assert message.context_management is not None
    (edit,) = message.context_management.applied_edits
    assert isinstance(edit, BetaClearThinking20251015EditResponse)
    assert edit.type == "clear_thinking_20251015"
    assert edit.cleared_thinking_turns == 2
    assert edit.cleared_input_tokens > 0
    body = sent_chat(upstream)
    assert "context_management" not in body
    assert b"Weighing step 0" not in orjson.dumps(body)


def test_an_invalid_edit_on_the_polyfill_path_is_anthropics_400(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """An edit the API would refuse is refused by the gateway in Anthropic's envelope,
    naming the field; nothing goes upstream."""
    management: Any = {
        "edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.beta.messages.create(
            model="gpt-4o",
            max_tokens=300,
            betas=[BETA],
            context_management=management,
            messages=tool_history(),
        )
    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "context_management.edits.0.keep.value" in body["error"]["message"]
    assert upstream.received == []


@pytest.mark.parametrize(
    "management",
    [
        {"edits": [{"type": "clear_everything"}]},
        {"edits": "clear"},
        {"edits": [{"type": "clear_tool_uses_20250919", "trigger": 3}]},
    ],
)
def test_malformed_context_management_is_a_400_never_a_500(
    gateway: GatewayServer, upstream: MockUpstream, management: Any
) -> None:
    """Any malformed context_management on the polyfill path is a 400 naming the field,
    streamed or not, and when only counting tokens."""
    for path, stream in (("", False), ("", True), ("/count_tokens", False)):
        request = {
            "model": "gpt-4o",
            "messages": tool_history(),
            "context_management": management,
        }
        if not path:
            request |= {"max_tokens": 100, "stream": stream}
        response = httpx.post(
            f"{gateway.url}/v1/messages{path}",
            json=request,
            headers={"x-api-key": KEY, "anthropic-beta": BETA},
            timeout=30,
        )
        assert response.status_code == 400, response.text
        error = response.json()
        assert error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
        assert "context_management" in error["error"]["message"]
    assert upstream.received == []


def test_count_tokens_on_the_polyfill_path_reports_the_original_count(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """count_tokens for an OpenAI-compatible model counts the request after the edits and
    reports the count before them, as Anthropic's count does; no upstream is asked."""
    counted = client.beta.messages.count_tokens(
        model="gpt-4o",
        betas=[BETA],
        context_management=CLEAR_4_KEEP_1,
        messages=tool_history(),
    )
    assert counted.context_management is not None
    original = counted.context_management.original_input_tokens
    assert original > counted.input_tokens + 1_000
    assert upstream.received == []


def test_original_input_tokens_is_the_count_without_the_edits(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """original_input_tokens is what count_tokens says of the same request without
    context_management."""
    counted = client.beta.messages.count_tokens(
        model="gpt-4o",
        betas=[BETA],
        context_management=CLEAR_4_KEEP_1,
        messages=tool_history(),
    )
    plain = client.beta.messages.count_tokens(model="gpt-4o", betas=[BETA], messages=tool_history())
    assert plain.context_management is None
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == plain.input_tokens


# -- /v1/chat/completions: the chat API has no such field; the gateway applies it ----------


def test_chat_polyfill_reports_applied_edits_at_the_top_level(
    gateway: GatewayServer, upstream: MockUpstream, chat_model: ChatModel
) -> None:
    """The chat route applies the edits; the completion carries
    ``context_management.applied_edits``; the upstream got no such field, and 3
    placeholders whose refs restore the results."""
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as sdk:
        completion = sdk.chat.completions.create(
            model="gpt-4o",
            messages=chat_history(),
            tools=[READ_FUNCTION],  # type: ignore[list-item]
            extra_body={"context_management": CLEAR_4_KEEP_1},
        )
    extra = completion.model_extra or {}
    (edit,) = extra["context_management"]["applied_edits"]
    assert edit["type"] == "clear_tool_uses_20250919"
    assert edit["cleared_tool_uses"] == 3
    assert edit["cleared_input_tokens"] > 1_000
    assert completion.choices[0].message.content
    body = sent_chat(upstream)
    assert "context_management" not in body
    assert chat_model.refusals == []
    assert_cleared_and_restorable(gateway, body, cleared=3)


def test_chat_polyfill_streamed_ends_with_a_chunk_carrying_the_edits(
    gateway: GatewayServer, upstream: MockUpstream, chat_model: ChatModel
) -> None:
    """Streamed, a last chunk (no choices) before [DONE] carries the applied edits; the
    SDK reads it like any other chunk."""
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as sdk:
        chunks = list(
            sdk.chat.completions.create(
                model="gpt-4o",
                messages=chat_history(),
                stream=True,
                extra_body={"context_management": CLEAR_4_KEEP_1},
            )
        )
    last = chunks[-1]
    assert last.choices == []
    assert (last.model_extra or {})["context_management"]["applied_edits"][0][
        "cleared_tool_uses"
    ] == 3
    assert last.id == chunks[0].id
    assert all("context_management" not in (c.model_extra or {}) for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1] if c.choices)
    request = {
        "model": "gpt-4o",
        "messages": chat_history(),
        "stream": True,
        "context_management": CLEAR_4_KEEP_1,
    }
    with httpx.stream(
        "POST", f"{gateway.base_url}/chat/completions", json=request, headers={"x-api-key": KEY}
    ) as raw:
        events = [e for e in raw.read().split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]"
    carried = orjson.loads(events[-2].removeprefix(b"data: "))
    assert carried["object"] == "chat.completion.chunk"
    assert carried["choices"] == []
    assert carried["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 3
    assert "context_management" not in sent_chat(upstream)


def test_chat_invalid_edit_is_an_openai_400_naming_the_field(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """On the chat route an invalid edit is a 400 in OpenAI's envelope whose param names
    the field."""
    management = {
        "edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]
    }
    with (
        openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as sdk,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        sdk.chat.completions.create(
            model="gpt-4o", messages=chat_history(), extra_body={"context_management": management}
        )
    assert caught.value.status_code == 400
    assert caught.value.param == "context_management.edits.0.keep.value"
    request = {
        "model": "gpt-4o",
        "messages": chat_history(),
        "stream": True,
        "context_management": management,
    }
    streamed = httpx.post(
        f"{gateway.base_url}/chat/completions", json=request, headers={"x-api-key": KEY}
    )
    assert streamed.status_code == 400
    assert streamed.json()["error"]["param"] == "context_management.edits.0.keep.value"
    assert upstream.received == []


def test_the_dry_run_reports_the_polyfill(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """The dry run of a chat body with context_management reports the plan (polyfill, why)
    and the edits applied, and shows the request as it would go: cleared, without the
    field; no upstream is called."""
    request = {"model": "gpt-4o", "messages": chat_history(), "context_management": CLEAR_4_KEEP_1}
    response = httpx.post(
        f"{gateway.base_url}/context/compact", json=request, headers={"x-api-key": KEY}
    )
    assert response.status_code == 200, response.text
    payload = response.json()
    native = payload["report"]["native"]
    assert native["mode"] == "polyfill"
    assert native["edits"] == ["clear_tool_uses_20250919"]
    assert isinstance(native["reason"], str)
    assert native["reason"]
    (edit,) = native["applied_edits"]
    assert (edit["type"], edit["cleared_tool_uses"]) == ("clear_tool_uses_20250919", 3)
    assert "native_edits" in payload["report"]["actions"]
    assert "context_management" not in payload["request"]
    assert_cleared_and_restorable(gateway, payload["request"], cleared=3)
    assert upstream.received == []


def test_the_dry_run_without_context_management_has_no_native_report(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Without the field the report's native is null and nothing is cleared."""
    request = {"model": "gpt-4o", "messages": chat_history()}
    payload = httpx.post(f"{gateway.base_url}/context/compact", json=request).json()
    assert payload["report"]["native"] is None
    assert tool_contents(payload["request"]) == [output(i) for i in range(4)]


def test_policy_native_off_ignores_the_edits(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """With the policy's native=off nothing is cleared and nothing is reported."""
    request = {"model": "gpt-4o", "messages": chat_history(), "context_management": CLEAR_4_KEEP_1}
    payload = httpx.post(
        f"{gateway.base_url}/context/compact",
        json=request,
        headers={"x-contextgate-policy": "native=off"},
    ).json()
    assert payload["report"]["native"] is None
    assert tool_contents(payload["request"]) == [output(i) for i in range(4)]


# -- /v1/messages to Claude: Anthropic applies the edits ------------------------------------


def big_output() -> str:
    """A tool output far over the filter's 5,000 tokens."""
    return "".join(
        f"{i:05d} booking BK{i:06d} status=confirmed seat {i % 40}A\n" for i in range(3_000)
    )


def honour_history() -> list[Any]:
    use = {"type": "tool_use", "id": "toolu_01", "name": "read", "input": {"path": "bookings"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": big_output()}
    return [
        {"role": "user", "content": "Export the bookings."},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result, {"type": "text", "text": "How many?"}]},
    ]


def claude_answer(received: Received) -> JSONReply | None:
    if received.path == "/v1/messages":
        return JSONReply(ANSWER)
    return None


def test_claude_gets_the_edits_as_sent_and_the_filter_steps_back(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """To Claude the request goes up with context_management exactly as the client wrote
    it and the big tool output unfiltered (Anthropic clears tool uses itself); the same
    request without context_management has the output filtered by the gateway."""
    upstream.handler = claude_answer
    management: Any = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 30_000},
                "keep": {"type": "tool_uses", "value": 1},
                "exclude_tools": ["memory"],
            }
        ]
    }
    with anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as sdk:
        honoured = sdk.beta.messages.with_raw_response.create(
            model="claude-sonnet-4-6",
            max_tokens=300,
            betas=[BETA],
            context_management=management,
            tools=[READ],  # type: ignore[list-item]
            messages=honour_history(),
        )
        filtered = sdk.beta.messages.with_raw_response.create(
            model="claude-sonnet-4-6",
            max_tokens=300,
            betas=[BETA],
            tools=[READ],  # type: ignore[list-item]
            messages=honour_history(),
        )
    assert honoured.parse().content[0].type == "text"
    first, second = (r.json() for r in upstream.received if r.path == "/v1/messages")
    assert first["context_management"] == management
    assert BETA in upstream.received[0].headers["anthropic-beta"]
    (result,) = [b for b in first["messages"][2]["content"] if b["type"] == "tool_result"]
    assert without_markers(result)["content"] == big_output()
    assert "filter" not in honoured.headers["x-contextgate-actions"]
    assert "native_edits" not in honoured.headers["x-contextgate-actions"]
    assert "context_management" not in second
    (result,) = [b for b in second["messages"][2]["content"] if b["type"] == "tool_result"]
    assert big_output() not in orjson.dumps(result).decode()
    assert REF.search(orjson.dumps(result).decode())
    assert "filter" in filtered.headers["x-contextgate-actions"]


def test_claudes_applied_edits_come_back_as_anthropic_sent_them(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """On the honour path the gateway applies nothing: the tool results go up whole, and
    Anthropic's own applied_edits reach the client unchanged."""
    applied = {
        "applied_edits": [
            {
                "type": "clear_tool_uses_20250919",
                "cleared_tool_uses": 2,
                "cleared_input_tokens": 777,
            }
        ]
    }
    upstream.push(JSONReply({**ANSWER, "context_management": applied}))
    message = client.beta.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=300,
        betas=[BETA],
        context_management=CLEAR_4_KEEP_1,
        messages=tool_history(),
    )
    assert message.context_management is not None
    assert message.context_management.model_dump(mode="json", exclude_none=True) == applied
    (sent,) = upstream.received
    body = sent.json()
    assert body["context_management"] == CLEAR_4_KEEP_1
    results = [
        without_markers(b)["content"]
        for turn in body["messages"]
        if isinstance(turn["content"], list)
        for b in turn["content"]
        if b["type"] == "tool_result"
    ]
    assert results == [output(i) for i in range(4)]


def test_an_invalid_edit_to_claude_gets_anthropics_own_400(
    client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """On the honour path the gateway does not judge the edits: they go up as sent, and
    Anthropic's 400 comes back."""
    management: Any = {"edits": [{"type": "clear_everything"}]}
    refusal = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "context_management.edits.0.type: bad",
        },
    }
    upstream.push(JSONReply(refusal, status=400))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.beta.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=300,
            betas=[BETA],
            context_management=management,
            messages=tool_history(),
        )
    assert caught.value.body == refusal
    (sent,) = upstream.received
    assert sent.json()["context_management"] == management


def test_the_same_history_is_cleared_the_same_way_on_every_request(
    client: anthropic.Anthropic, upstream: MockUpstream, chat_model: ChatModel
) -> None:
    """The same request twice goes up byte for byte the same; one more tool use later,
    the placeholders already sent are unchanged (the provider's prefix cache holds)."""
    for pairs in (4, 4, 5):
        client.beta.messages.create(
            model="gpt-4o",
            max_tokens=300,
            betas=[BETA],
            context_management=CLEAR_4_KEEP_1,
            tools=[READ],  # type: ignore[list-item]
            messages=tool_history(pairs),
        )
    first, again, longer = (r for r in upstream.received if r.path == "/v1/chat/completions")
    assert again.body == first.body
    before, after = first.json()["messages"], longer.json()["messages"]
    cleared = [m for m in before if m["role"] == "tool"][:3]
    assert [m for m in after if m["role"] == "tool"][:3] == cleared
    assert len([m for m in after if m["role"] == "tool" and REF.search(m["content"])]) == 4
    assert chat_model.refusals == []
