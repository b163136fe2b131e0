"""Responses input items of every kind the API takes, each checked against the installed
openai SDK's type for an input item (``ResponseInputItemParam``)."""

from __future__ import annotations

from typing import Any, Final

import pydantic
from openai.types.responses import ResponseInputItemParam

ITEM: Final = pydantic.TypeAdapter(ResponseInputItemParam)

ENCRYPTED: Final = "gAAAAABo" + "Zm9vYmFy" * 40
"""An opaque ``encrypted_content`` as the API returns it (base64)."""


def checked(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items``, each validated as the SDK's input item type (so a sample the API would
    refuse fails the test that uses it)."""
    for item in items:
        ITEM.validate_python(item)
    return items


def every_kind() -> list[dict[str, Any]]:
    """One conversation with every kind of input item, in an order an agent produces."""
    return checked(
        [
            {"type": "message", "role": "developer", "content": "Be brief."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look at this and fix the build."},
                    {
                        "type": "input_image",
                        "detail": "auto",
                        "image_url": "data:image/png;base64,iVBORw0KGgo=",
                    },
                    {"type": "input_file", "file_id": "file_1"},
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Run the tests first."}],
                "encrypted_content": ENCRYPTED,
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "shell",
                "arguments": '{"command":["pytest","-q"]}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "2 failed"},
            {
                "type": "custom_tool_call",
                "id": "ctc_1",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": "*** Begin Patch\n*** End Patch",
            },
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
            {
                "type": "local_shell_call",
                "id": "lsh_1",
                "call_id": "call_3",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
                "status": "completed",
            },
            {"type": "local_shell_call_output", "id": "call_3", "output": "a.py b.py"},
            {
                "type": "shell_call",
                "call_id": "call_4",
                "action": {"commands": ["git status"]},
                "status": "completed",
            },
            {
                "type": "shell_call_output",
                "call_id": "call_4",
                "output": [
                    {"stdout": "clean", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
                ],
            },
            {
                "type": "apply_patch_call",
                "call_id": "call_5",
                "operation": {"type": "update_file", "path": "a.py", "diff": "@@\n-a\n+b\n"},
                "status": "completed",
            },
            {"type": "apply_patch_call_output", "call_id": "call_5", "status": "completed"},
            {
                "type": "computer_call",
                "id": "cu_1",
                "call_id": "call_6",
                "action": {"type": "screenshot"},
                "pending_safety_checks": [],
                "status": "completed",
            },
            {
                "type": "computer_call_output",
                "call_id": "call_6",
                "output": {
                    "type": "computer_screenshot",
                    "image_url": "data:image/png;base64,iVBORw0KGgo=",
                },
            },
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "pytest fixtures"},
            },
            {
                "type": "file_search_call",
                "id": "fs_1",
                "queries": ["build"],
                "status": "completed",
            },
            {
                "type": "mcp_call",
                "id": "mcp_1",
                "server_label": "docs",
                "name": "lookup",
                "arguments": "{}",
                "output": "found",
            },
            {
                "type": "mcp_approval_request",
                "id": "mcpr_1",
                "server_label": "docs",
                "name": "write",
                "arguments": "{}",
            },
            {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True},
            {
                "type": "image_generation_call",
                "id": "ig_1",
                "status": "completed",
                "result": "iVBORw0KGgo=",
            },
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Fixed.", "annotations": []}],
            },
            {"type": "compaction", "encrypted_content": ENCRYPTED},
            {"type": "item_reference", "id": "msg_0"},
            {"role": "user", "content": "Thanks. Now the docs."},
        ]
    )


def tool_session(turns: int, output_chars: int) -> list[dict[str, Any]]:
    """A stateless agent's history: a request, then ``turns`` rounds of reasoning, a
    shell call and its output (``output_chars`` long), then a final answer."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": "Find why the build fails."},
    ]
    for turn in range(turns):
        items += [
            {
                "type": "reasoning",
                "id": f"rs_{turn}",
                "summary": [],
                "encrypted_content": f"{ENCRYPTED}{turn}",
            },
            {
                "type": "function_call",
                "call_id": f"call_{turn}",
                "name": "shell",
                "arguments": f'{{"command":["cat","log{turn}.txt"]}}',
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{turn}",
                "output": f"log {turn}: " + "build step ok\n" * (output_chars // 14),
            },
        ]
    items.append({"role": "user", "content": "So what is it?"})
    return checked(items)
