"""Responses items <-> the pipeline's chat messages: what each item becomes, what a stage's
change does on the way back, and the pairing rules through the real pipeline."""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.codecs.responses.items import (
    EXTERNAL,
    ITEMS,
    chat_messages,
    pairing_key,
    response_items,
)
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy
from pipelines.messages import SYSTEM_TURN
from tests.gateway.codecs.responses.samples import ENCRYPTED, checked, every_kind, tool_session


def _roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] + ("/turn" if m.get(SYSTEM_TURN) else "") for m in messages]


def test_every_kind_comes_back_as_it_was_sent() -> None:
    items = every_kind()
    messages = chat_messages(items, "Follow the house style.")
    assert response_items(messages) == items
    assert orjson.dumps(response_items(messages)) == orjson.dumps(items)


def test_each_kind_becomes_the_chat_message_the_pipeline_reads() -> None:
    messages = chat_messages(every_kind(), "Follow the house style.")
    assert _roles(messages)[:3] == ["system", "system", "user"]
    # The model's run up to the first output: its reasoning and its call, one message.
    run = messages[3]
    assert run["role"] == "assistant"
    assert [part["type"] for part in run["content"]] == ["reasoning"]
    assert run["tool_calls"][0]["id"] == "call_1"
    assert run["tool_calls"][0]["function"]["name"] == "shell"
    # Every output answers its call by its pairing key, whatever the call's type.
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert answered == ["call_1", "call_2", "call_3", "call_4", "call_5", "call_6", "mcpr_1"]
    called = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    assert set(answered) <= called
    # The output of a custom tool is its text; a local shell's is paired by its id.
    tool = next(m for m in messages if m.get("tool_call_id") == "call_3")
    assert tool["content"] == "a b.py".replace(" ", ".py ", 1).replace(".py.py", ".py")
    # Hosted calls and the answer are parts of the model's last run, in their order.
    last_run = [m for m in messages if m["role"] == "assistant"][-1]
    kinds = [part["type"] for part in last_run["content"]]
    assert kinds == ["image_generation_call", "output_text"]
    hosted = next(m for m in messages if m.get("tool_calls", [{}])[0].get("id") == "mcpr_1")
    assert [part["type"] for part in hosted["content"]] == [
        "web_search_call",
        "file_search_call",
        "mcp_call",
    ]
    # A compaction and a reference are pinned where they stand; the last user message
    # stays the last message.
    assert _roles(messages)[-3:] == ["system/turn", "system/turn", "user"]
    assert messages[-3]["content"] == [{"type": "compaction", "encrypted_content": ENCRYPTED}]


def test_a_developer_message_after_the_history_began_is_a_turn() -> None:
    items = checked(
        [
            {"role": "developer", "content": "Rules."},
            {"role": "user", "content": "Hi"},
            {"role": "developer", "content": "Now in plan mode."},
        ]
    )
    assert _roles(chat_messages(items, None)) == ["system", "user", "system/turn"]


def test_a_plain_answer_is_text_a_stage_may_shorten() -> None:
    items = checked(
        [
            {"role": "user", "content": "Explain."},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "A long answer.", "annotations": []}],
            },
        ]
    )
    messages = chat_messages(items, None)
    assert messages[1]["content"] == "A long answer."
    shortened = [messages[0], {**messages[1], "content": "[Shortened] A long"}]
    back = response_items(shortened)
    assert back[1] == {
        **items[1],
        "content": [{"type": "output_text", "text": "[Shortened] A long", "annotations": []}],
    }


def test_an_offloaded_output_keeps_its_call_id_and_type() -> None:
    items = tool_session(1, 200)
    messages = chat_messages(items, None)
    index = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    messages[index] = {**messages[index], "content": "[offloaded as ctx_abc] preview"}
    back = response_items(messages)
    output = next(item for item in back if item.get("type") == "function_call_output")
    assert output == {
        "type": "function_call_output",
        "call_id": "call_0",
        "output": "[offloaded as ctx_abc] preview",
    }


