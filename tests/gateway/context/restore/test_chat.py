"""The restore loop on OpenAI chat completions. Through the gateway: the context_restore
tool added once a conversation has refs and kept; the model's restore calls answered by the
gateway, scripted here in the mock upstream, so the client sees only the final answer,
streamed or not, with the usage of every round added up. Then the streamed loop on
hand-made streams: the shapes providers really send (text in the finish chunk, running
usage totals, a call's name arriving late, no index)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson

from gateway.context import restore
from gateway.context.restore import RESTORE_TOOL_NAME, Restorer
from gateway.http.sse import event_data
from gateway.store import MemoryStore
from pipelines import TokenCounter
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, SSEReply, chat_completion, events_of

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
OUTPUT = "".join(
    f"booking BK{i:04d}: passenger {i}, seat {i % 30}C, status confirmed\n" for i in range(60)
)
POLICY = {"x-contextgate-policy": "filter-tokens=300"}
CLIENT_TOOL = {
    "type": "function",
    "function": {"name": "cancel_booking", "parameters": {"type": "object", "properties": {}}},
}


def history(conversation: str = "c") -> list[dict[str, Any]]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "list_bookings", "arguments": "{}"},
    }
    return [
        {"role": "user", "content": f"[{conversation}] Which booking is in seat 7C?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": OUTPUT},
    ]


def restore_call(ref: str, call_id: str = "r1") -> dict[str, Any]:
    arguments = orjson.dumps({"ref": ref}).decode()
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": RESTORE_TOOL_NAME, "arguments": arguments},
    }


def calling(
    *calls: dict[str, Any], prompt: int = 500, content: str | None = None
) -> dict[str, Any]:
    reply = chat_completion()
    reply["choices"][0]["message"] = {
        "role": "assistant",
        "content": content,
        "tool_calls": list(calls),
    }
    reply["choices"][0]["finish_reason"] = "tool_calls"
    reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
    return reply


def answer(text: str, prompt: int) -> dict[str, Any]:
    reply = chat_completion(text)
    reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}
    return reply


def the_ref(upstream: MockUpstream) -> str:
    found = REF.search(orjson.dumps(upstream.received[0].json()["messages"]).decode())
    assert found is not None
    return found.group()


def client(gateway: GatewayServer, key: str = "sk-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)


def test_the_model_restores_and_the_client_sees_only_the_answer(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    replies: list[dict[str, Any]] = []

    def script(received: Any) -> JSONReply:
        body = received.json()
        if not replies:
            replies.append(body)
            ref = REF.search(orjson.dumps(body["messages"]).decode()).group()  # type: ignore[union-attr]
            return JSONReply(calling(restore_call(ref), prompt=500))
        replies.append(body)
        return JSONReply(answer("Seat 7C is booking BK0007.", prompt=900))

    upstream.handler = script
    with client(gateway) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=history("plain"), extra_headers=POLICY
        )
    completion = raw.parse()
    assert completion.choices[0].message.content == "Seat 7C is booking BK0007."
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1_400, 28)
    assert raw.headers["x-contextgate-restore"] == "rounds=1, calls=1"
    first, second = replies
    assert [t["function"]["name"] for t in first["tools"]] == [RESTORE_TOOL_NAME]
    restored = second["messages"][-1]
    assert restored["role"] == "tool"
    assert restored["tool_call_id"] == "r1"
    assert restored["content"] == OUTPUT  # the exact original, whole (under 2,000 tokens)
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == RESTORE_TOOL_NAME


def test_streamed_restore_is_one_stream_with_summed_usage(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Text streams through at once; the restore call's deltas (its arguments in two
    pieces) never reach the client; the second round continues the same stream."""
    base = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def usage(prompt: int) -> dict[str, Any]:
        return {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5},
        }

    seen: list[dict[str, Any]] = []

    def script(received: Any) -> SSEReply:
        body = received.json()
        seen.append(body)
        if len(seen) == 1:
            ref = REF.search(orjson.dumps(body["messages"]).decode()).group()  # type: ignore[union-attr]
            arguments = orjson.dumps({"ref": ref}).decode()
            return SSEReply(
                events_of(
                    [
                        chunk({"role": "assistant", "content": "Let me look. "}),
                        chunk(
                            {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "r1",
                                        "type": "function",
                                        "function": {
                                            "name": RESTORE_TOOL_NAME,
                                            "arguments": arguments[:10],
                                        },
                                    }
                                ]
                            }
                        ),
                        chunk(
                            {
                                "tool_calls": [
                                    {"index": 0, "function": {"arguments": arguments[10:]}}
                                ]
                            }
                        ),
                        chunk({}, "tool_calls"),
                        usage(500),
                    ]
                )
            )
        return SSEReply(
            events_of(
                [
                    {**chunk({"role": "assistant", "content": "It is BK0007."}), "id": "other"},
                    chunk({}, "stop"),
                    usage(900),
                ]
            )
        )

    upstream.handler = script
    with client(gateway) as sdk:
        stream = sdk.chat.completions.create(
            model="gpt-4o",
            messages=history("streamed"),  # type: ignore[arg-type]
            extra_headers=POLICY,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Let me look. It is BK0007."
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["stop"]
    usages = [c.usage for c in chunks if c.usage]
    assert len(usages) == 1
    assert (usages[0].prompt_tokens, usages[0].completion_tokens) == (1_400, 10)
    assert {c.id for c in chunks} == {"chatcmpl-r"}
    # One answer: the second round's role chunk is not repeated to the client.
    assert [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role] == [
        "assistant"
    ]
    assert seen[1]["messages"][-1]["content"] == OUTPUT


def test_mixed_calls_go_to_the_client_without_the_restore_call(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    def script(received: Any) -> JSONReply:
        ref = REF.search(orjson.dumps(received.json()["messages"]).decode()).group()  # type: ignore[union-attr]
        mine = {
            "id": "k1",
            "type": "function",
            "function": {"name": "cancel_booking", "arguments": "{}"},
        }
        return JSONReply(calling(restore_call(ref), mine))

    upstream.handler = script
    with client(gateway) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=history("mixed"),
            tools=[CLIENT_TOOL],
            extra_headers=POLICY,  # type: ignore[list-item]
        )
    message = raw.parse().choices[0].message
    assert [c.function.name for c in message.tool_calls or []] == ["cancel_booking"]  # type: ignore[union-attr]
    assert raw.headers["x-contextgate-restore"] == "rounds=0, calls=0, mixed=1"
    assert len(upstream.received) == 1
    tools = upstream.received[0].json()["tools"]
    assert [t["function"]["name"] for t in tools] == ["cancel_booking", RESTORE_TOOL_NAME]


def test_the_tool_stays_for_the_rest_of_the_conversation(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """Once added, the tool is sent on every later request of the conversation, even one
    whose history has no refs left, so the tools array does not change."""
    upstream.push(JSONReply(answer("ok", 10)), JSONReply(answer("ok", 10)))
    headers = {**POLICY, "x-contextgate-conversation": "kept-tool"}
    with client(gateway) as sdk:
        sdk.chat.completions.create(model="gpt-4o", messages=history("kept"), extra_headers=headers)  # type: ignore[arg-type]
        sdk.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "Thanks, that is all."}],
            extra_headers=headers,
        )
    first, second = (r.json() for r in upstream.received)
    assert REF.search(orjson.dumps(second["messages"]).decode()) is None
    assert first["tools"] == second["tools"]
    assert [t["function"]["name"] for t in second["tools"]] == [RESTORE_TOOL_NAME]


