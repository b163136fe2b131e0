"""Native context management after a review: what the reviewer's scripts found (a 500 for
a malformed edit or a policy stepped back past its ranges, compaction blocks taken from
objects that were not checkpoints, a retried request that lost the client's edits,
placeholders cleared twice, a locked filter given up, the conversation's record forked by
an expansion, ``native=prefer`` missing on the Responses WebSocket), each as a user would
see it, through real sockets with the official SDKs as clients."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.conftest import settings_for
from tests.gateway.routes.test_native_compaction import BETAS, COMPACT, PAUSED, Models, history
from tests.gateway.routes.test_native_edits import (
    CLEAR_4_KEEP_1,
    READ,
    chat_history,
    tool_history,
)
from tests.harness import GatewayServer
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    WSReply,
    message_item,
    response_body,
    response_events,
    response_usage,
)

KEY = "sk-ant-mine"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
MARK = "contextgate.compaction.v1:"
CLEARED = "cleared to save context"
OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


@pytest.fixture
def models(upstream: MockUpstream) -> Models:
    upstream.handler = handler = Models()
    return handler


@pytest.fixture
def client(anthropic_gateway: GatewayServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=anthropic_gateway.url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def chat_client(anthropic_gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=anthropic_gateway.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def namespace(gateway: GatewayServer, key: str = KEY) -> str:
    return asyncio.run(gateway.app.state.gateway.stores.namespace_of(key))


def restored(gateway: GatewayServer, ref: str) -> httpx.Response:
    return httpx.get(f"{gateway.base_url}/context/objects/{ref}", headers={"x-api-key": KEY})


def follow_up(turns: list[Any], answer: Any, result: str = "done") -> list[Any]:
    """``turns``, the answer as the client sends it back, and the result of its tool use."""
    use = answer.content[-1]
    return [
        *turns,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}],
        },
    ]


# -- 1. an edit type that is not a string -------------------------------------------------


@pytest.mark.parametrize("kind", [["clear_tool_uses_20250919"], {"x": 1}])
def test_an_edit_type_that_is_not_a_string_is_a_400_never_a_500(
    models: Models, client: anthropic.Anthropic, chat_client: openai.OpenAI, kind: Any
) -> None:
    """``edits[0].type`` a list or an object: to an OpenAI-compatible model the gateway
    refuses it in Anthropic's envelope naming the field; to Claude the request goes up and
    Claude's own 400 comes back; on the chat route it is OpenAI's 400 naming the field.
    Before, each was the gateway's 500."""
    management: Any = {"edits": [{"type": kind}]}
    for model in ("gpt-4o", "claude-sonnet-4-6"):
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.beta.messages.create(
                model=model,
                max_tokens=10,
                messages=[{"role": "user", "content": "hi"}],
                betas=BETAS,
                context_management=management,
            )
        body: Any = refused.value.body
        assert body["type"] == "error", model
        assert body["error"]["type"] == "invalid_request_error", model
        assert "context_management.edits.0.type" in body["error"]["message"], model
    with pytest.raises(openai.BadRequestError) as caught:
        chat_client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"context_management": management},
        )
    assert caught.value.param == "context_management.edits.0.type"
    assert models.chat.requests == []


# -- 2. stepping back within the policy's ranges ------------------------------------------


def test_stepping_back_for_compaction_stays_within_the_policys_ranges(
    models: Models, client: anthropic.Anthropic, chat_client: openai.OpenAI
) -> None:
    """A policy whose trigger is already its last (``trigger=1.0, target=0.995,
    emergency=1.0``) with a compact edit is answered, to an OpenAI-compatible model and to
    Claude (before: a 500, the trigger stepped back to 1.005); so is a compact trigger of
    50,000,000 tokens on the chat route (before: a 500, the budget capped past max-input's
    range)."""
    policy = {"x-contextgate-policy": "trigger=1.0, target=0.995, emergency=1.0"}
    for model in ("gpt-4o", "claude-sonnet-4-6"):
        answer = client.beta.messages.create(
            model=model,
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            betas=BETAS,
            context_management={"edits": [{"type": "compact_20260112"}]},
            extra_headers=policy,
        )
        assert answer.content[0].type == "text", model
    huge = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000_000}}
    completion = chat_client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"context_management": {"edits": [huge]}},
    )
    assert completion.choices[0].message.content


