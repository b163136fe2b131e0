"""``POST /v1/responses`` through the gateway, driven by the official openai SDK, the mock
upstream speaking the Responses API (``ResponsesRoutes``) and the pipeline in between:
what reaches the upstream (every item the pipeline left alone as sent, encrypted reasoning
byte for byte), offloads and compaction, stateful requests kept to hygiene, streams
relayed event for event, errors in OpenAI's envelope, the relayed ``/v1/responses/...``
routes, the dry run, a tenant's keys sharing one conversation, and the metrics."""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pydantic
import pytest
from openai.types.responses import CompactedResponse, ResponseErrorEvent, ResponseStreamEvent

from gateway.codecs.responses import chat_messages
from gateway.codecs.responses.items import ITEMS
from gateway.config import Settings, TenantSettings, UpstreamSettings
from gateway.tenancy.tenants import hash_key
from pipelines import TokenCounter
from tests.gateway.edge.test_access import Lines
from tests.gateway.routes.test_chat import _metric, sync_client
from tests.gateway.routes.test_messages import PNG
from tests.gateway.routes.test_objects import fetch
from tests.harness import GatewayServer
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    Reply,
    ResponsesRoutes,
    SSEReply,
    custom_tool_call_item,
    function_call_item,
    message_item,
    reasoning_item,
    response_body,
    response_events,
    response_usage,
    sse_of_events,
)

MODEL = "gpt-5"
KEY = "sk-test-key"
"""The key ``sync_client`` presents (passthrough: it goes upstream and names the caller's
namespace)."""
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
COUNTER = TokenCounter("o200k_base")
STREAM_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def log_lines(count: int, tag: str = "job") -> str:
    return "".join(
        f"2026-05-16T10:{i % 60:02d}:00Z INFO worker-{i % 8} finished {tag} {i} in {i % 97} ms\n"
        for i in range(count)
    )


BIG_LOG = log_lines(1_500)
"""About 40,000 tokens of log lines: over ``filter-tokens`` (5,000)."""


@pytest.fixture
def routes(upstream: MockUpstream) -> ResponsesRoutes:
    upstream.handler = handler = ResponsesRoutes()
    return handler


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with sync_client(gateway.base_url) as sdk:
        yield sdk


def tokens(headers: Any) -> tuple[int, int]:
    """``x-contextgate-tokens``: before and after."""
    found = re.fullmatch(
        r"before=(\d+), after=(\d+)(, estimated)?", headers["x-contextgate-tokens"]
    )
    assert found is not None, headers["x-contextgate-tokens"]
    return int(found[1]), int(found[2])


def actions(headers: Any) -> list[str]:
    value = headers["x-contextgate-actions"]
    return [name.strip() for name in value.split(",")] if value else []


def sent_input(upstream: MockUpstream, index: int = -1) -> list[dict[str, Any]]:
    """The ``input`` items of a request the upstream received."""
    found = upstream.received[index].json()["input"]
    assert isinstance(found, list)
    return found


def text_of(output: Any) -> str:
    """An output item's ``output`` as text (a string, or its parts' texts)."""
    if isinstance(output, str):
        return output
    return "\n".join(part.get("text", "") for part in output)


def kinds(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item.get("type") == kind]


# -- a plain request -------------------------------------------------------------------------


def test_a_plain_request_reaches_the_upstream_as_sent(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """A string input nothing needed changing goes up byte for byte as the SDK sent it
    (the same bytes as sent to the upstream directly), the answer parses into the same
    ``Response`` as directly, and the gateway's headers say what it did (nothing)."""
    answer = response_body("gpt-4o", [message_item("Hello there!")])
    upstream.push(JSONReply(answer), JSONReply(answer))
    with sync_client(upstream.base_url) as direct:
        expected = direct.responses.with_raw_response.create(model="gpt-4o", input="Say hello.")
    got = client.responses.with_raw_response.create(model="gpt-4o", input="Say hello.")
    assert got.parse().model_dump() == expected.parse().model_dump()
    assert got.parse().output_text == "Hello there!"
    assert got.parse()._request_id == "req_mock"
    direct_sent, via = upstream.received
    assert (via.method, via.path) == ("POST", "/v1/responses")
    assert via.body == direct_sent.body
    assert via.headers["authorization"] == f"Bearer {KEY}"
    count = COUNTER.count_messages([{"role": "user", "content": "Say hello."}])
    assert got.headers["x-contextgate-tokens"] == f"before={count}, after={count}"
    assert got.headers["x-contextgate-actions"] == ""
    assert float(got.headers["x-contextgate-overhead-ms"]) >= 0
    assert got.headers["x-contextgate-request-id"].startswith("cg-")
    assert got.headers["x-contextgate-attempts"] == "1"
    # Bytes the gateway's own encoder would not write (spaces, escapes, key order, a
    # float's ``.0``, an integer over 2**63) go up as they came.
    raw = (
        b'{ "input" : "Say h\\u00e9llo.",\n  "model": "gpt-4o", "temperature": 1.0,'
        b' "metadata": {"n": "x"}, "seed": 18446744073709551615 }'
    )
    response = httpx.post(
        f"{gateway.base_url}/responses",
        content=raw,
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 200
    assert upstream.received[-1].body == raw


# -- tools, media, reasoning -----------------------------------------------------------------

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
    {"type": "custom", "name": "apply_patch", "description": "Patch files."},
    {"type": "web_search"},
]
PDF = base64.b64encode(b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n").decode()
SECRETS = ("gAAAAABo-secret-1/+==", "gAAAAABo-secret-2\u00e9\u2603", "gAAAAABo-secret-3")


def agent_turn() -> list[dict[str, Any]]:
    """An agent's second turn: a developer message, a picture and a file, then the
    model's previous turn (encrypted reasoning before a function call, a custom tool call,
    a web search, an answer) with the outputs, and a new question."""
    return [
        {"role": "developer", "content": "Be terse."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is in this picture and this file?"},
                {
                    "type": "input_image",
                    "image_url": f"data:image/png;base64,{PNG}",
                    "detail": "auto",
                },
                {
                    "type": "input_file",
                    "filename": "plan.pdf",
                    "file_data": f"data:application/pdf;base64,{PDF}",
                },
            ],
        },
        reasoning_item("rs_1", encrypted_content=SECRETS[0], summary=["Check the weather."]),
        function_call_item("get_weather", {"city": "Paris"}, "call_1", "fc_1"),
        {"type": "function_call_output", "call_id": "call_1", "output": '{"sky":"sunny"}'},
        reasoning_item("rs_2", encrypted_content=SECRETS[1]),
        custom_tool_call_item("apply_patch", "*** Begin Patch\n*** End Patch", "call_2", "ctc_2"),
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done."},
        reasoning_item("rs_3", encrypted_content=SECRETS[2]),
        {
            "id": "ws_1",
            "type": "web_search_call",
            "status": "completed",
            "action": {"type": "search", "query": "paris weather"},
        },
        message_item("A cat and a plan. It is sunny.", "msg_1"),
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]


@pytest.mark.parametrize("store", [False, True])
@pytest.mark.parametrize("cache_key", ["client-chosen", None])
def test_tools_media_and_reasoning_reach_the_upstream_as_sent(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    store: bool,
    cache_key: str | None,
) -> None:
    """Every item reaches the upstream as sent, encrypted reasoning byte for byte, with
    the tools and settings (``store``, ``include``, ``reasoning``, ``client_metadata``,
    ``parallel_tool_calls``, ...) as the client sent them: the same request as sent
    directly. Without a ``prompt_cache_key`` of the client's the gateway adds the
    conversation's, and only that."""
    items = agent_turn()
    fields: dict[str, Any] = {
        "model": MODEL,
        "input": items,
        "instructions": "You help with travel.",
        "tools": TOOLS,
        "tool_choice": "auto",
        "store": store,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "high", "summary": "auto"},
        "parallel_tool_calls": False,
        "max_output_tokens": 2_000,
        "extra_body": {"client_metadata": {"session": "s-42"}},
    }
    if cache_key is not None:
        fields["prompt_cache_key"] = cache_key
    with sync_client(upstream.base_url) as direct:
        direct.responses.create(**fields)
    raw = client.responses.with_raw_response.create(**fields)
    assert raw.parse().output_text == "Hello from the mock."
    direct_sent, via = upstream.received
    body = via.json()
    assert body["input"] == items
    for secret in SECRETS:
        assert orjson.dumps(secret) in via.body
    for item in kinds(items, "reasoning"):
        assert orjson.dumps(item) in via.body  # each reasoning item as the client wrote it
    if store:  # the upstream keeps responses: no restore tool (an id would name a round)
        assert body["tools"] == TOOLS
    else:  # the client's tools, then the gateway's restore tool in the Responses form
        assert body["tools"][:-1] == TOOLS
        assert body["tools"][-1]["name"] == "context_restore"
        assert body["tools"][-1]["type"] == "function"
    assert {k: body[k] for k in ("store", "include", "reasoning", "parallel_tool_calls")} == {
        "store": store,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "high", "summary": "auto"},
        "parallel_tool_calls": False,
    }
    assert body["client_metadata"] == {"session": "s-42"}
    direct_body = direct_sent.json()
    body["tools"] = TOOLS
    if cache_key is not None:
        assert body == direct_body  # but for the restore tool, as the client sent it
        if store:
            assert via.body == direct_sent.body  # byte for byte
        assert body["prompt_cache_key"] == cache_key
        assert actions(raw.headers) == []
    else:
        added = body.pop("prompt_cache_key")
        assert isinstance(added, str)
        assert added
        assert body == direct_body
        assert actions(raw.headers) == ["cache_markers"]