def test_no_refs_no_tool(gateway: GatewayServer, upstream: MockUpstream) -> None:
    upstream.push(JSONReply(answer("hi", 5)))
    with client(gateway) as sdk:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "tools" not in upstream.received[0].json()


def test_a_ref_of_another_key_is_not_restored(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The model is only ever given what the caller's own namespace holds."""
    upstream.push(JSONReply(answer("ok", 10)))
    with client(gateway, "sk-alice") as sdk:
        sdk.chat.completions.create(model="gpt-4o", messages=history("alice"), extra_headers=POLICY)  # type: ignore[arg-type]
    alices = the_ref(upstream)
    upstream.received.clear()
    replies = iter([JSONReply(calling(restore_call(alices))), JSONReply(answer("done", 10))])
    upstream.handler = lambda received: next(replies)
    with client(gateway, "sk-mallory") as sdk:
        sdk.chat.completions.create(
            model="gpt-4o", messages=history("mallory"), extra_headers=POLICY
        )  # type: ignore[arg-type]
    restored = upstream.received[1].json()["messages"][-1]["content"]
    assert "nothing is stored" in restored
    assert "BK0007" not in restored


def test_a_model_that_keeps_restoring_is_stopped(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    def script(received: Any) -> JSONReply:
        ref = REF.search(orjson.dumps(received.json()["messages"]).decode()).group()  # type: ignore[union-attr]
        return JSONReply(calling(restore_call(ref, f"r{len(upstream.received)}")))

    upstream.handler = script
    with client(gateway) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=history("loop"),
            extra_headers=POLICY,  # type: ignore[arg-type]
        )
    completion = raw.parse()
    assert len(upstream.received) == 4  # the request and 3 restore rounds
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content
    assert raw.headers["x-contextgate-restore"] == "rounds=3, calls=3, exhausted"


def test_a_removed_screenshot_is_restored_as_an_image(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """The media window removed the oldest screenshot; the model asks for it back and
    sees it again, byte for byte, as an image part."""
    import base64
    import os

    def screenshot() -> dict[str, Any]:
        data = base64.b64encode(os.urandom(60_000)).decode()
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}

    shots = [screenshot() for _ in range(3)]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": f"screen {n}"}, shot]}
        for n, shot in enumerate(shots)
    ]
    replies: list[dict[str, Any]] = []

    def script(received: Any) -> JSONReply:
        body = received.json()
        replies.append(body)
        if len(replies) == 1:
            ref = REF.search(orjson.dumps(body["messages"]).decode()).group()  # type: ignore[union-attr]
            return JSONReply(calling(restore_call(ref)))
        return JSONReply(answer("The first screen shows the login page.", 900))

    upstream.handler = script
    with client(gateway) as sdk:
        completion = sdk.chat.completions.create(model="gpt-4o", messages=messages)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "The first screen shows the login page."
    first_sent = replies[0]["messages"][0]["content"]
    assert shots[0] not in first_sent  # offloaded by the media window
    restored = replies[1]["messages"][-1]
    assert restored["role"] == "user"
    assert restored["content"][1] == shots[0]