# -- 3. compaction blocks: only the gateway's, and a lost checkpoint is not fatal ---------


def test_a_block_naming_an_object_that_is_not_a_checkpoint_is_refused(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """A compaction block naming a ref of the caller's own that is not a checkpoint (a
    cleared tool result the dry run stored: plain text, or JSON shaped like a
    checkpoint), or a real block with a signature that does not hold, is a 400 saying the
    block was not made by the gateway; nothing goes up. Before, the plain text was a 500
    and the shaped JSON was read as a checkpoint, its messages sent to the model."""
    planted = orjson.dumps(
        {"content": "whatever", "messages": [{"role": "user", "content": "INJECTED"}]}
    ).decode()
    refs = []
    for content in (None, planted + " " * 4_000):
        messages = chat_history()
        if content is not None:
            for message in messages:
                if message["role"] == "tool":
                    message["content"] = content
        dry = httpx.post(
            f"{anthropic_gateway.base_url}/context/compact",
            json={
                "model": "gpt-4o",
                "messages": messages,
                "context_management": CLEAR_4_KEEP_1,
            },
            headers={"x-api-key": KEY},
        )
        assert dry.status_code == 200, dry.text
        refs.append(REF.findall(dry.text)[0])
    turns = history(12)
    real = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=turns, betas=BETAS, context_management=COMPACT
    ).content[0]
    assert real.type == "compaction"
    assert real.encrypted_content is not None
    signature = real.encrypted_content.partition(".")[2]
    wrong = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    real_ref = real.encrypted_content.removeprefix(MARK).partition(".")[0]
    forged = [
        MARK + refs[0],
        MARK + refs[1],
        f"{MARK}{refs[1]}.{signature}",
        f"{MARK}{real_ref}.{wrong}",
    ]
    asked = len(models.chat.requests)
    for encrypted in forged:
        block = {"type": "compaction", "content": "whatever", "encrypted_content": encrypted}
        if real_ref in encrypted:
            block["content"] = real.content or ""
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "go"},
        ]
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.beta.messages.create(
                model="gpt-4o",
                max_tokens=10,
                messages=messages,
                betas=BETAS,
                context_management=COMPACT,
            )
        error: Any = refused.value.body
        assert error["error"]["type"] == "invalid_request_error", encrypted
        assert "not made by this gateway" in error["error"]["message"], encrypted
    assert len(models.chat.requests) == asked


def test_a_block_whose_checkpoint_is_gone_stands_for_its_summary(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """The gateway's own block sent back after its checkpoint left the store (expired
    after offload-ttl, or the store lost it): the session goes on. A client that still
    sends the history the block replaced has that history compacted again, nothing lost;
    one that dropped it has the block's summary, which quotes the task and the latest
    request, read as recalled context. Before, a 400 stopped the session."""
    turns = history(12)
    answer = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=turns, betas=BETAS, context_management=COMPACT
    )
    block = answer.content[0]
    assert block.type == "compaction"
    assert block.encrypted_content is not None
    assert block.content is not None
    assert "Task: audit the build logs." in block.content
    ref = block.encrypted_content.removeprefix(MARK).partition(".")[0]
    objects = anthropic_gateway.app.state.gateway.stores.objects
    objects._drop((namespace(anthropic_gateway), ref))
    assert restored(anthropic_gateway, ref).status_code == 404
    whole = follow_up(turns, answer)
    again = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=whole, betas=BETAS, context_management=COMPACT
    )
    assert again.content
    went_up = orjson.dumps(models.chat.requests[-1]["messages"]).decode()
    assert "[Recalled context" not in went_up
    assert "Task: audit the build logs." in went_up  # the client's history, compacted again
    dropped = whole[-2:]  # the block's turn and what follows it
    client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=dropped, betas=BETAS, context_management=COMPACT
    )
    sent = models.chat.requests[-1]["messages"]
    recalled = [
        m
        for m in sent
        if m["role"] == "user"
        and isinstance(m["content"], str)
        and m["content"].startswith("[Recalled context")
    ]
    assert len(recalled) == 1
    assert block.content in recalled[0]["content"]