def screenshot(seed: int) -> dict[str, Any]:
    data = base64.b64encode(bytes(range(256)) * 120 + seed.to_bytes(4, "big")).decode()
    return {"type": "input_image", "image_url": f"data:image/png;base64,{data}", "detail": "auto"}


def test_media_outside_the_window_is_offloaded_and_restores_as_sent(
    gateway: GatewayServer, upstream: MockUpstream, routes: ResponsesRoutes, client: openai.OpenAI
) -> None:
    """Of three screenshots (two in user messages, one a function's output) the oldest
    goes up as a text part naming a ref, in the message it was in; the ref gives back the
    part as sent; the newer two go up as sent."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Screen 1"}, screenshot(1)]},
        message_item("Seen 1.", "msg_1"),
        {"role": "user", "content": [{"type": "input_text", "text": "Screen 2"}, screenshot(2)]},
        function_call_item("screenshot", {}, "call_3", "fc_3"),
        {"type": "function_call_output", "call_id": "call_3", "output": [screenshot(3)]},
        {"role": "user", "content": "Which one shows the error?"},
    ]
    raw = client.responses.with_raw_response.create(model=MODEL, input=items)
    assert "media" in actions(raw.headers)
    sent = sent_input(upstream)
    assert sent[1:] == items[1:]
    first, placeholder = sent[0]["content"]
    assert first == items[0]["content"][0]
    assert placeholder["type"] == "input_text"
    (ref,) = set(REF.findall(placeholder["text"]))
    restored = fetch(gateway, ref, KEY)
    assert restored.status_code == 200
    assert orjson.loads(restored.content) == items[0]["content"][1]


# -- offloads --------------------------------------------------------------------------------

OFFLOADABLE = {
    "function_call_output": (
        function_call_item("export_logs", {"since": "today"}, "call_1", "fc_1"),
        {"type": "function_call_output", "call_id": "call_1", "output": BIG_LOG},
    ),
    "custom_tool_call_output": (
        custom_tool_call_item("exec", "cat build.log", "call_1", "ctc_1"),
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": BIG_LOG},
    ),
    "local_shell_call_output": (
        {
            "id": "ls_1",
            "type": "local_shell_call",
            "call_id": "call_1",
            "status": "completed",
            "action": {"type": "exec", "command": ["cat", "build.log"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "call_1", "output": BIG_LOG},
    ),
    "function_call_output-parts": (
        function_call_item("export_logs", {"since": "today"}, "call_1", "fc_1"),
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": BIG_LOG}],
        },
    ),
}


def tool_round(call: dict[str, Any], output: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Why did the build fail?"},
        reasoning_item("rs_1", encrypted_content="gAAAAABo-before-the-call"),
        call,
        output,
        {"role": "user", "content": "Summarise the log."},
    ]


@pytest.mark.parametrize("name", list(OFFLOADABLE))
def test_a_big_tool_output_is_offloaded_and_restores_byte_for_byte(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    name: str,
) -> None:
    """An output of 40K tokens (text, or text parts) goes up as a preview naming a ref,
    in the item it came in, every other item as sent; ``x-contextgate-actions`` names
    ``filter``, and the ref gives the caller (and nobody else) the original bytes."""
    call, output = OFFLOADABLE[name]
    items = tool_round(call, output)
    raw = client.responses.with_raw_response.create(model=MODEL, input=items)
    sent = sent_input(upstream)
    assert len(sent) == len(items)
    assert [sent[i] for i in (0, 1, 2, 4)] == [items[i] for i in (0, 1, 2, 4)]
    shown = sent[3]
    assert {k: v for k, v in shown.items() if k != "output"} == {
        k: v for k, v in output.items() if k != "output"
    }
    assert type(shown["output"]) is type(output["output"])
    preview = text_of(shown["output"])
    (ref,) = set(REF.findall(preview))
    assert len(preview) < len(BIG_LOG) // 10
    assert "filter" in actions(raw.headers)
    before, after = tokens(raw.headers)
    assert before > 35_000 > 5_000 > after
    restored = fetch(gateway, ref, KEY)
    assert restored.status_code == 200
    # The output as the client sent it: its text, or the JSON of its parts.
    sent_output = output["output"]
    whole = sent_output if isinstance(sent_output, str) else orjson.dumps(sent_output).decode()
    assert restored.content == whole.encode()
    assert fetch(gateway, ref, "sk-someone-else").status_code == 404


STRUCTURED = {
    "shell_call_output": (
        {
            "type": "shell_call",
            "call_id": "call_1",
            "status": "completed",
            "action": {"commands": ["cat build.log"]},
        },
        {
            "type": "shell_call_output",
            "call_id": "call_1",
            "output": [
                {"stdout": BIG_LOG, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
        },
    ),
    "computer_call_output": (
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "call_1",
            "status": "completed",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
        },
        {
            "type": "computer_call_output",
            "call_id": "call_1",
            "output": {
                "type": "computer_screenshot",
                "image_url": "data:image/png;base64," + base64.b64encode(BIG_LOG.encode()).decode(),
            },
        },
    ),
}


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_a_structured_output_goes_up_verbatim(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    name: str,
) -> None:
    """An output whose shape only its call knows (a shell's results, a screenshot) is
    never rewritten: it reaches the upstream as sent, however big."""
    items = tool_round(*STRUCTURED[name])
    client.responses.create(model=MODEL, input=items)
    assert sent_input(upstream) == items


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_the_report_counts_a_structured_output_sent_whole(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    name: str,
) -> None:
    """What the headers say went up is what went up: an output sent whole is not
    reported offloaded, nor counted as a preview (``after`` would understate the request
    by 40K tokens, and ``max-input`` would not bound it)."""
    items = tool_round(*STRUCTURED[name])
    raw = client.responses.with_raw_response.create(model=MODEL, input=items)
    assert sent_input(upstream) == items
    before, after = tokens(raw.headers)
    assert "filter" not in actions(raw.headers)
    assert after == before


# -- compaction ------------------------------------------------------------------------------


def step_output(n: int) -> str:
    return "".join(f"step {n} line {i}: compiling module_{i}.c ok\n" for i in range(60))


def agent_session(rounds: int, tag: str) -> list[dict[str, Any]]:
    """A stateless agent's request: a goal, then ``rounds`` rounds of encrypted reasoning,
    a shell call and its output (about 900 tokens each), then a new question."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": f"Fix the failing build ({tag}), step by step."}
    ]
    for n in range(rounds):
        items += [
            reasoning_item(f"rs_{n}", encrypted_content=f"gAAAAABo-{tag}-{n}-" + "Zq9/+=" * 8),
            function_call_item("shell", {"cmd": f"make step{n}"}, f"call_{n}", f"fc_{n}"),
            {"type": "function_call_output", "call_id": f"call_{n}", "output": step_output(n)},
        ]
    return [*items, {"role": "user", "content": "Now what?"}]