def test_a_success_that_is_not_json_is_relayed_as_it_is(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    upstream.push(JSONReply(b"<html>ok</html>", headers={"content-type": "text/html"}))  # type: ignore[arg-type]
    import httpx

    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "gpt-4o", "messages": history("html")},
        headers={"authorization": "Bearer sk-alice", **POLICY},
    )
    assert response.status_code == 200
    assert response.content == b"<html>ok</html>"


# -- the streamed loop on hand-made streams --------------------------------------------------

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {**BASE, "choices": choices, **extra}


async def events(*chunks: dict[str, Any]) -> AsyncIterator[bytes]:
    for item in chunks:
        yield b"data: " + orjson.dumps(item) + b"\n\n"
    yield b"data: [DONE]\n\n"


async def run(rounds: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], int, list[Any]]:
    """Relay ``rounds`` (the first is the answer, the rest answer each resend); the
    chunks the client got, the number of [DONE]s, and what each resend appended."""
    store = MemoryStore()
    ref = await store.put("ns", b"the stored text\n", ttl=60)
    restorer = Restorer(store, "ns", TokenCounter())
    resent: list[Any] = []
    later = iter(rounds[1:])

    async def resend(extra: list[dict[str, Any]]) -> tuple[bytes, AsyncIterator[bytes]]:
        resent.append(extra)
        stream = events(*next(later))
        return await stream.__anext__(), stream

    rounds = [[_with_ref(c, ref) for c in r] for r in rounds]
    first_stream = events(*rounds[0])
    first = await first_stream.__anext__()
    out, done = [], 0
    async for event in restore.stream(first, first_stream, restorer, resend):
        data = event_data(event)
        if data == b"[DONE]":
            done += 1
        else:
            out.append(orjson.loads(data))
    return out, done, resent


