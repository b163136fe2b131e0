"""The structured summary (stage 6: docs/ARCHITECTURE.md, "The pipeline"): what it holds,
how it is asked for, how an answer is checked, and the message that carries it.

A summary is one JSON object with exactly the eleven ``FIELDS``. It is a checkpoint for
another model, not prose for a person: identifiers (paths, ids, numbers, URLs, error codes)
are kept exactly, it is written in the conversation's language, and a later summary merges
the previous one instead of starting over. An answer is accepted only if it parses, has
exactly those fields with the right types, and keeps at least ``MIN_RETENTION`` of the key
entities of what it replaces (``key_entities``).

This module is pure: building the prompt, parsing and auditing an answer, and rendering
the summary message. Calling a model, retrying, guarding the summary model's window and
reusing checkpoints are the summarizer's and the stage's business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipelines.messages import Message, message_text

__all__ = [
    "FIELDS",
    "LIST_FIELDS",
    "MIN_RETENTION",
    "Summary",
    "SummaryFailed",
    "SummaryInvalid",
    "SummaryOverflow",
    "key_entities",
    "parse_summary",
    "retention",
    "summary_message",
    "summary_request_messages",
    "summary_schema",
]

FIELDS: Final = (
    "user_goal",
    "active_task",
    "constraints_and_preferences",
    "completed_actions",
    "active_state",
    "key_findings",
    "errors_and_fixes",
    "resolved_questions",
    "pending_user_asks",
    "files_modified",
    "last_action",
)
LIST_FIELDS: Final = frozenset(
    {
        "constraints_and_preferences",
        "completed_actions",
        "key_findings",
        "errors_and_fixes",
        "resolved_questions",
        "pending_user_asks",
        "files_modified",
    }
)
"""Fields that hold a list of strings; the others hold one string."""
MIN_RETENTION: Final = 0.30
"""Share of the replaced messages' key entities a summary must keep."""

_ENTITY: Final = re.compile(
    r"https?://[^\s\"'<>)\]]+"  # URLs
    r"|/?(?:[\w.-]+/)+[\w.-]+"  # paths
    r"|\b[A-Za-z_]*\d[\w-]*\b"  # ids, numbers, codes: anything with a digit
)
_TRAILING: Final = ".,;:!?)"


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary a model wrote, as accepted."""

    fields: dict[str, Any]
    retention: float
    """Share of the replaced messages' key entities the summary kept."""
    attempts: int
    usage: dict[str, Any] | None = None


class SummaryFailed(Exception):
    """No usable summary (no valid answer, an error, the deadline); the message says why."""


class SummaryOverflow(SummaryFailed):
    """The summary model said its input did not fit its context window."""


class SummaryInvalid(ValueError):
    """An answer that is not a usable summary; the message says why."""


def summary_schema() -> dict[str, Any]:
    """The JSON Schema of a summary, for providers with a structured-output mode."""
    properties: dict[str, Any] = {
        name: (
            {"type": "array", "items": {"type": "string"}}
            if name in LIST_FIELDS
            else {"type": "string"}
        )
        for name in FIELDS
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(FIELDS),
        "additionalProperties": False,
    }


_INSTRUCTIONS: Final = """You write a context checkpoint for another AI model that will continue \
this conversation without seeing the messages you summarise. Answer with one JSON object and \
nothing else, with exactly these fields:
- user_goal: what the user wants overall.
- active_task: the latest user request that is not yet fulfilled, quoted verbatim.
- constraints_and_preferences: list; rules, limits and preferences the user stated.
- completed_actions: list; what has been done, with its results.
- active_state: where things stand now (what is open, set up, half done).
- key_findings: list; facts learned that later steps need.
- errors_and_fixes: list; what failed, why, and what fixed it (or that nothing did yet).
- resolved_questions: list; questions that were answered, with the answer.
- pending_user_asks: list; what the user asked that is still open.
- files_modified: list; paths created, changed or deleted.
- last_action: the last thing the assistant did.
Copy identifiers exactly as written: ids, paths, numbers, amounts, dates, URLs, error codes, \
names. Do not invent anything. Write in the language the user writes in. Use "" or [] for \
a field with nothing to say."""

