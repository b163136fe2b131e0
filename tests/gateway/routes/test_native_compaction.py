"""Compaction the provider makes, honoured and preferred, and the gateway's own where the
provider cannot (``gateway.context.compaction_block``): the official SDKs' beta calls
through real sockets, the mock upstream playing Claude (``tests.mock_models.ClaudeModel``,
which applies Anthropic's edits as the API does), an OpenAI-compatible model and the
Responses API."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from pipelines.cache_break import without_markers
from tests.harness import GatewayServer
from tests.mock_models import ChatModel, ClaudeModel
from tests.mock_upstream import MockUpstream, Received, Reply, ResponsesRoutes, compaction_item

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
BETAS = ["context-management-2025-06-27", "compact-2026-01-12"]
COMPACT = {
    "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 8_000}}]
}
PAUSED = {
    "edits": [
        {
            "type": "compact_20260112",
            "trigger": {"type": "input_tokens", "value": 8_000},
            "pause_after_compaction": True,
        }
    ]
}


def history(steps: int) -> list[dict[str, Any]]:
    """A Messages history of ``steps`` tool rounds of about 600 tokens each, ending with
    the latest tool result and a request for one more command."""
    task = [{"type": "text", "text": "Task: audit the build logs."}]
    turns: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for step in range(steps):
        use = f"toolu_{step:04d}"
        turns.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading part {step}."},
                    {
                        "type": "tool_use",
                        "id": use,
                        "name": "Bash",
                        "input": {"cmd": f"cat {step}"},
                    },
                ],
            }
        )
        output = f"part {step}: " + " ".join(f"line-{step}-{n}" for n in range(300))
        turns.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use, "content": output}],
            }
        )
    turns[-1]["content"].append({"type": "text", "text": "RUN: echo done"})
    return turns


class Models:
    """The mock's handler: Claude for ``claude-*``, an OpenAI-compatible model otherwise."""

    def __init__(self) -> None:
        self.claude, self.chat = ClaudeModel(), ChatModel()

    def __call__(self, received: Received) -> Reply | None:
        return self.claude(received) or self.chat(received)


@pytest.fixture
def models(upstream: MockUpstream) -> Models:
    upstream.handler = handler = Models()
    return handler


@pytest.fixture
def client(anthropic_gateway: GatewayServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=anthropic_gateway.url, api_key="sk-ant-mine", max_retries=0
    ) as sdk:
        yield sdk


def sent_chat(models: Models) -> dict[str, Any]:
    return models.chat.requests[-1]


def test_the_gateway_compacts_for_an_openai_model_and_takes_its_block_back(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """Over the client's trigger, an OpenAI-compatible model behind /v1/messages gets a
    compacted request and the client a compaction block first in the answer, typed by the
    SDK; sent back, the block stands for what the model read: the history before it is
    not sent again, the compaction's note restores what it replaced."""
    turns = history(12)
    raw = client.beta.messages.with_raw_response.create(
        model="gpt-4o", max_tokens=200, messages=turns, betas=BETAS, context_management=COMPACT
    )
    answer = raw.parse()
    before, after = (int(v.split("=")[1]) for v in raw.headers["x-contextgate-tokens"].split(", "))
    assert before > 8_000 > after
    assert "context_management" not in sent_chat(models)
    block = answer.content[0]
    assert block.type == "compaction"
    assert block.encrypted_content is not None
    assert block.encrypted_content.startswith("contextgate.compaction.v1:ctx_")
    assert block.content is not None
    assert "compaction" in block.content
    assert [b.type for b in answer.content[1:]] == ["tool_use"]
    compacted = sent_chat(models)["messages"]
    # What the compaction shortened names its refs; each restores the client's bytes.
    refs = REF.findall(orjson.dumps(compacted).decode())
    assert refs
    for ref in refs:
        stored = httpx.get(
            f"{anthropic_gateway.url}/v1/context/objects/{ref}",
            headers={"x-api-key": "sk-ant-mine"},
        )
        assert stored.status_code == 200
        assert "-299" in stored.text

    use = answer.content[1]
    follow = [
        *turns,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"}],
        },
    ]
    again = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=follow, betas=BETAS, context_management=COMPACT
    )
    assert [b.type for b in again.content] == ["text"]
    went_up = sent_chat(models)["messages"]
    # What precedes the block is the checkpoint, not the client's history again.
    assert went_up[: len(compacted)] == compacted
    assert len(went_up) == len(compacted) + 2
    assert "line-5-299" not in orjson.dumps(went_up).decode()


