"""The ``context_restore`` tool: the model takes back what the pipeline offloaded.

The gateway adds one function tool, ``context_restore``, at the end of a conversation's
tools: from its first request when it brings tools of its own (``Settings.restore_tool``,
``from_start``), else from the first request whose outgoing body carries refs; and keeps
adding it on every later request of the conversation (the conversation's record
remembers), so the tools array does not change between turns and the provider's cached
prefix survives (``gateway.context.compaction``).

When the model calls it, the gateway answers the call itself from the store (in the
caller's namespace) and asks the model again with the answer appended, up to
``MAX_ROUNDS`` times; the client only ever sees the final answer, with the usage of every
round added up. If an answer mixes the client's own tool calls with restore calls, the
client's calls go to the client as they are and the restore calls are dropped (counted in
``x-contextgate-restore``). Streamed text passes through at once; a tool call's deltas are
held only until its name says whose it is.

A restore returns at most ``RESTORE_TOKENS`` tokens: a larger object, or range, is cut at
a line boundary and the answer says which lines came and how to ask for the next ones.

The package: ``tool`` (the tool, and which requests get it), ``restorer`` (answering the
calls from the store, in ranged reads), ``rounds`` (what every loop shares: the round
limit, resending, usage totals), ``chat``, ``messages`` and ``responses`` (the loop on
OpenAI chat completions, the Anthropic Messages API and the OpenAI Responses API, whole
answers and streams). On the Responses API's WebSocket the tool is not offered (no
restore loop there).
"""

from __future__ import annotations

from gateway.context.restore import messages
from gateway.context.restore.chat import complete, stream
from gateway.context.restore.restorer import RESTORE_TOKENS, Restorer, RestoreStats
from gateway.context.restore.rounds import MAX_ROUNDS, Resend, ResendStream, add_usage, chain
from gateway.context.restore.tool import (
    RESTORE_TOOL,
    RESTORE_TOOL_NAME,
    has_refs,
    with_restore_tool,
)

__all__ = [
    "MAX_ROUNDS",
    "RESTORE_TOKENS",
    "RESTORE_TOOL",
    "RESTORE_TOOL_NAME",
    "Resend",
    "ResendStream",
    "RestoreStats",
    "Restorer",
    "add_usage",
    "chain",
    "complete",
    "has_refs",
    "messages",
    "stream",
    "with_restore_tool",
]