def test_reasoning_goes_with_the_call_it_precedes() -> None:
    items = checked(
        [
            {"role": "user", "content": "Go."},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": ENCRYPTED},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": ENCRYPTED},
            {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "function_call_output", "call_id": "b", "output": "2"},
        ]
    )
    messages = chat_messages(items, None)
    run = messages[1]
    # A stage drops call "b" and its output (an orphan repair, say): its reasoning goes too.
    without_b = {**run, "tool_calls": run["tool_calls"][:1]}
    back = response_items([messages[0], without_b, messages[2]])
    assert [item.get("id") or item.get("call_id") for item in back[1:]] == ["rs_1", "a", "a"]
    # Dropping call "a" takes "rs_1" and keeps "rs_2" with "b".
    without_a = {**run, "tool_calls": run["tool_calls"][1:]}
    back = response_items([messages[0], without_a, messages[3]])
    assert [item.get("id") or item.get("call_id") for item in back[1:]] == ["rs_2", "b", "b"]


def test_what_a_stage_adds_comes_back_as_items() -> None:
    items = tool_session(1, 100)
    messages = chat_messages(items, None)
    summary = {"role": "user", "content": "[Summary of earlier turns] ..."}
    interrupted = {"role": "tool", "tool_call_id": "call_0", "content": "[interrupted]"}
    back = response_items([messages[0], summary, messages[2], interrupted])
    assert back[1] == {"type": "message", "role": "user", "content": summary["content"]}
    assert back[-1] == {
        "type": "function_call_output",
        "call_id": "call_0",
        "output": "[interrupted]",
    }


def test_an_output_whose_call_the_upstream_holds_stands_alone() -> None:
    """A request continuing server-side state sends outputs of calls it does not hold:
    the pipeline sees them answered (no orphan to repair), and they go up alone."""
    items = checked([{"type": "function_call_output", "call_id": "held", "output": "42"}])
    messages = chat_messages(items, None)
    # The user turn that opens a history and the call, both standing for the upstream's.
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[0][EXTERNAL] is True
    assert messages[1][EXTERNAL] is True
    assert messages[1]["tool_calls"][0]["id"] == "held"
    assert response_items(messages) == items


def test_an_unknown_item_is_kept_verbatim_and_counted() -> None:
    future = {
        "type": "hologram_call",
        "id": "h_1",
        "payload": " ".join(f"w{i}" for i in range(200)),
    }
    paired = {"type": "teleport_call", "call_id": "t_1", "where": "mars"}
    output = {"type": "teleport_call_output", "call_id": "t_1", "output": "arrived"}
    items = [{"role": "user", "content": "Hi"}, future, paired, output]
    messages = chat_messages(items, None)
    assert messages[1][SYSTEM_TURN] is True  # outside a run: pinned
    assert messages[2]["tool_calls"][0]["id"] == "t_1" == messages[3]["tool_call_id"]
    assert pairing_key(output) == "t_1"
    assert response_items(messages) == items
    counter = Pipeline().counter("o200k_base")
    assert counter.count_message(messages[1]) > 100


async def test_compacted_through_the_pipeline_pairs_hold_and_reasoning_is_untouched() -> None:
    items = tool_session(40, 24_000)
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    body = {"model": "gpt-5", "messages": chat_messages(items, "You are a coding agent.")}
    result = await pipeline.compact(body, policy=Policy(max_input=60_000, mode="truncate"))
    assert result.changed
    assert result.report.tokens_after <= 60_000
    back = response_items(result.request["messages"])
    sent_reasoning = {
        item["encrypted_content"] for item in items if item.get("type") == "reasoning"
    }
    for position, item in enumerate(back):
        kind = item.get("type")
        if kind == "reasoning":
            # Never edited, and never without the call it precedes.
            assert item["encrypted_content"] in sent_reasoning
            assert back[position + 1]["type"] == "function_call"
        if kind == "function_call_output":
            calls = [i for i in back[:position] if i.get("type") == "function_call"]
            assert item["call_id"] in {call["call_id"] for call in calls}
        if kind == "function_call":
            later = [i.get("call_id") for i in back[position:] if i.get("type") != "function_call"]
            assert item["call_id"] in later
    # Every output no longer sent whole is restorable, byte for byte, through the refs
    # the request names (an archived preview names the ref of the output it previewed).
    reachable: set[str] = set()
    pending, seen = _refs(back), set()
    assert pending
    while pending:
        ref = pending.pop()
        seen.add(ref)
        stored = await store.get("", ref)
        assert stored is not None, ref
        reachable.add(stored.decode())
        pending |= _refs(stored.decode()) - seen
    sent = {item.get("output") for item in back}
    for item in items:
        if item.get("type") == "function_call_output" and item["output"] not in sent:
            assert item["output"] in reachable
    assert ITEMS not in orjson.dumps(back).decode()