def assert_pairs_and_reasoning_whole(
    sent: list[dict[str, Any]], items: list[dict[str, Any]], body: bytes
) -> None:
    """Every output after its call and every call answered; each reasoning item as the
    client sent it (byte for byte), immediately before the item it preceded."""
    called: set[str] = set()
    for item in sent:
        if item.get("type") == "function_call":
            called.add(item["call_id"])
        if item.get("type") == "function_call_output":
            assert item["call_id"] in called, f"{item['call_id']} before its call"
    assert called == {item["call_id"] for item in kinds(sent, "function_call_output")}
    where = {item["id"]: index for index, item in enumerate(items) if "id" in item}
    for index, item in enumerate(sent):
        if item.get("type") == "reasoning":
            original = where[item["id"]]
            assert item == items[original]
            assert orjson.dumps(items[original]) in body
            assert sent[index + 1] == items[original + 1]


def test_a_long_session_is_compacted_to_its_budget_with_its_pairs_and_reasoning_whole(
    gateway: GatewayServer, upstream: MockUpstream, routes: ResponsesRoutes, client: openai.OpenAI
) -> None:
    """Under ``max-input=20000`` a 36K-token session goes up within the budget: goal and
    question kept, each function call with its output, each reasoning item byte for byte
    before the call it led to, the rest as sent; what was removed restores from the ref
    its note names."""
    items = agent_session(40, "compaction")
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=items, extra_headers={"x-contextgate-policy": "max-input=20000"}
    )
    before, after = tokens(raw.headers)
    assert before > 30_000
    assert after <= 20_000
    assert "compress" in actions(raw.headers)
    sent = sent_input(upstream)
    assert COUNTER.count_messages(chat_messages(sent, None)) <= 20_000
    assert (sent[0], sent[-1]) == (items[0], items[-1])
    assert kinds(sent, "reasoning")  # the recent rounds kept
    assert_pairs_and_reasoning_whole(sent, items, upstream.received[-1].body)
    notes = [item for item in sent if item not in items]
    assert len(notes) == 1
    (ref,) = set(REF.findall(orjson.dumps(notes[0]).decode()))
    restored = fetch(gateway, ref, KEY)
    assert restored.status_code == 200
    removed = [item for item in items if item not in sent]
    assert removed
    # The ref gives back the client's own items, as it sent them: every removed item
    # whose output the filter did not offload first is there whole.
    restored_items = restored.json()
    assert all(isinstance(item, dict) and item.get("role") != "tool" for item in restored_items)
    assert not any(ITEMS in item or "tool_calls" in item for item in restored_items)
    for item in removed:
        key = item.get("encrypted_content") or item.get("call_id")
        assert key is not None
        assert key in restored.text
    whole = [item for item in removed if item.get("type") != "function_call_output"]
    assert all(item in restored_items for item in whole)


OVERFLOW = {
    "error": {
        "message": "Your input exceeds the context window of this model.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
}


def test_an_upstream_overflow_is_compacted_and_retried(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """When the upstream says the input is too long, the gateway compacts it to half and
    tries again, pairs and reasoning whole; the client sees only the answer."""
    items = agent_session(30, "overflow")
    upstream.push(JSONReply(OVERFLOW, status=400), JSONReply(response_body(MODEL)))
    raw = client.responses.with_raw_response.create(model=MODEL, input=items)
    assert raw.parse().output_text == "Hello from the mock."
    assert raw.headers["x-contextgate-attempts"] == "2"
    first, second = upstream.received
    assert first.json()["input"] == items
    retried = second.json()["input"]
    assert len(retried) < len(items)
    assert COUNTER.count_messages(chat_messages(retried, None)) <= (
        COUNTER.count_messages(chat_messages(items, None)) / 2
    )
    assert retried[-1] == items[-1]
    assert_pairs_and_reasoning_whole(retried, items, second.body)


def test_a_stateful_requests_overflow_is_relayed_not_compacted(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """A request continuing server-side state cannot be compacted, not even to retry an
    overflow: the upstream's refusal is relayed after one attempt, and what went up was
    every output the client sent, with no prompt_cache_key of the gateway's (its
    conversation id, hashed from what one turn shows, would change every turn)."""
    outputs = [
        {
            "type": "function_call_output",
            "call_id": f"call_{i}",
            "output": "".join(f"row {i}.{n}: value {n * 7 % 13}\n" for n in range(300)),
        }
        for i in range(6)
    ]
    upstream.push(JSONReply(OVERFLOW, status=400))
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=outputs, previous_response_id="resp_0")
    assert refused.value.code == "context_length_exceeded"
    (sent,) = upstream.received
    assert sent.json()["input"] == outputs
    assert "prompt_cache_key" not in sent.json()


# -- stateful requests -----------------------------------------------------------------------

STATES = {"previous_response_id": "resp_earlier", "conversation": "conv_earlier"}


@pytest.mark.parametrize("state", list(STATES))
def test_a_stateful_request_is_not_compacted_under_a_tiny_budget(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    state: str,
) -> None:
    """The gateway does not see the history a stateful request continues, so it does not
    compact what it sees, even over ``max-input``'s trigger: the same items without the
    state are compacted."""
    items = [
        {"role": "user", "content": f"Go on with the build ({state})."},
        *agent_session(4, state)[1:-1],
        {"role": "user", "content": "Now what?"},
    ]
    policy = {"x-contextgate-policy": "max-input=4000"}
    stateful = client.responses.with_raw_response.create(
        model=MODEL, input=items, extra_headers=policy, **{state: STATES[state]}
    )
    assert sent_input(upstream) == items
    assert upstream.received[-1].json()[state] == STATES[state]
    assert not {"compress", "ttl_prune", "summarize"} & set(actions(stateful.headers))
    stateless = client.responses.with_raw_response.create(
        model=MODEL, input=items, extra_headers=policy
    )
    assert {"compress", "ttl_prune"} & set(actions(stateless.headers))
    assert sent_input(upstream) != items


@pytest.mark.parametrize("state", list(STATES))
def test_a_stateful_request_goes_up_without_a_turn_the_client_did_not_send(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    state: str,
) -> None:
    """A stateful request that answers the previous response's function call (how the
    Agents SDK continues) goes up as its items: nothing put before the output."""
    items: list[dict[str, Any]] = [
        {"type": "function_call_output", "call_id": "call_earlier", "output": '{"sky":"sunny"}'}
    ]
    client.responses.create(model=MODEL, input=items, **{state: STATES[state]})
    assert sent_input(upstream) == items


@pytest.mark.parametrize("state", list(STATES))
def test_a_big_output_in_a_stateful_request_is_still_offloaded(
    gateway: GatewayServer,
    upstream: MockUpstream,
    routes: ResponsesRoutes,
    client: openai.OpenAI,
    state: str,
) -> None:
    """Hygiene still runs on what a stateful request shows: a 40K-token output is
    offloaded (the policy's mode is ``off``, which filters), and restores."""
    output = {"type": "function_call_output", "call_id": "call_earlier", "output": BIG_LOG}
    items = [output, {"role": "user", "content": "What failed?"}]
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input=items,
        **{state: STATES[state]},
    )
    assert "filter" in actions(raw.headers)
    (shown,) = kinds(sent_input(upstream), "function_call_output")
    assert shown["call_id"] == "call_earlier"
    (ref,) = set(REF.findall(shown["output"]))
    assert fetch(gateway, ref, KEY).content == BIG_LOG.encode()
    assert sent_input(upstream)[-1] == items[-1]


@pytest.mark.parametrize("state", list(STATES))
def test_a_stateful_request_over_its_budget_is_refused_before_the_upstream(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI, state: str
) -> None:
    """What the gateway may not compact must fit ``max-input`` on its own: 20 rounds of
    small outputs (21K tokens) under ``max-input=4000`` are a 400
    ``context_length_exceeded``, and nothing goes up. A new turn over ``block-tokens`` is
    a 400 ``payload_too_large``."""
    items = agent_session(20, f"over-{state}")[1:-1]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=MODEL,
            input=items,
            extra_headers={"x-contextgate-policy": "max-input=4000"},
            **{state: STATES[state]},
        )
    assert refused.value.code == "context_length_exceeded"
    assert "4,000" in refused.value.message
    with pytest.raises(openai.BadRequestError) as blocked:
        client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": "word " * 3_000}],
            extra_headers={"x-contextgate-policy": "block-tokens=1000"},
            **{state: STATES[state]},
        )
    assert blocked.value.code == "payload_too_large"
    assert upstream.received == []