def _with_ref(item: dict[str, Any], ref: str) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(item).replace(b"REF", ref.encode()))


def restore_delta(
    index: int | None = 0, name: bool = True, arguments: str = '{"ref": "REF"}'
) -> dict[str, Any]:
    part: dict[str, Any] = {"id": "r1", "type": "function", "function": {"arguments": arguments}}
    if name:
        part["function"]["name"] = RESTORE_TOOL_NAME
    if index is not None:
        part["index"] = index
    return part


def text_of(out: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in out if c.get("choices"))


def tool_names(out: list[dict[str, Any]]) -> list[str]:
    return [
        part["function"]["name"]
        for c in out
        for choice in c.get("choices", [])
        for part in choice["delta"].get("tool_calls") or []
        if part.get("function", {}).get("name")
    ]


async def test_text_in_the_finish_chunk_of_a_restore_round_is_not_lost() -> None:
    out, done, resent = await run(
        [
            [chunk({"content": "Let me check. ", "tool_calls": [restore_delta()]}, "tool_calls")],
            [chunk({"content": "Answer."}), chunk({}, "stop")],
        ]
    )
    assert text_of(out) == "Let me check. Answer."
    assert done == 1
    assert [
        c["choices"][0]["finish_reason"]
        for c in out
        if c.get("choices") and c["choices"][0]["finish_reason"]
    ] == ["stop"]
    assert resent[0][-1]["content"] == "the stored text\n"


async def test_running_usage_totals_are_not_added_up_within_a_round() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
    out, _, _ = await run(
        [
            [
                chunk({"content": "a"}, usage=usage),
                chunk({"content": "b"}, usage=usage),
                chunk({}, "stop", usage=usage),
            ],
        ]
    )
    totals = [c["usage"] for c in out if c.get("usage")]
    assert totals == [usage]


async def test_usage_stays_where_the_upstream_put_it() -> None:
    """Usage the upstream put on its finish chunk (unasked, as some providers do) comes back
    on the finish chunk, with no chunk without choices the client did not ask for; usage
    the upstream sent in a chunk of its own (``include_usage``) comes back so."""
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
    on_finish, _, _ = await run([[chunk({"content": "a"}), chunk({}, "stop", usage=usage)]])
    assert all(c["choices"] for c in on_finish)
    assert on_finish[-1]["usage"] == usage
    assert on_finish[-1]["choices"][0]["finish_reason"] == "stop"
    apart, _, _ = await run([[chunk({"content": "a"}), chunk({}, "stop"), chunk(usage=usage)]])
    assert apart[-1] == {**BASE, "choices": [], "usage": usage}


async def test_a_call_whose_name_comes_late_is_still_recognised() -> None:
    out, _, resent = await run(
        [
            [
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "r1",
                                "type": "function",
                                "function": {"arguments": ""},
                            }
                        ]
                    }
                ),
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "function": {
                                    "name": RESTORE_TOOL_NAME,
                                    "arguments": '{"ref": "REF"}',
                                },
                            }
                        ]
                    }
                ),
                chunk({}, "tool_calls"),
            ],
            [chunk({"content": "Done."}), chunk({}, "stop")],
        ]
    )
    assert RESTORE_TOOL_NAME not in tool_names(out)
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in out if c.get("choices"))
    assert text_of(out) == "Done."
    assert len(resent) == 1


async def test_calls_without_an_index_are_kept_apart() -> None:
    client_call = {
        "id": "k1",
        "type": "function",
        "function": {"name": "search", "arguments": "{}"},
    }
    out, _, resent = await run(
        [
            [chunk({"tool_calls": [client_call, restore_delta(index=None)]}, "tool_calls")],
        ]
    )
    assert tool_names(out) == ["search"]
    assert resent == []  # a client call is in the answer: it goes to the client
