"""The ``context_restore`` tool and which requests get it: appended after the client's
tools, never twice, and not to requests asking for several choices."""

from __future__ import annotations

from gateway.context.restore import (
    with_restore_tool,
)


def test_the_tool_is_appended_and_never_doubled() -> None:
    mine = {"type": "function", "function": {"name": "search"}}
    request = {"model": "m", "messages": [], "tools": [mine]}
    tooled = with_restore_tool(request)
    assert tooled is not None
    assert [t["function"]["name"] for t in tooled["tools"]] == ["search", "context_restore"]
    assert with_restore_tool(tooled) is None
    assert with_restore_tool({"model": "m", "messages": [], "functions": [{"name": "f"}]}) is None


def test_several_choices_get_no_restore_tool() -> None:
    assert with_restore_tool({"model": "m", "messages": [], "n": 2}) is None
    assert with_restore_tool({"model": "m", "messages": [], "n": 1}) is not None