def _refs(found: Any) -> set[str]:
    text = found if isinstance(found, str) else orjson.dumps(found).decode()
    return set(re.findall(r"ctx_[A-Za-z0-9_-]{22,}", text))


def test_a_call_left_without_output_gets_one_of_its_own_kind_or_none() -> None:
    """Pair repair answers a call the client left unanswered; on the way back the answer
    takes the call's kind (a function output answers no shell call), and a call nothing
    made up may answer (an MCP approval, a computer call) goes up unanswered."""
    calls = {
        "function_call": {"name": "f", "arguments": "{}"},
        "local_shell_call": {"action": {"type": "exec", "command": ["ls"], "env": {}}},
        "shell_call": {"action": {"commands": ["ls"]}},
        "apply_patch_call": {"operation": {"type": "delete_file", "path": "a.py"}},
        "computer_call": {"action": {"type": "screenshot"}, "pending_safety_checks": []},
    }
    expected = {
        "function_call": "function_call_output",
        "local_shell_call": "local_shell_call_output",
        "shell_call": "shell_call_output",
        "apply_patch_call": "apply_patch_call_output",
        "computer_call": None,
    }
    for kind, fields in calls.items():
        call = {"type": kind, "id": "x_1", "call_id": "c_1", "status": "completed", **fields}
        items = checked([{"role": "user", "content": "Go."}, call])
        messages = chat_messages(items, None)
        interrupted = {"role": "tool", "tool_call_id": "c_1", "content": "[interrupted]"}
        back = response_items([*messages, interrupted])
        made = back[2:]
        if expected[kind] is None:
            assert made == []
        else:
            assert [item["type"] for item in made] == [expected[kind]]
            checked(made)
    approval = {"type": "mcp_approval_request", "id": "a_1", "server_label": "s", "name": "n"}
    messages = chat_messages(
        [{"role": "user", "content": "Go."}, {**approval, "arguments": "{}"}], None
    )
    interrupted = {"role": "tool", "tool_call_id": "a_1", "content": "[interrupted]"}
    assert len(response_items([*messages, interrupted])) == 2


def test_a_pinned_item_between_a_call_and_its_output_keeps_them_paired() -> None:
    items = checked(
        [
            {"role": "user", "content": "Go."},
            {"type": "function_call", "call_id": "c_1", "name": "f", "arguments": "{}"},
            {"type": "item_reference", "id": "msg_0"},
            {"type": "function_call_output", "call_id": "c_1", "output": "done"},
        ]
    )
    messages = chat_messages(items, None)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2]["tool_call_id"] == "c_1"
    assert response_items(messages) == items


def test_a_history_opening_with_the_model_gets_no_made_up_user_turn() -> None:
    items = checked(
        [
            {"role": "developer", "content": "Rules."},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
            },
            {"role": "user", "content": "Hi."},
        ]
    )
    messages = chat_messages(items, None)
    assert messages[1][EXTERNAL] is True  # the opening the pipeline expects, never sent
    assert response_items(messages) == items


def test_an_empty_answer_comes_back_when_its_run_does() -> None:
    empty = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [],
    }
    call = {"type": "function_call", "call_id": "c_1", "name": "f", "arguments": "{}"}
    items = checked([{"role": "user", "content": "Go."}, empty, call])
    messages = chat_messages(items, None)
    shortened = {**messages[1], "tool_calls": [dict(messages[1]["tool_calls"][0])]}
    assert response_items([messages[0], shortened]) == items