# -- streams ---------------------------------------------------------------------------------


def streamed_answer(**usage: int) -> list[dict[str, Any]]:
    output = [
        reasoning_item("rs_out", encrypted_content="gAAAAABo-streamed", summary=["Think."]),
        message_item("Hello there, you.", "msg_out"),
        function_call_item("get_weather", {"city": "Paris"}, "call_out", "fc_out"),
    ]
    return response_events(response_body(MODEL, output, usage=response_usage(**usage)))


def test_a_stream_reaches_the_client_event_for_event(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """The upstream's events reach the client unchanged and in order, the bytes as sent;
    ``responses.stream`` gathers the final response with its usage."""
    events = streamed_answer(input_tokens=100, output_tokens=30, cached_tokens=64)
    sse = sse_of_events(events)
    upstream.push(SSEReply(sse), SSEReply(sse), SSEReply(sse))
    got = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert [event.to_dict() for event in got] == events
    with client.responses.stream(model=MODEL, input="Hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello there, you."
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.input_tokens_details.cached_tokens) == (100, 64)
    body = {"model": MODEL, "input": "Hi", "stream": True}
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/responses",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
    ) as raw:
        assert raw.status_code == 200
        assert raw.headers["content-type"].startswith("text/event-stream")
        assert raw.headers["x-contextgate-request-id"].startswith("cg-")
        assert raw.read() == b"".join(sse)
    assert [r.json()["stream"] for r in upstream.received] == [True, True, True]


def error_event(code: str, message: str) -> dict[str, Any]:
    """The Responses API's ``error`` stream event."""
    return {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}


def failed_event(code: str, message: str) -> dict[str, Any]:
    failed = response_body(MODEL, [], status="failed", error={"code": code, "message": message})
    return {"type": "response.failed", "response": failed, "sequence_number": 0}


@pytest.mark.parametrize(
    ("event", "status", "error_cls"),
    [
        (error_event("rate_limit_exceeded", "Slow down."), 429, openai.RateLimitError),
        (error_event("server_error", "Try again."), 500, openai.InternalServerError),
        (failed_event("server_error", "Try again."), 500, openai.InternalServerError),
        (error_event("something_new", "Odd."), 502, openai.InternalServerError),
    ],
    ids=["rate-limited", "server-error", "response-failed", "unknown-code"],
)
def test_an_error_as_the_first_event_is_an_http_error(
    gateway: GatewayServer,
    upstream: MockUpstream,
    client: openai.OpenAI,
    event: dict[str, Any],
    status: int,
    error_cls: type[Exception],
) -> None:
    """A stream whose first event is an error is no 200 stream: the client gets the
    status the error stands for and OpenAI's error envelope with the upstream's message
    and code."""
    upstream.push(SSEReply(sse_of_events([event])))
    with pytest.raises(error_cls) as caught:
        list(client.responses.create(model=MODEL, input="Hi", stream=True))
    error = caught.value
    assert isinstance(error, openai.APIStatusError)
    assert error.status_code == status
    assert error.response.headers["content-type"].startswith("application/json")
    assert error.response.headers["x-contextgate-request-id"].startswith("cg-")
    envelope = error.response.json()["error"]
    assert set(envelope) == {"message", "type", "param", "code"}
    upstream_error = event.get("response", {}).get("error") or event
    assert (envelope["message"], envelope["code"]) == (
        upstream_error["message"],
        upstream_error["code"],
    )
    assert isinstance(envelope["type"], str)