def test_the_compaction_streams_and_pauses(models: Models, client: anthropic.Anthropic) -> None:
    """Streamed, the block comes as Anthropic streams one (the SDK's accumulator builds
    it) before the model's own blocks; with ``pause_after_compaction`` the answer is the
    block alone, ``stop_reason: "compaction"``, and no model was asked."""
    with client.beta.messages.stream(
        model="gpt-4o",
        max_tokens=200,
        messages=history(12),
        betas=BETAS,
        context_management=COMPACT,
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["compaction", "tool_use"]
    asked = len(models.chat.requests)
    paused = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=history(12), betas=BETAS, context_management=PAUSED
    )
    assert paused.stop_reason == "compaction"
    assert [b.type for b in paused.content] == ["compaction"]
    with client.beta.messages.stream(
        model="gpt-4o", max_tokens=200, messages=history(12), betas=BETAS, context_management=PAUSED
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "compaction"
    assert streamed.content[0].type == "compaction"
    assert len(models.chat.requests) == asked


def forged(answer: Any, turns: list[dict[str, Any]], **changes: Any) -> list[dict[str, Any]]:
    block = {**answer.content[0].model_dump(exclude_none=True), **changes}
    return [*turns, {"role": "assistant", "content": [block]}, {"role": "user", "content": "go"}]


def test_a_block_the_gateway_did_not_make_for_this_key_is_refused(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer
) -> None:
    """A forged ref, another key's block, a changed summary and a provider's own block
    sent to a model the gateway compacts for: each a 400 in Anthropic's envelope saying
    so, never sent upstream."""
    turns = history(12)
    answer = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=turns, betas=BETAS, context_management=COMPACT
    )
    asked = len(models.chat.requests)
    cases = [
        forged(answer, turns, encrypted_content="contextgate.compaction.v1:ctx_" + "A" * 24),
        forged(answer, turns, content="A summary the client wrote."),
        forged(answer, turns, encrypted_content="EqQBCkgIARABGAIiQMock-anthropic-compaction"),
    ]
    for messages in cases:
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.beta.messages.create(
                model="gpt-4o",
                max_tokens=200,
                messages=messages,
                betas=BETAS,
                context_management=COMPACT,
            )
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        assert "compaction block" in refused.value.body["error"]["message"]
    with (
        anthropic.Anthropic(
            base_url=anthropic_gateway.url, api_key="sk-ant-someone-else", max_retries=0
        ) as other,
        pytest.raises(anthropic.BadRequestError),
    ):
        other.beta.messages.create(
            model="gpt-4o",
            max_tokens=200,
            messages=forged(answer, turns),
            betas=BETAS,
            context_management=COMPACT,
        )
    assert len(models.chat.requests) == asked


def test_claude_compacts_itself_and_the_gateway_relays_it(
    models: Models, client: anthropic.Anthropic
) -> None:
    """Honoured: to Claude the request goes with its context_management as sent, the
    gateway's own compaction steps back (the history reaches Claude whole), and Claude's
    compaction block and applied edits come back as Anthropic sent them; sent back, the
    block is left to Claude, which drops what precedes it."""
    turns = history(12)
    management = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 4},
                "keep": {"type": "tool_uses", "value": 8},
            },
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 4_000}},
        ]
    }
    raw = client.beta.messages.with_raw_response.create(
        model="claude-sonnet-4-6",
        max_tokens=200,
        messages=turns,
        betas=BETAS,
        context_management=management,
        extra_headers={"x-contextgate-policy": "max-input=22000"},
    )
    answer = raw.parse()
    assert models.claude.refusals == []
    sent = models.claude.requests[-1]
    assert sent["context_management"] == management
    assert without_markers(sent["messages"]) == turns  # neither compacted nor pruned by the gateway
    assert answer.content[0].type == "compaction"
    assert answer.context_management is not None
    assert answer.context_management.applied_edits[0].type == "clear_tool_uses_20250919"
    follow = [
        *turns,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
        {"role": "user", "content": "RUN: echo again"},
    ]
    client.beta.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=200,
        messages=follow,
        betas=BETAS,
        context_management=management,
        extra_headers={"x-contextgate-policy": "max-input=22000"},
    )
    assert models.claude.refusals == []
    block = models.claude.requests[-1]["messages"][-2]["content"][0]
    assert block == answer.content[0].model_dump(exclude_none=True) | {"type": "compaction"}


def test_without_context_management_the_gateway_compacts_as_before(
    models: Models, client: anthropic.Anthropic
) -> None:
    """The same history to Claude under the same budget with no context_management: the
    gateway compacts it itself (what the honoured request above was spared)."""
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-6",
        max_tokens=200,
        messages=history(12),
        extra_headers={"x-contextgate-policy": "max-input=22000"},
    )
    assert {"compress", "ttl_prune"} & set(raw.headers["x-contextgate-actions"].split(", "))
    assert without_markers(models.claude.requests[-1]["messages"]) != history(12)