# -- 4. the overflow retry keeps the client's edits ---------------------------------------


def test_the_overflow_retry_keeps_the_cleared_placeholders_and_reports_them(
    models: Models, client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """The upstream refuses the first attempt as too long for its window; the retried,
    smaller request still has the tool results the client's edit cleared as placeholders
    (before: the client's outputs went up again, verbatim), and the answer's applied edits
    and the gateway's actions describe that request."""
    management: Any = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 2},
                "keep": {"type": "tool_uses", "value": 16},
            }
        ]
    }
    upstream.push(JSONReply(OVERFLOW, status=400))
    raw = client.beta.messages.with_raw_response.create(
        model="gpt-4o",
        max_tokens=50,
        messages=tool_history(20),
        tools=[READ],  # type: ignore[list-item]
        betas=BETAS,
        context_management=management,
    )
    answer = raw.parse()
    first, retried = (r.json() for r in upstream.received if r.path == "/v1/chat/completions")
    assert len(orjson.dumps(retried)) < len(orjson.dumps(first)) // 2
    assert models.chat.requests == [retried]
    cleared = {f"toolu_{i:02d}" for i in range(4)}
    tools = [m for m in retried["messages"] if m["role"] == "tool"]
    sent = orjson.dumps(retried["messages"]).decode()
    assert [m for m in tools if m["tool_call_id"] in cleared]
    for message in tools:
        if message["tool_call_id"] in cleared:
            assert CLEARED in message["content"]
    for i in range(4):
        assert f"line {i}.59" not in sent
    assert answer.context_management is not None
    (edit,) = answer.context_management.applied_edits
    assert edit.type == "clear_tool_uses_20250919"
    assert edit.cleared_tool_uses == 4
    assert "native_edits" in raw.headers["x-contextgate-actions"].split(", ")


COMPACT_30K = {
    "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 30_000}}]
}


def retried_compaction(client: anthropic.Anthropic, upstream: Any) -> tuple[Any, Any]:
    """A 60-turn history whose compaction (due at 30,000 tokens) the upstream first refuses
    as too long: its turns, and the answer, which begins with the compaction block."""
    turns = history(60)
    upstream.push(JSONReply(OVERFLOW, status=400))
    answer = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=turns, betas=BETAS, context_management=COMPACT_30K
    )
    assert answer.content[0].type == "compaction"
    return turns, answer


def test_the_block_of_a_retried_compaction_names_what_went_up_then(
    models: Models, client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """A compaction the upstream refuses as still too long is compacted again and
    retried: the block the client gets names that smaller request's checkpoint, so sent
    back it expands to what the model last read (before: to the first, refused one)."""
    turns, answer = retried_compaction(client, upstream)
    first, retried = (r.json() for r in upstream.received if r.path == "/v1/chat/completions")
    assert len(retried["messages"]) < len(first["messages"])
    client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=follow_up(turns, answer),
        betas=BETAS,
        context_management=COMPACT_30K,
    )
    went_up = models.chat.requests[-1]["messages"]
    assert went_up[: len(retried["messages"])] == retried["messages"]
    assert len(went_up) == len(retried["messages"]) + 2


# -- 5. placeholders are not cleared again -------------------------------------------------