def test_an_error_events_envelope_names_an_error_type(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The Responses ``error`` event carries no error type; the envelope made from it
    must not take the event's own type (``"error"``) for one."""
    upstream.push(SSEReply(sse_of_events([error_event("rate_limit_exceeded", "Slow down.")])))
    response = httpx.post(
        f"{gateway.base_url}/responses",
        json={"model": MODEL, "input": "Hi", "stream": True},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 429
    assert response.json()["error"]["type"] != "error"


def cut_stream() -> tuple[list[dict[str, Any]], list[bytes]]:
    """The first five events of an answer, then the connection dropped."""
    events = streamed_answer()[:5]
    return events, sse_of_events(events)


def test_a_stream_cut_off_ends_with_a_responses_error_event(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """An upstream that drops the connection mid-stream: the client gets the events it
    sent, then one ``event: error`` (the Responses API's error event); the SDK yields it
    from ``create(stream=True)`` and ``responses.stream`` has no final response."""
    events, sse = cut_stream()
    upstream.push(*(SSEReply(sse, ending="drop") for _ in range(3)))
    body = {"model": MODEL, "input": "Hi", "stream": True}
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/responses",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
    ) as raw:
        assert raw.status_code == 200
        received = raw.read()
    assert received.startswith(b"".join(sse))
    tail = received[len(b"".join(sse)) :]
    assert tail.startswith(b"event: error\ndata: ")
    assert tail.count(b"data: ") == 1
    error = orjson.loads(tail.removeprefix(b"event: error\ndata: "))
    assert (error["type"], error["code"]) == ("error", "upstream_stream_error")
    got = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert [event.to_dict() for event in got[:-1]] == events
    assert (got[-1].type, got[-1].code) == ("error", "upstream_stream_error")
    with (
        pytest.raises(RuntimeError, match=r"response\.completed"),
        client.responses.stream(model=MODEL, input="Hi") as stream,
    ):
        stream.get_final_response()


def test_the_error_event_ending_a_cut_stream_is_a_valid_stream_event(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The gateway's terminal ``error`` event parses as the API's ``ResponseErrorEvent``
    (which has a ``sequence_number``), so that clients that check the events' types (the
    Agents SDK, Codex) take it for the error it is."""
    _, sse = cut_stream()
    upstream.push(SSEReply(sse, ending="drop"))
    body = {"model": MODEL, "input": "Hi", "stream": True}
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/responses",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
    ) as raw:
        received = raw.read()
    tail = received[len(b"".join(sse)) :]
    event = orjson.loads(tail.removeprefix(b"event: error\ndata: "))
    ResponseErrorEvent.model_validate(event)
    STREAM_EVENT.validate_python(event)


# -- cache feedback --------------------------------------------------------------------------

INSTRUCTIONS = "You are the airline's agent. Follow the booking policy to the letter. " * 100


def cached_answer(cached: int, *, stream: bool = False, tag: str = "") -> Reply:
    body = response_body(
        MODEL,
        [
            reasoning_item(f"rs_{tag}", encrypted_content=f"gAAAAABo-answer-{tag}"),
            message_item(f"Answer {tag}", f"msg_{tag}"),
        ],
        id=f"resp_{tag}",
        usage=response_usage(9_000, 2, cached_tokens=cached),
    )
    return SSEReply(sse_of_events(response_events(body))) if stream else JSONReply(body)


def requests_counted(gateway: GatewayServer) -> float:
    text = httpx.get(f"{gateway.url}/metrics").text
    return _metric(text, "contextgate_requests_total", route="/v1/responses")


def settle(gateway: GatewayServer, count: float) -> None:
    """Wait until the gateway has finished ``count`` Responses requests in all (a stream's
    usage is taken when it ends, which the client may see a moment before)."""
    deadline = time.monotonic() + 5
    while requests_counted(gateway) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def breaks(gateway: GatewayServer, cause: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics").text
    return _metric(text, "contextgate_cache_breaks_total", cause=cause)


class Conversation:
    """One client's conversation: the answers' output items appended to the input, as the
    SDK gives them (``to_dict``), turn after turn."""

    def __init__(self, gateway: GatewayServer, tag: str) -> None:
        self.gateway, self.tag = gateway, tag
        self.items: list[dict[str, Any]] = []

    def turn(
        self, client: openai.OpenAI, *, stream: bool = False, **fields: Any
    ) -> tuple[Any, Any]:
        """The next question and its answer: the raw response's headers, the answer."""
        number = sum(1 for item in self.items if item.get("role") == "user")
        question = {"role": "user", "content": f"Question {number} ({self.tag})"}
        self.items.append(question)
        before = requests_counted(self.gateway)
        request = {"model": MODEL, "instructions": INSTRUCTIONS, "input": self.items, **fields}
        if stream:
            raw = client.responses.with_raw_response.create(**request, stream=True)
            events = list(raw.parse())
            answer = events[-1].response
        else:
            raw = client.responses.with_raw_response.create(**request)
            answer = raw.parse()
        settle(self.gateway, before + 1)
        self.items += [item.to_dict() for item in answer.output]
        return raw.headers, answer


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize(("cached", "expected"), [(0, "unknown"), (8_000, None)])
def test_the_cache_reads_an_answer_reports_judge_the_next_turn(
    gateway: GatewayServer,
    upstream: MockUpstream,
    client: openai.OpenAI,
    streamed: bool,
    cached: int,
    expected: str | None,
) -> None:
    """The usage of each answer (a stream's in ``response.completed``) is the
    conversation's: after a turn that read 8,000 tokens from the cache, a turn that reads
    none is a break (``unknown``: nothing the gateway changed explains it), counted once;
    one that reads them again is none. The first two turns have no surprise break."""
    tag = f"cache-{streamed}-{cached}"
    upstream.push(
        cached_answer(0, tag="1"),
        cached_answer(8_000, stream=streamed, tag="2"),
        cached_answer(cached, tag="3"),
    )
    before = breaks(gateway, "unknown")
    talk = Conversation(gateway, tag)
    first, _ = talk.turn(client)
    second, _ = talk.turn(client, stream=streamed)
    assert "x-contextgate-cache-break" not in first
    assert "x-contextgate-cache-break" not in second
    third, _ = talk.turn(client)
    assert third.get("x-contextgate-cache-break") == expected
    assert breaks(gateway, "unknown") == before + (expected is not None)
    # The third request carried the first two answers' reasoning as the SDK gave it.
    assert b'"encrypted_content":"gAAAAABo-answer-2"' in upstream.received[-1].body


def test_a_stream_says_the_predicted_break_before_it_starts(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """Streamed, the headers leave before the usage: they name the cause the pipeline
    predicted (a tool added), and the metric counts it once the usage confirms."""
    upstream.push(
        cached_answer(0, tag="a"),
        cached_answer(8_000, tag="b"),
        cached_answer(0, stream=True, tag="c"),
    )
    before = breaks(gateway, "tools")
    talk = Conversation(gateway, "predicted-break")
    talk.turn(client)
    talk.turn(client)
    third, _ = talk.turn(client, stream=True, tools=TOOLS[:1])
    assert third["x-contextgate-cache-break"] == "tools"
    assert breaks(gateway, "tools") == before + 1


# -- errors ----------------------------------------------------------------------------------

BAD_BODIES = [
    (b'{"model": "gpt-5", "input": 5}', "invalid_type", "input"),
    (b'{"model": "gpt-5", "input": [5]}', "invalid_type", "input[0]"),
    (
        b'{"model": "gpt-5", "input": [{"role": "user", "content": "x"}, "y"]}',
        "invalid_type",
        "input[1]",
    ),
    (
        b'{"model": "gpt-5", "input": [{"role": "wizard", "content": "x"}]}',
        "invalid_type",
        "input[0].role",
    ),
    (
        b'{"model": "gpt-5", "input": [{"role": "user", "content": 7}]}',
        "invalid_type",
        "input[0].content",
    ),
    (
        b'{"model": "gpt-5", "input": [{"role": "user", "content": [{"text": "x"}]}]}',
        "invalid_type",
        "input[0].content[0]",
    ),
    (b'{"model": "gpt-5", "input": [{"type": 3}]}', "invalid_type", "input[0].type"),
    (b'{"model": "gpt-5", "input": "x", "tools": {}}', "invalid_type", "tools"),
    (b'{"model": "gpt-5", "input": "x", "instructions": 1}', "invalid_type", "instructions"),
    (b'{"model": "gpt-5", "input": "x", "stream": "yes"}', "invalid_type", "stream"),
    (b'{"input": "x"}', "missing_required_parameter", "model"),
    (b'{"model": "", "input": "x"}', "invalid_type", "model"),
    (
        b'{"model": "gpt-5", "input": "x", "api_base": "http://evil"}',
        "unsupported_parameter",
        "api_base",
    ),
    (b"", "invalid_json", None),
    (b"{not json", "invalid_json", None),
    (b"[1, 2]", "invalid_body", None),
]


@pytest.mark.parametrize(
    ("raw", "code", "param"), BAD_BODIES, ids=[f"{code}-{param}" for _, code, param in BAD_BODIES]
)
def test_a_bad_body_is_a_400_naming_the_param(
    gateway: GatewayServer, upstream: MockUpstream, raw: bytes, code: str, param: str | None
) -> None:
    """A body that is not a usable Responses request is a 400 in OpenAI's envelope naming
    what is wrong, and nothing goes upstream."""
    response = httpx.post(
        f"{gateway.base_url}/responses",
        content=raw,
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert error["message"]
    assert upstream.received == []


@pytest.mark.parametrize(
    ("status", "error_cls"),
    [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_is_relayed_with_its_body(
    gateway: GatewayServer,
    upstream: MockUpstream,
    client: openai.OpenAI,
    status: int,
    error_cls: type[Exception],
    stream: bool,
) -> None:
    """An upstream error reaches the client with its status, body and ``retry-after``,
    streamed or not, after one attempt."""
    body = {
        "error": {
            "message": f"upstream says {status}",
            "type": "some_error",
            "param": "input",
            "code": f"code_{status}",
        }
    }
    upstream.push(JSONReply(body, status=status, headers={"retry-after": "7"}))
    with pytest.raises(error_cls) as caught:
        client.responses.create(model=MODEL, input="Hi", stream=stream)
    error = caught.value
    assert isinstance(error, openai.APIStatusError)
    assert error.status_code == status
    assert error.body == body["error"]
    assert error.response.headers["retry-after"] == "7"
    assert error.response.headers["x-contextgate-attempts"] == "1"
    assert len(upstream.received) == 1


def test_a_claude_model_is_refused_naming_the_apis_that_serve_it(
    anthropic_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Claude has no Responses API: a ``claude-*`` model is a 400 ``unsupported_model``
    on the ``model`` param, and nothing goes to Anthropic."""
    with (
        sync_client(anthropic_gateway.base_url) as client,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        client.responses.create(model="claude-sonnet-4-6", input="Hi")
    assert (refused.value.code, refused.value.param) == ("unsupported_model", "model")
    assert "/v1/messages" in refused.value.message
    assert upstream.received == []


# -- the relayed routes ----------------------------------------------------------------------


def test_the_other_responses_routes_are_relayed(
    gateway: GatewayServer, upstream: MockUpstream, routes: ResponsesRoutes, client: openai.OpenAI
) -> None:
    """``compact``, ``retrieve``, ``input_items.list``, ``cancel`` and ``delete`` reach the
    upstream at their path with their method, bodies as sent; the compacted output goes
    back up through ``POST /v1/responses`` as it came."""
    history = [
        {"role": "user", "content": "Remember 42."},
        message_item("I will remember 42.", "msg_0"),
    ]
    with sync_client(upstream.base_url) as direct:
        direct.responses.compact(model=MODEL, input=history, instructions="Keep it short.")
    raw = client.responses.with_raw_response.compact(
        model=MODEL,
        input=history,
        instructions="Keep it short.",
    )
    compacted = raw.parse()
    assert isinstance(compacted, CompactedResponse)
    assert compacted.output[-1].type == "compaction"
    direct_sent, via = upstream.received
    assert (via.method, via.path) == ("POST", "/v1/responses/compact")
    assert via.body == direct_sent.body
    upstream.received.clear()

    following = [*raw.http_response.json()["output"], {"role": "user", "content": "What number?"}]
    created = client.responses.create(model=MODEL, input=following)
    assert sent_input(upstream) == following
    assert client.responses.retrieve(created.id) == created
    listed = list(client.responses.input_items.list(created.id, order="asc"))
    assert [item.type for item in listed][-1] == "message"
    assert client.responses.cancel(created.id).status == "cancelled"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    path = f"/v1/responses/{created.id}"
    assert [(r.method, r.path.partition("?")[0]) for r in upstream.received] == [
        ("POST", "/v1/responses"),
        ("GET", path),
        ("GET", f"{path}/input_items"),
        ("POST", f"{path}/cancel"),
        ("DELETE", path),
        ("GET", path),
    ]
    assert "order=asc" in upstream.received[2].path
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in upstream.received)


# -- the dry run -----------------------------------------------------------------------------


def dry_run(
    gateway: GatewayServer, body: dict[str, Any], policy: str | None = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}"}
    if policy is not None:
        headers["x-contextgate-policy"] = policy
    return httpx.post(f"{gateway.base_url}/context/compact", json=body, headers=headers)


def test_the_dry_run_takes_a_responses_body_and_sends_nothing(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """``POST /v1/context/compact`` with a Responses body answers the Responses request as
    it would go up (a big output as a preview whose ref restores), the report and the
    policy; a request nothing needed changing comes back as sent; a stateful one runs in
    mode ``off``. Nothing reaches the upstream."""
    call, output = OFFLOADABLE["function_call_output"]
    body = {
        "model": MODEL,
        "input": tool_round(call, output),
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "dry-run",
        "reasoning": {"effort": "low"},
    }
    response = dry_run(gateway, body, "max-input=50000")
    assert response.status_code == 200
    payload = response.json()
    assert set(payload) == {"request", "report", "policy"}
    request = payload["request"]
    assert {k: v for k, v in request.items() if k not in ("input", "tools")} == {
        k: v for k, v in body.items() if k != "input"
    }
    # It names a ref now: the gateway's restore tool goes with it, in the Responses form.
    assert [tool["name"] for tool in request["tools"]] == ["context_restore"]
    sent, items = request["input"], body["input"]
    assert [sent[i] for i in (0, 1, 2, 4)] == [items[i] for i in (0, 1, 2, 4)]
    (ref,) = set(REF.findall(sent[3]["output"]))
    assert fetch(gateway, ref, KEY).content == BIG_LOG.encode()
    assert "filter" in payload["report"]["actions"]
    assert payload["report"]["budget"] == 50_000
    assert payload["policy"]["max-input"] == 50_000
    assert "filter" in actions(response.headers)

    plain = {"model": MODEL, "input": "Say hello.", "store": True}
    assert dry_run(gateway, plain).json()["request"] == plain
    stateful = {"model": MODEL, "input": "Go on.", "previous_response_id": "resp_earlier"}
    answered = dry_run(gateway, stateful).json()
    assert answered["request"] == stateful
    assert answered["policy"]["mode"] == "off"
    assert upstream.received == []


# -- a tenant's keys -------------------------------------------------------------------------

TEAM_KEYS = ("cg-team-key-one-0123456789abcdef", "cg-team-key-two-0123456789abcdef")


@pytest.fixture(scope="module")
def team(mock_upstream: MockUpstream, redis_url: str) -> Iterator[GatewayServer]:
    """A gateway with one tenant: two gateway keys, one upstream key, GPT models only."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=mock_upstream.base_url, api_key="sk-shared-upstream"),
        redis_url=redis_url,
        summaries=False,
        tenants=(
            TenantSettings(
                "team",
                tuple(hash_key(key) for key in TEAM_KEYS),
                upstream_api_key="sk-team-upstream",
                models=("gpt-*",),
            ),
        ),
    )
    with GatewayServer(settings) as server:
        yield server


def test_a_tenants_keys_share_a_conversation_and_its_upstream_key(
    team: GatewayServer, upstream: MockUpstream
) -> None:
    """Turns of one conversation sent with either of the tenant's gateway keys reach the
    upstream with the tenant's upstream key (never a gateway key), the answers' encrypted
    reasoning carried back byte for byte, under one ``prompt_cache_key`` the gateway set;
    and the conversation's record is one: a cache drop after a turn sent with the other
    key is judged against it."""
    upstream.push(
        cached_answer(0, tag="k1"),
        cached_answer(8_000, tag="k2"),
        cached_answer(0, tag="k3"),
    )
    talk = Conversation(team, "team")
    headers = []
    for turn in range(3):
        with openai.OpenAI(
            base_url=team.base_url, api_key=TEAM_KEYS[turn % 2], max_retries=0
        ) as client:
            headers.append(talk.turn(client)[0])
    sent = upstream.received
    assert [r.headers["authorization"] for r in sent] == ["Bearer sk-team-upstream"] * 3
    for request in sent:
        assert not any(key in orjson.dumps(request.header_lines).decode() for key in TEAM_KEYS)
    cache_keys = {r.json().get("prompt_cache_key") for r in sent}
    assert len(cache_keys) == 1
    assert None not in cache_keys
    for tag in ("k1", "k2"):
        assert orjson.dumps(f"gAAAAABo-answer-{tag}") in sent[-1].body
    assert headers[2].get("x-contextgate-cache-break") == "unknown"


def test_a_model_outside_the_tenants_list_is_403(
    team: GatewayServer, upstream: MockUpstream
) -> None:
    with (
        openai.OpenAI(base_url=team.base_url, api_key=TEAM_KEYS[0], max_retries=0) as client,
        pytest.raises(openai.PermissionDeniedError) as refused,
    ):
        client.responses.create(model="o3-mini", input="Hi")
    assert (refused.value.code, refused.value.param) == ("model_not_allowed", "model")
    assert "o3-mini" in refused.value.message
    assert upstream.received == []


# -- metrics and the access log --------------------------------------------------------------


@pytest.fixture
def logged() -> Iterator[Lines]:
    """Every line the gateway's loggers write at INFO and up."""
    handler = Lines()
    logger = logging.getLogger("contextgate")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_responses_request_is_counted_and_logged(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI, logged: Lines
) -> None:
    """``/metrics`` counts each request under the route ``/v1/responses`` with its model,
    and the tokens its usage reported (a stream's from ``response.completed``) and the
    gateway counted; the access log has a line for each, with the same."""
    usage = {"input_tokens": 1_200, "output_tokens": 34, "cached_tokens": 1_000}
    upstream.push(
        JSONReply(response_body(MODEL, usage=response_usage(**usage))),
        SSEReply(sse_of_events(streamed_answer(input_tokens=300, output_tokens=7))),
    )

    def metrics() -> str:
        return httpx.get(f"{gateway.url}/metrics").text

    def count(text: str, name: str, **labels: str) -> float:
        return _metric(text, name, model=MODEL, tenant="passthrough", **labels)

    before = metrics()
    counted = requests_counted(gateway)
    answered = client.responses.with_raw_response.create(model=MODEL, input="Count me.")
    streamed = client.responses.with_raw_response.create(model=MODEL, input="Me too.", stream=True)
    list(streamed.parse())
    settle(gateway, counted + 2)
    after = metrics()

    def moved(name: str, **labels: str) -> float:
        return count(after, name, **labels) - count(before, name, **labels)

    requests = "contextgate_requests_total"
    assert moved(requests, route="/v1/responses", status="200") == 2
    tokens_total = "contextgate_upstream_tokens_total"
    assert moved(tokens_total, kind="input") == 1_500
    assert moved(tokens_total, kind="output") == 41
    assert moved(tokens_total, kind="cache_read") == 1_000
    gateway_count = COUNTER.count_messages([{"role": "user", "content": "Count me."}])
    gateway_count += COUNTER.count_messages([{"role": "user", "content": "Me too."}])
    assert moved("contextgate_compaction_tokens_total", phase="before") == gateway_count
    lines = [line for line in logged.access(2) if line["route"] == "/v1/responses"]
    assert [line["request_id"] for line in lines] == [
        answered.headers["x-contextgate-request-id"],
        streamed.headers["x-contextgate-request-id"],
    ]
    first, second = lines
    assert (first["model"], first["status"], first["stream"]) == (MODEL, 200, False)
    assert (second["model"], second["status"], second["stream"]) == (MODEL, 200, True)
    assert first["upstream_tokens"] == {
        "input": 1_200,
        "output": 34,
        "cache_read": 1_000,
        "cache_write": 0,
    }
    assert second["upstream_tokens"]["input"] == 300
    assert first["tokens_before"] == first["tokens_after"] > 0


def test_an_overflow_retry_sends_the_compacted_request_when_the_first_pass_changed_nothing(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """With the client's own ``prompt_cache_key`` (as Codex sends it) and nothing over the
    budget, the first attempt goes up as the client sent it; the overflow's retry is the
    compacted request, not those bytes again."""
    items = agent_session(30, "raw-overflow")
    upstream.push(JSONReply(OVERFLOW, status=400), JSONReply(response_body(MODEL)))
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=items, prompt_cache_key="codex-session-1"
    )
    assert raw.parse().output_text == "Hello from the mock."
    assert raw.headers["x-contextgate-attempts"] == "2"
    first, second = upstream.received
    assert first.json()["input"] == items
    assert len(second.json()["input"]) < len(items)
    assert second.json()["prompt_cache_key"] == "codex-session-1"


# -- the restore tool -------------------------------------------------------------------------


class Restoring:
    """A model that, while the request names a ref it has not restored, asks for it with
    ``context_restore`` (after a reasoning item), then answers with what it read."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, received: Any) -> Reply | None:
        if received.path != "/v1/responses":
            return None
        body = received.json()
        self.requests.append(body)
        restored = [i for i in body["input"] if i.get("type") == "function_call_output"]
        refs = REF.findall(orjson.dumps(body["input"]).decode())
        asked = any(i.get("call_id") == "call_restore" for i in restored)
        if refs and not asked:
            output = [
                reasoning_item("rs_restore", encrypted_content="gAAAA-why-restore"),
                function_call_item(
                    "context_restore", {"ref": refs[0]}, call_id="call_restore", id="fc_r"
                ),
            ]
            usage = response_usage(input_tokens=5_000, output_tokens=20)
        else:
            got = next(i["output"] for i in restored if i["call_id"] == "call_restore")
            first_line = BIG_LOG.splitlines()[0]
            said = f"The log begins: {first_line}" if first_line in got else "Nothing came back."
            output = [message_item(said, id="msg_final")]
            usage = response_usage(input_tokens=9_000, output_tokens=30)
        response = response_body(MODEL, output, id=f"resp_{len(self.requests)}", usage=usage)
        if body.get("stream"):
            return SSEReply(sse_of_events(response_events(response)))
        return JSONReply(response)


def restore_request(tag: str) -> dict[str, Any]:
    call, output = OFFLOADABLE["function_call_output"]
    tool = {"type": "function", "name": "export_logs", "parameters": {"type": "object"}}
    items = tool_round(call, output)
    items[0] = {"role": "user", "content": f"Why did the build fail? ({tag})"}
    return {"model": MODEL, "input": items, "tools": [tool], "store": False}


def test_the_model_restores_within_one_answer(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """The gateway offers ``context_restore`` (in the Responses form) and answers the
    model's call itself: the client gets one response, the model's final answer, under
    the last round's id, with every round's usage; the round went up with the
    reasoning and the call the model made and the restored text as the call's output."""
    model = upstream.handler = Restoring()
    raw = client.responses.with_raw_response.create(**restore_request("buffered"))
    response = raw.parse()
    assert response.output_text == f"The log begins: {BIG_LOG.splitlines()[0]}"
    assert [item.type for item in response.output] == ["message"]
    assert response.id == "resp_2"  # the response the upstream keeps with the whole context
    assert response.usage is not None
    assert response.usage.input_tokens == 14_000
    assert "rounds=1" in raw.headers["x-contextgate-restore"]
    first, second = model.requests
    assert first["tools"][-1]["name"] == "context_restore"
    assert first["tools"][-1]["parameters"]["required"] == ["ref"]
    assert second["input"][: len(first["input"])] == first["input"]
    round_items = second["input"][len(first["input"]) :]
    assert [item["type"] for item in round_items] == [
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert round_items[2]["call_id"] == "call_restore"
    assert BIG_LOG.splitlines()[0] in round_items[2]["output"]


def test_the_model_restores_within_one_stream(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """Streamed, the restore round is spliced into the one response the client reads: one
    ``response.created``, every event numbered on from the last, no event of the restore
    call nor of the reasoning before it, output indexes following the items shown, and one
    ``response.completed`` with the last round's id, every item shown and every round's
    usage."""
    model = upstream.handler = Restoring()
    request = {**restore_request("streamed"), "stream": True}
    with client.responses.with_streaming_response.create(**request) as raw:
        events = [STREAM_EVENT.validate_python(e.model_dump()) for e in raw.parse()]
    assert len(model.requests) == 2
    kinds = [event.type for event in events]
    assert kinds.count("response.created") == 1
    assert kinds[-1] == "response.completed"
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))
    assert "context_restore" not in orjson.dumps([e.model_dump() for e in events]).decode()
    shown = [event.item for event in events if event.type == "response.output_item.done"]
    # The reasoning before the restore call is never shown: a client resending it without
    # the call it reasoned for would be refused.
    assert [item.type for item in shown] == ["message"]
    assert "rs_restore" not in orjson.dumps([e.model_dump() for e in events]).decode()
    indexes = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert indexes == [0]
    completed = events[-1].response
    assert events[0].response.id == "resp_1"
    assert completed.id == "resp_1"  # the SDK holds a stream to the id it began with
    assert [item.id for item in completed.output] == [item.id for item in shown]
    assert completed.output_text == f"The log begins: {BIG_LOG.splitlines()[0]}"
    assert completed.usage is not None
    assert completed.usage.input_tokens == 14_000


def test_a_restore_call_beside_the_clients_own_call_is_dropped(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """When the model calls the client's tool and ``context_restore`` together, the client
    gets its own call (the round is its to answer) and never sees the restore call."""

    def both(received: Any) -> Reply | None:
        body = received.json()
        (ref,) = set(REF.findall(orjson.dumps(body["input"]).decode()))
        output = [
            function_call_item("context_restore", {"ref": ref}, call_id="c_r", id="fc_r"),
            function_call_item("export_logs", {"since": "now"}, call_id="c_own", id="fc_own"),
        ]
        return JSONReply(response_body(MODEL, output, id="resp_both"))

    upstream.handler = both
    raw = client.responses.with_raw_response.create(**restore_request("mixed"))
    response = raw.parse()
    assert [(item.type, getattr(item, "name", None)) for item in response.output] == [
        ("function_call", "export_logs")
    ]
    assert "mixed=1" in raw.headers["x-contextgate-restore"]
    assert len(upstream.received) == 1


class Scripted:
    """A model whose round ``n`` answers ``rounds[n](ref)`` (the last one from then on):
    an output, and optionally a status."""

    def __init__(self, rounds: list[Any]) -> None:
        self.rounds = rounds
        self.requests: list[dict[str, Any]] = []

    def __call__(self, received: Any) -> Reply | None:
        if received.path != "/v1/responses":
            return None
        body = received.json()
        self.requests.append(body)
        (ref, *_) = REF.findall(orjson.dumps(body["input"]).decode()) or ["ctx_none"]
        number = len(self.requests)
        spec = self.rounds[min(number, len(self.rounds)) - 1](ref)
        response = response_body(
            MODEL, spec["output"], id=f"resp_{number}", status=spec.get("status", "completed")
        )
        if body.get("stream"):
            return SSEReply(sse_of_events(response_events(response)))
        return JSONReply(response)


def restoring(ref: str, number: int = 0) -> dict[str, Any]:
    return function_call_item(
        "context_restore", {"ref": ref}, call_id=f"call_r{number}", id=f"fc_r{number}"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_that_only_ever_restores_is_said_to_have_run_out(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI, stream: bool
) -> None:
    """After the last round the model still reasons and asks to restore: the client gets a
    message saying so, not an answer with nothing in it."""
    upstream.handler = model = Scripted(
        [
            lambda ref: {
                "output": [
                    reasoning_item("rs_again", encrypted_content="gAAAA-again"),
                    restoring(ref),
                ]
            }
        ]
    )
    request = restore_request(f"exhausted-{stream}")
    if stream:
        with client.responses.stream(**request) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**request)
    assert "more times than allowed" in response.output_text
    assert len(model.requests) == 4  # the first answer and three rounds


@pytest.mark.parametrize("stream", [False, True])
def test_a_round_cut_off_is_not_answered_nor_called_exhausted(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI, stream: bool
) -> None:
    """A round cut off (``incomplete``, at ``max_output_tokens``) with a restore call in it
    is the client's as it ended: its call is not whole, so it is neither answered nor sent
    on, and no round limit is said to be reached."""
    upstream.handler = model = Scripted(
        [
            lambda ref: {
                "output": [message_item("Partial"), {**restoring(ref), "status": "incomplete"}],
                "status": "incomplete",
            }
        ]
    )
    request = restore_request(f"cut-{stream}")
    if stream:
        with client.responses.with_streaming_response.create(**request, stream=True) as raw:
            events = list(raw.parse())
        final = events[-1]
        assert final.type == "response.incomplete"
        text = final.response.output_text
    else:
        text = client.responses.create(**request).output_text
    assert text == "Partial"
    assert len(model.requests) == 1


def test_a_round_goes_up_without_reasoning_the_upstream_could_only_find_by_id(
    gateway: GatewayServer, upstream: MockUpstream, client: openai.OpenAI
) -> None:
    """``store: false`` and no encrypted reasoning asked for: the round's reasoning item
    has only an id, which the upstream did not keep; the round goes up without it."""
    upstream.handler = model = Scripted(
        [
            lambda ref: {"output": [reasoning_item("rs_bare"), restoring(ref)]},
            lambda ref: {"output": [message_item("Done.")]},
        ]
    )
    assert client.responses.create(**restore_request("bare")).output_text == "Done."
    second = model.requests[1]["input"]
    assert [item.get("type") for item in second[-2:]] == ["function_call", "function_call_output"]
    assert not any(item.get("id") == "rs_bare" for item in second)