def test_prefer_asks_claude_for_its_compaction(
    models: Models, client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """``native=prefer``: a request with no context_management goes to Claude with a
    compaction edit at the gateway's trigger of the budget and the compact beta, and the
    gateway writes no summary of its own; the dry run says why."""
    policy = {"x-contextgate-policy": "native=prefer, max-input=100000"}
    client.messages.create(
        model="claude-sonnet-4-6", max_tokens=200, messages=history(3), extra_headers=policy
    )
    sent = models.claude.requests[-1]
    assert sent["context_management"] == {
        "edits": [
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 70_000}}
        ]
    }
    received = [r for r in upstream.received if r.path.startswith("/v1/messages")][-1]
    assert "compact-2026-01-12" in received.headers["anthropic-beta"]
    # Below the provider's least trigger the gateway compacts itself.
    small = {"x-contextgate-policy": "native=prefer, max-input=22000"}
    client.messages.create(
        model="claude-sonnet-4-6", max_tokens=200, messages=history(12), extra_headers=small
    )
    assert "context_management" not in models.claude.requests[-1]


@pytest.fixture
def responses(upstream: MockUpstream) -> ResponsesRoutes:
    upstream.handler = handler = ResponsesRoutes()
    return handler


def responses_input(steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Task: audit the build logs."}]
    for step in range(steps):
        call = f"call_{step:04d}"
        items.append({"type": "function_call", "call_id": call, "name": "shell", "arguments": "{}"})
        output = f"part {step}: " + " ".join(f"line-{step}-{n}" for n in range(300))
        items.append({"type": "function_call_output", "call_id": call, "output": output})
    return items


def test_responses_compaction_is_honoured_and_preferred(
    responses: ResponsesRoutes, gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """On the Responses API the client's compaction goes up as sent, its compaction item
    untouched, and the gateway's own compaction steps back; with ``native=prefer`` a
    stateless request without one is sent with the gateway's, a stateful one without."""
    items = [compaction_item(), *responses_input(12)]
    management = [{"type": "compaction", "compact_threshold": 3_000}]
    tight = {"x-contextgate-policy": "max-input=22000"}
    with openai.OpenAI(base_url=gateway.base_url, api_key="sk-mine", max_retries=0) as client:
        honoured = client.responses.with_raw_response.create(
            model="gpt-4o",
            input=items,
            store=False,
            context_management=management,
            extra_headers=tight,
        )
        sent = orjson.loads(upstream.received[-1].body)
        assert sent["context_management"] == management
        assert sent["input"] == items
        assert "compress" not in honoured.headers["x-contextgate-actions"]
        plain = client.responses.with_raw_response.create(
            model="gpt-4o", input=items, store=False, extra_headers=tight
        )
        assert "compress" in plain.headers["x-contextgate-actions"]
        kept = orjson.loads(upstream.received[-1].body)["input"]
        assert kept[0] == compaction_item()  # pinned
        prefer = {"x-contextgate-policy": "native=prefer, max-input=100000"}
        client.responses.create(model="gpt-4o", input=items, store=False, extra_headers=prefer)
        sent = orjson.loads(upstream.received[-1].body)
        assert sent["context_management"] == [{"type": "compaction", "compact_threshold": 70_000}]
        first = client.responses.create(model="gpt-4o", input="hello", extra_headers=prefer)
        client.responses.create(
            model="gpt-4o", input="again", previous_response_id=first.id, extra_headers=prefer
        )
        assert "context_management" not in orjson.loads(upstream.received[-1].body)
    report = httpx.post(
        f"{gateway.base_url}/context/compact",
        json={"model": "gpt-4o", "input": items, "store": False, "context_management": management},
        headers={"authorization": "Bearer sk-mine"},
    ).json()["report"]
    assert report["native"]["mode"] == "honour"
    assert report["native"]["api"] == "openai"
    assert report["native"]["reason"]


def record_of(gateway: GatewayServer, key: str, conversation: str) -> Any:
    """The conversation's record as the gateway keeps it (written in the background)."""
    stores = gateway.app.state.gateway.stores

    async def read() -> Any:
        namespace = await stores.namespace_of(key)
        return await stores.conversations.get(namespace, "client:" + conversation)

    deadline = time.monotonic() + 5
    while (state := asyncio.run(read())) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return state


@pytest.mark.parametrize("stream", [False, True])
def test_the_conversations_record_counts_the_edits_applied(
    models: Models, client: anthropic.Anthropic, anthropic_gateway: GatewayServer, stream: bool
) -> None:
    """The edits applied to a conversation's context, by Claude (its applied edits and
    compaction, read from its answer, streamed or not) or by the gateway for a model that
    cannot, are kept in the conversation's record: known prefix changes."""
    management = {
        "edits": [
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 4}},
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1_000}},
        ]
    }
    for model, applied in (("claude-sonnet-4-6", 2), ("gpt-4o", 2)):
        name = f"native-{model}-{stream}"
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": 200,
            "messages": history(12),
            "betas": BETAS,
            "context_management": management,
            "extra_headers": {"x-contextgate-conversation": name},
        }
        if stream:
            with client.beta.messages.stream(**kwargs) as streamed:
                streamed.get_final_message()
        else:
            client.beta.messages.create(**kwargs)
        state = record_of(anthropic_gateway, "sk-ant-mine", name)
        assert state is not None
        assert state.native_edits == applied, model