def test_placeholders_from_a_checkpoint_are_not_cleared_again(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """After a compaction block is expanded, the placeholders its checkpoint holds are
    left as they are: every placeholder that goes up restores the client's own tool
    output (before: one restored another placeholder), and ``cleared_tool_uses`` counts
    only the tool uses cleared on this request."""
    first_edits = [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 8},
        },
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 5_000}},
    ]
    turns = history(12)
    answer = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=turns,
        betas=BETAS,
        context_management={"edits": first_edits},
    )
    assert answer.content[0].type == "compaction"
    checkpoint = models.chat.requests[-1]["messages"]
    before = {m["content"] for m in checkpoint if m["role"] == "tool" and CLEARED in m["content"]}
    assert before
    keep_one = {**first_edits[0], "keep": {"type": "tool_uses", "value": 1}}
    again = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=follow_up(turns, answer, "done " * 10),
        betas=BETAS,
        context_management={"edits": [keep_one, first_edits[1]]},
    )
    sent = [m for m in models.chat.requests[-1]["messages"] if m["role"] == "tool"]
    placeholders = [m for m in sent if CLEARED in m["content"]]
    assert placeholders
    for message in placeholders:
        step = int(message["tool_call_id"].removeprefix("toolu_"))
        (ref,) = REF.findall(message["content"])
        got = restored(anthropic_gateway, ref)
        assert got.status_code == 200
        assert got.text.startswith(f"part {step}: "), got.text[:100]
        assert got.text == turns[2 + 2 * step]["content"][0]["content"]
    assert again.context_management is not None
    (edit, *_) = again.context_management.applied_edits
    assert edit.type == "clear_tool_uses_20250919"
    new = [m for m in placeholders if m["content"] not in before]
    assert edit.cleared_tool_uses == len(new)


# -- 6. a locked filter stays ---------------------------------------------------------------


def test_a_filter_the_configuration_locks_stays_under_clear_tool_uses(
    upstream: MockUpstream,
) -> None:
    """With ``filter-tokens`` set and locked by the gateway's configuration, a huge tool
    output is filtered whether or not the request carries ``clear_tool_uses`` (before:
    the edit stepped the filter back and the whole output went up)."""
    big = "\n".join(f"row {i}: " + "x" * 40 for i in range(1_500))
    messages: Any = [
        {"role": "user", "content": "Read it."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": big},
                {"type": "text", "text": "Summarise."},
            ],
        },
    ]
    never: Any = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 10**12},
            }
        ]
    }
    upstream.handler = Models()
    settings = settings_for(
        upstream, policy={"filter-tokens": 1000}, bounds={"filter-tokens": False}
    )
    with (
        GatewayServer(settings) as gateway,
        anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as sdk,
    ):
        for extra in ({}, {"context_management": never, "betas": BETAS}):
            raw = sdk.beta.messages.with_raw_response.create(
                model="gpt-4o",
                max_tokens=50,
                messages=messages,
                tools=[READ],  # type: ignore[list-item]
                **extra,
            )
            sent = [r for r in upstream.received if r.path == "/v1/chat/completions"][-1].json()
            (tool,) = [m for m in sent["messages"] if m["role"] == "tool"]
            assert len(tool["content"]) < len(big) // 10, extra
            assert "filter" in raw.headers["x-contextgate-actions"].split(", "), extra


# -- 7. the conversation keeps its identity across an expansion ---------------------------


PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
        "0000000d4944415478da63f8ffff3f0005fe02fea7d6a4c30000000049454e44ae426082"
    )
).decode()


def records(gateway: GatewayServer, key: str = KEY) -> dict[str, Any]:
    """The caller's conversation records, by conversation id."""
    found = gateway.app.state.gateway.stores.conversations._records
    space = namespace(gateway, key)
    return {c: entry[1] for (n, c), entry in list(found.items()) if n == space}


def expanded_twice(
    models: Models, client: anthropic.Anthropic, gateway: GatewayServer
) -> tuple[str, Any, Any, str]:
    """A conversation compacted by the gateway, its first message an image the checkpoint
    holds offloaded, then the block sent back: its id, its record after each request, and
    the id of the second answer."""
    turns = history(12)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    turns[0]["content"].insert(0, image)
    policy = {"x-contextgate-policy": "keep-images=0"}
    answer = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=turns,
        betas=BETAS,
        context_management=COMPACT,
        extra_headers=policy,
    )
    assert answer.content[0].type == "compaction"
    checkpoint = models.chat.requests[-1]["messages"]
    assert "image_url" not in orjson.dumps(checkpoint[0]).decode()  # the first message differs
    deadline = time.monotonic() + 5
    while not (first := records(gateway)) and time.monotonic() < deadline:
        time.sleep(0.02)
    ((conversation, state),) = first.items()
    again = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=follow_up(turns, answer),
        betas=BETAS,
        context_management=COMPACT,
        extra_headers=policy,
    )
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        after = records(gateway)
        if len(after) > 1 or after[conversation] is not state:
            break
        time.sleep(0.02)
    time.sleep(0.1)  # a second record, were one written, is written by now
    return conversation, state, records(gateway), again.id


