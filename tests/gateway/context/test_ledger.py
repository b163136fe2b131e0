"""Each request's ledger entry, as a user of the inspector reads it: the restore calls the
model made, screenshots moved out of the window, a stream's usage, the Responses API, and
the message-by-message account of what the client sent beside what went up."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from gateway.context.ledger import detail_of
from tests.conftest import settings_for
from tests.gateway.context.restore.test_chat import (
    OUTPUT,
    POLICY,
    REF,
    answer,
    calling,
    history,
    restore_call,
)
from tests.harness import GatewayServer
from tests.mock_upstream import (
    JSONReply,
    MockUpstream,
    SSEReply,
    chat_chunk,
    chat_completion,
    events_of,
)

KEY = "sk-ledger-reader"


@pytest.fixture
def gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    with GatewayServer(settings_for(upstream)) as server:
        yield server


def entries(gateway: GatewayServer, count: int = 1) -> list[dict[str, Any]]:
    """The newest conversation's entries, once it has ``count``."""
    headers = {"authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + 5
    while True:
        listed = httpx.get(f"{gateway.base_url}/context/conversations", headers=headers).json()
        if listed["data"] and listed["data"][0]["requests"] >= count:
            found = listed["data"][0]["id"]
            conversation = httpx.get(
                f"{gateway.base_url}/context/conversations/{found}", headers=headers
            ).json()
            data: list[dict[str, Any]] = conversation["entries"]["data"]
            return data
        assert time.monotonic() < deadline, "no ledger entry"
        time.sleep(0.02)


def detail(gateway: GatewayServer, entry: dict[str, Any]) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {KEY}"}
    listed = httpx.get(f"{gateway.base_url}/context/conversations", headers=headers).json()
    found = listed["data"][0]["id"]
    url = f"{gateway.base_url}/context/conversations/{found}/requests/{entry['id']}"
    body: dict[str, Any] = httpx.get(url, headers=headers).json()["detail"]
    return body


def sdk(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)


def test_the_models_restore_calls_are_counted(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    def script(received: Any) -> JSONReply:
        body = received.json()
        if body["messages"][-1]["role"] != "tool" or body["messages"][-1]["tool_call_id"] == "c1":
            ref = REF.search(str(body["messages"])).group()  # type: ignore[union-attr]
            return JSONReply(calling(restore_call(ref), prompt=500))
        return JSONReply(answer("Seat 7C is booking BK0007.", prompt=900))

    upstream.handler = script
    with sdk(gateway) as client:
        client.chat.completions.create(
            model="gpt-4o", messages=history("ledger"), extra_headers=POLICY
        )
    (entry,) = entries(gateway)
    assert entry["restores"] == {"calls": 1}
    (ref,) = entry["refs"]
    assert ref["bytes"] == len(OUTPUT.encode())
    assert ref["kind"] == "tool output"
    # The usage the entry prices is the conversation's first answer's, not the rounds'.
    assert entry["cache"]["uncached"] == 500


def test_screenshots_moved_out_of_the_window_are_images_behind_refs(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    def screenshot() -> dict[str, Any]:
        data = base64.b64encode(os.urandom(3_000)).decode()
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}

    messages: list[dict[str, Any]] = []
    for n in range(4):
        messages += [
            {"role": "user", "content": [{"type": "text", "text": f"screen {n}"}, screenshot()]},
            {"role": "assistant", "content": f"I see screen {n}."},
        ]
    messages.append({"role": "user", "content": "What changed?"})
    upstream.push(JSONReply(chat_completion()))
    with sdk(gateway) as client:
        client.chat.completions.create(model="gpt-4o", messages=messages)
    (entry,) = entries(gateway)
    assert [ref["kind"] for ref in entry["refs"]] == ["image", "image"]
    rows = detail(gateway, entry)["messages"]
    shown = [(row["fate"], row["client"]["text"]) for row in rows if row["role"] == "user"]
    assert shown == [
        ("offloaded", "screen 0\n[image]"),
        ("offloaded", "screen 1\n[image]"),
        ("kept", "screen 2\n[image]"),
        ("kept", "screen 3\n[image]"),
        ("kept", "What changed?"),
    ]
    offloaded = [row for row in rows if row["fate"] == "offloaded"]
    assert [row["refs"] for row in offloaded] == [[ref["ref"]] for ref in entry["refs"]]


def test_a_stream_is_entered_once_it_is_over_with_its_usage(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    usage = {
        "prompt_tokens": 2_000,
        "completion_tokens": 7,
        "total_tokens": 2_007,
        "prompt_tokens_details": {"cached_tokens": 1_536},
    }
    last = chat_chunk({}, "stop")
    last["usage"] = usage
    upstream.push(SSEReply(events_of([chat_chunk({"role": "assistant", "content": "Hi"}), last])))
    with sdk(gateway) as client:
        stream = client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "Say hi."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hi"
    (entry,) = entries(gateway)
    assert entry["stream"] is True
    assert entry["status"] == 200
    assert entry["cache"] == {
        "verdict": "cold",
        "reason": "new",
        "cached": 1_536,
        "uncached": 464,
        "written": None,
    }
    # gpt-4o: $2.50 uncached, $1.25 cached, $10 out; nothing was removed.
    expected = (464 * 2.5 + 1_536 * 1.25 + 7 * 10) / 1_000_000
    assert entry["cost"]["with"] == pytest.approx(expected)
    assert entry["cost"]["without"] == entry["cost"]["with"]


def test_a_responses_request_is_entered_as_such(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    upstream.push(
        JSONReply(
            {
                "id": "resp_1",
                "object": "response",
                "created_at": 1,
                "status": "completed",
                "model": "gpt-4o",
                "output": [
                    {
                        "type": "message",
                        "id": "msg_1",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
                    }
                ],
                "usage": {"input_tokens": 30, "output_tokens": 2, "total_tokens": 32},
            }
        )
    )
    with sdk(gateway) as client:
        client.responses.create(model="gpt-4o", input="Finish the report.")
    (entry,) = entries(gateway)
    assert entry["api"] == "responses"
    assert entry["model"] == "gpt-4o"
    assert entry["cache"]["uncached"] == 30


def _chat(sent: list[dict[str, Any]], went: list[dict[str, Any]], summary: bool) -> Any:
    """What ``detail_of`` reads of a compacted request."""
    stage = SimpleNamespace(changed=summary)
    report = SimpleNamespace(stage=lambda name: stage if name == "summarize" else None)
    checkpoint = {"start": 1, "end": 3, "summary": {"user_goal": "ship"}} if summary else None
    result = SimpleNamespace(
        request={"messages": went}, report=report, state=SimpleNamespace(checkpoint=checkpoint)
    )
    return SimpleNamespace(body={"messages": sent}, result=result)


def test_a_summarised_span_and_what_the_gateway_added() -> None:
    opening = {"role": "user", "content": "Ship the release."}
    middle = [
        {"role": "assistant", "content": "Built it."},
        {"role": "user", "content": "Now the notes."},
    ]
    latest = {"role": "user", "content": "And tag it."}
    summary = {"role": "user", "content": "[Recalled context: a checkpoint ...]"}
    shortened = {"role": "assistant", "content": "Wrote the notes: " + "x" * 900}
    short = {"role": "assistant", "content": "Wrote the notes: " + "x" * 100}
    sent = [opening, *middle, shortened, latest]
    went = [opening, summary, short, latest]
    rows = detail_of(_chat(sent, went, summary=True))["messages"]
    assert [(row["fate"], row["role"]) for row in rows] == [
        ("kept", "user"),
        ("summarised", "assistant"),
        ("summarised", "user"),
        ("added", "user"),
        ("shortened", "assistant"),
        ("kept", "user"),
    ]
    assert rows[3]["client"] is None
    assert rows[3]["upstream"]["text"].startswith("[Recalled")
    assert rows[1]["upstream"] is None
    assert rows[4]["client"]["chars"] == 917
    assert rows[4]["upstream"]["chars"] == 117
    # Without a summary, what is gone was pruned.
    rows = detail_of(_chat(sent, [opening, short, latest], summary=False))["messages"]
    assert [row["fate"] for row in rows] == ["kept", "pruned", "pruned", "shortened", "kept"]