_MERGE: Final = """A previous checkpoint covers the conversation before these messages. \
Merge, do not start over: keep what still holds, update active_task and active_state, move \
questions that are now answered to resolved_questions, and add what is new."""


def summary_request_messages(
    messages: Sequence[Message], previous: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The chat messages asking a model for the summary of ``messages`` (merging
    ``previous`` when given)."""
    transcript = "\n\n".join(_line(message) for message in messages)
    parts = [_INSTRUCTIONS]
    if previous is not None:
        parts.append(_MERGE)
        parts.append("Previous checkpoint:\n" + orjson.dumps(dict(previous)).decode())
    return [
        {"role": "system", "content": "\n\n".join(parts)},
        {
            "role": "user",
            "content": "Messages to summarise:\n\n" + transcript + "\n\nThe JSON checkpoint:",
        },
    ]


def _line(message: Message) -> str:
    role = str(message.get("role", "?"))
    text = message_text(message)
    calls = [
        f"{function.get('name')}({function.get('arguments', '')})"
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict) and isinstance(function := call.get("function"), dict)
    ]
    if calls:
        text = (text + "\n" if text else "") + "calls: " + "; ".join(calls)
    return f"[{role}] {text}"


def parse_summary(text: str) -> dict[str, Any]:
    """The summary in a model's answer, or ``SummaryInvalid``. A JSON object wrapped in a
    code fence or in surrounding words is accepted; anything else about it is not."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise SummaryInvalid("the answer holds no JSON object")
    try:
        value = orjson.loads(text[start : end + 1])
    except orjson.JSONDecodeError as exc:
        raise SummaryInvalid(f"the answer is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise SummaryInvalid("the answer is not a JSON object")
    missing = [name for name in FIELDS if name not in value]
    extra = sorted(set(value) - set(FIELDS))
    if missing or extra:
        raise SummaryInvalid(f"fields missing: {missing or 'none'}; unexpected: {extra or 'none'}")
    for name in FIELDS:
        field = value[name]
        if name in LIST_FIELDS:
            if not isinstance(field, list) or not all(isinstance(item, str) for item in field):
                raise SummaryInvalid(f"{name} must be a list of strings")
        elif not isinstance(field, str):
            raise SummaryInvalid(f"{name} must be a string")
    return {name: value[name] for name in FIELDS}


def key_entities(texts: Iterable[str]) -> frozenset[str]:
    """The identifiers in ``texts`` a summary must not lose: URLs, paths, and anything
    with a digit in it (ids, numbers, dates, amounts, error codes)."""
    found: set[str] = set()
    for text in texts:
        for match in _ENTITY.findall(text):
            entity = match.rstrip(_TRAILING)
            if len(entity) >= 2:
                found.add(entity)
    return frozenset(found)


def retention(summary: Mapping[str, Any], entities: frozenset[str]) -> float:
    """The share of ``entities`` that appear in ``summary`` (1.0 when there are none)."""
    if not entities:
        return 1.0
    text = orjson.dumps(dict(summary)).decode()
    return sum(1 for entity in entities if entity in text) / len(entities)


def summary_message(summary: Mapping[str, Any], refs: Sequence[str]) -> dict[str, Any]:
    """The user-role message that carries a summary into the conversation: marked as
    recalled context, not a new request, and naming the refs of what it replaced."""
    lines = [
        "[Recalled context: a checkpoint of earlier messages of this conversation, which"
        " were removed to fit the context window. This is not a new request.]"
    ]
    for name in FIELDS:
        value = summary.get(name)
        if not value:
            continue
        title = name.replace("_", " ")
        if isinstance(value, list):
            lines.append(f"{title}:")
            lines.extend(f"- {item}" for item in value)
        else:
            lines.append(f"{title}: {value}")
    if refs:
        lines.append(
            "The removed messages are stored and can be restored: " + ", ".join(refs) + "."
        )
    return {"role": "user", "content": "\n".join(lines)}