def test_a_cut_that_breaks_a_calls_schema_is_not_sent() -> None:
    """The emergency cuts long call arguments; where the cut changes the structure of a
    call that is not a function's (a list shortened, a key gone), the call goes as sent."""
    call = {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "c_1",
        "status": "completed",
        "pending_safety_checks": [],
        "action": {"type": "drag", "path": [{"x": i, "y": i} for i in range(400)]},
    }
    items = checked([{"role": "user", "content": "Go."}, call])
    messages = chat_messages(items, None)
    tool_call = messages[1]["tool_calls"][0]
    cut = {"action": {"type": "drag", "path": [{"x": 0, "y": 0}, "... 399 items cut ..."]}}
    cut_call = {
        **tool_call,
        "function": {**tool_call["function"], "arguments": orjson.dumps(cut).decode()},
    }
    back = response_items([messages[0], {**messages[1], "tool_calls": [cut_call]}])
    assert back[1] == call
    # A cut that keeps the structure (a string shortened) is sent.
    shell = {
        "type": "local_shell_call",
        "id": "l_1",
        "call_id": "c_2",
        "status": "completed",
        "action": {"type": "exec", "command": ["echo", "x" * 5000], "env": {}},
    }
    messages = chat_messages(checked([{"role": "user", "content": "Go."}, shell]), None)
    tool_call = messages[1]["tool_calls"][0]
    short = {"action": {"type": "exec", "command": ["echo", "x [cut]"], "env": {}}}
    short_call = {
        **tool_call,
        "function": {**tool_call["function"], "arguments": orjson.dumps(short).decode()},
    }
    back = response_items([messages[0], {**messages[1], "tool_calls": [short_call]}])
    assert back[1]["action"]["command"] == ["echo", "x [cut]"]


def test_a_compaction_item_counts_as_the_history_it_encrypts() -> None:
    counter = Pipeline().counter("o200k_base")
    messages = chat_messages(
        checked(
            [
                {"type": "compaction", "encrypted_content": ENCRYPTED * 100},
                {"role": "user", "content": "Go on."},
            ]
        ),
        None,
    )
    bare = counter.count_message({"role": "system", "content": []})
    assert counter.count_message(messages[0]) - bare == len(ENCRYPTED * 100) // 5


async def test_a_requests_remembered_rendering_stores_what_the_plain_one_does() -> None:
    """``StoredItems`` makes each message's items once per request; what it stores is
    byte for byte what ``stored_items`` would."""
    from gateway.codecs.responses.items import StoredItems, stored_items

    items = tool_session(30, 3_000)
    body = {"model": "gpt-5", "messages": chat_messages(items, None)}
    policy = Policy(max_input=12_000, mode="truncate")
    store = MemoryStore()  # refs are content-addressed within one store
    one = await Pipeline(store=store).compact(body, policy=policy, render=StoredItems())
    two = await Pipeline(store=store).compact(body, policy=policy, render=stored_items)
    assert _refs(one.request["messages"])
    assert one.request == two.request


async def test_a_huge_free_form_tool_input_is_shortened_when_nothing_else_fits() -> None:
    """Codex's ``apply_patch`` is a custom tool whose input is free text, not JSON: when a
    request fits only with it shortened, the emergency cuts it as text (head and tail
    kept, the whole stored under a ref) and the item goes up with the shorter input."""
    patch = (
        "*** Begin Patch\n"
        + "".join(f"+line {i}: value {i * 7919 % 10007}\n" for i in range(3000))
        + "*** End Patch"
    )
    items = checked(
        [
            {"role": "user", "content": "Apply the change."},
            {"type": "custom_tool_call", "call_id": "c_1", "name": "apply_patch", "input": patch},
            {"type": "custom_tool_call_output", "call_id": "c_1", "output": "Done!"},
            {"role": "user", "content": "Thanks."},
        ]
    )
    store = MemoryStore()
    body = {"model": "gpt-5", "messages": chat_messages(items, None)}
    result = await Pipeline(store=store).compact(body, policy=Policy(max_input=8_000))
    assert result.report.tokens_after <= 8_000
    back = response_items(result.request["messages"])
    call = back[1]
    assert call["type"] == "custom_tool_call"
    assert call["input"].startswith("*** Begin Patch")
    assert len(call["input"]) < len(patch) // 10
    (ref,) = _refs(call["input"])
    stored = await store.get("", ref)
    assert stored is not None
    assert patch in orjson.loads(stored)[0]["function"]["arguments"]