def test_the_conversation_keeps_its_identity_across_an_expansion(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """The gateway's block sent back stands for a checkpoint whose first message differs
    from the client's (its image offloaded): the request is still the same conversation,
    its record the one the gateway updates, and no new record appears (before: a record
    of its own, the conversation's state started afresh under another id)."""
    conversation, _, after, answer_id = expanded_twice(models, client, anthropic_gateway)
    assert list(after) == [conversation]
    assert answer_id in after[conversation].answer_ids


def test_the_conversations_record_keeps_counting_across_an_expansion(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """Across the expansion the record carries on: one more call, the compaction's edit
    still counted, the first answer's id still known."""
    conversation, before, after, _ = expanded_twice(models, client, anthropic_gateway)
    assert list(after) == [conversation]
    state = after[conversation]
    assert state.calls == before.calls + 1
    assert state.native_edits >= before.native_edits == 1
    assert set(before.answer_ids) <= set(state.answer_ids)


# -- 8. native=prefer on the Responses WebSocket -------------------------------------------


async def test_prefer_on_the_responses_websocket_sends_the_providers_compaction(
    anthropic_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """``native=prefer`` over the Responses WebSocket, a request the pipeline leaves
    alone: it goes up with the provider's compaction at the gateway's trigger, as over
    HTTP (before: as the client sent it, without)."""
    body = response_body("gpt-4o", [message_item("one")], usage=response_usage())
    upstream.push(WSReply(response_events(body)))
    policy = {"x-contextgate-policy": "native=prefer, max-input=100000"}
    async with (
        openai.AsyncOpenAI(base_url=anthropic_gateway.base_url, api_key="sk-mine") as sdk,
        sdk.responses.connect(extra_headers=policy) as connection,
    ):
        await connection.response.create(model="gpt-4o", input="Hi", store=False)
        async for event in connection:
            if event.type in ("response.completed", "response.failed", "error"):
                break
    assert event.type == "response.completed"
    (sent,) = [r.json() for r in upstream.received if r.method == "WS"]
    assert sent["input"] == "Hi"
    assert sent["context_management"] == [{"type": "compaction", "compact_threshold": 70_000}]


def settled(gateway: GatewayServer, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The caller's records once the background write of the last request has landed."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        found = records(gateway)
        if found and found != before:
            return found
        time.sleep(0.02)
    return records(gateway)


def test_the_record_carries_on_after_a_retried_or_paused_compaction(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer, upstream: Any
) -> None:
    """A compaction made again after an upstream overflow, and one answered paused
    without the model, leave a record the next request (its block expanded) continues:
    one more call, the earlier answers' ids kept, no second record."""
    turns, answer = retried_compaction(client, upstream)
    ((conversation, first),) = settled(anthropic_gateway).items()
    client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=follow_up(turns, answer),
        betas=BETAS,
        context_management=COMPACT_30K,
    )
    after = settled(anthropic_gateway, {conversation: first})
    assert list(after) == [conversation]
    assert after[conversation].calls == first.calls + 1
    assert set(first.answer_ids) <= set(after[conversation].answer_ids)


def test_a_paused_compaction_is_recorded(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """A compaction answered paused (no model asked) is the conversation's call: its
    record counts it and its edit, and takes the checkpoint as the history sent, its
    cuts (which indexed the client's longer history) made anew."""
    turns = history(12)
    paused = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=turns, betas=BETAS, context_management=PAUSED
    )
    assert paused.stop_reason == "compaction"
    ((_, state),) = settled(anthropic_gateway).items()
    assert state.calls == 1
    assert state.native_edits == 1
    assert state.seen < len(turns)
    assert (state.compacted_cut, state.soft_cut, state.archive_cut) == (0, 0, 0)