def test_on_demand_compaction_and_a_paused_answer_keep_the_apis_contract(
    models: Models, client: anthropic.Anthropic
) -> None:
    """An on-demand compaction (``compaction: {"type": "summarize"}``) to a model the
    gateway compacts for answers the block alone without asking the model; a paused
    answer still reports the other edits applied; a block with null content (a failed
    compaction) is a no-op, not a refusal; count_tokens makes no new compaction and
    reports what the request counted before its edits."""
    asked = len(models.chat.requests)
    now = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=history(3),
        betas=["compact-2026-09-04"],
        extra_body={"compaction": {"type": "summarize"}},
    )
    assert now.stop_reason == "compaction"
    assert [b.type for b in now.content] == ["compaction"]
    assert len(models.chat.requests) == asked
    clearing = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 4},
                "keep": {"type": "tool_uses", "value": 10},
            },
            PAUSED["edits"][0],
        ]
    }
    paused = client.beta.messages.create(
        model="gpt-4o",
        max_tokens=200,
        messages=history(12),
        betas=BETAS,
        context_management=clearing,
    )
    assert paused.stop_reason == "compaction"
    assert paused.context_management is not None
    assert paused.context_management.applied_edits[0].type == "clear_tool_uses_20250919"
    failed = [
        *history(3),
        {"role": "assistant", "content": [{"type": "compaction", "content": None}]},
        {"role": "user", "content": "go on"},
    ]
    answer = client.beta.messages.create(
        model="gpt-4o", max_tokens=200, messages=failed, betas=BETAS, context_management=COMPACT
    )
    assert answer.content
    plain = client.beta.messages.count_tokens(model="gpt-4o", messages=history(12))
    counted = client.beta.messages.count_tokens(
        model="gpt-4o", messages=history(12), betas=BETAS, context_management=COMPACT
    )
    assert counted.input_tokens == plain.input_tokens  # no compaction made by a count
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == plain.input_tokens


def test_prefer_leaves_a_model_that_does_not_compact_to_the_gateway(
    models: Models, client: anthropic.Anthropic
) -> None:
    """``native=prefer`` asks only the Claude models that compact server-side (Opus and
    Sonnet from 4.6, every 5.x); an older model gets the gateway's own compaction."""
    policy = {"x-contextgate-policy": "native=prefer, max-input=100000"}
    client.messages.create(
        model="claude-haiku-4-5", max_tokens=200, messages=history(3), extra_headers=policy
    )
    assert "context_management" not in models.claude.requests[-1]


def test_prefer_adds_the_providers_compaction_to_the_clients_own_edits(
    models: Models, client: anthropic.Anthropic, upstream: MockUpstream
) -> None:
    """A client that asks Claude only to clear thinking (as Claude Code does on every
    request) still gets the provider's compaction under ``native=prefer``: its own edit
    first, as sent, the compaction after it."""
    thinking = {"type": "clear_thinking_20251015", "keep": "all"}
    client.beta.messages.create(
        model="claude-opus-5-5",
        max_tokens=200,
        messages=history(3),
        betas=["context-management-2025-06-27"],
        context_management={"edits": [thinking]},
        extra_headers={"x-contextgate-policy": "native=prefer, max-input=100000"},
    )
    sent = models.claude.requests[-1]["context_management"]
    trigger = {"type": "input_tokens", "value": 70_000}
    assert sent == {"edits": [thinking, {"type": "compact_20260112", "trigger": trigger}]}
    received = [r for r in upstream.received if r.path.startswith("/v1/messages")][-1]
    betas = received.headers["anthropic-beta"]
    assert "context-management-2025-06-27" in betas
    assert "compact-2026-01-12" in betas
