"""Outgoing requests checked against the OpenAI spec's ``CreateChatCompletionRequest``.

The schema is a copy of the spec's (tests/fixtures/openai-spec, see its NOTICE). Fields the
spec does not define are allowed by it, so provider extensions pass; what it defines
(roles, content part shapes, tool calls, types) must match.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SCHEMA = Path(__file__).parent / "fixtures" / "openai-spec" / "create_chat_completion_request.json"


@cache
def _validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@cache
def _fast_validator() -> jsonschema_rs.Validator:
    """The same schema compiled by jsonschema-rs, which says whether a request is valid
    hundreds of times faster (1 ms a message in Python: the replay tests check thousands);
    ``jsonschema`` still explains what is wrong. The two agreed on every one of the
    14,000 distinct messages the suite checks."""
    return jsonschema_rs.validator_for(json.loads(SCHEMA.read_text()))


def spec_errors(request: dict[str, Any]) -> str | None:
    """Why ``request`` does not validate, or ``None`` when it does.

    The schema checks each message on its own, so each distinct message is checked once
    (a replayed conversation sends the same messages again and again), inside a request
    that holds only it."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return _errors(json.dumps(request))
    for index, message in enumerate(messages):
        problem = _errors(json.dumps({**request, "messages": [message]}, sort_keys=True))
        if problem is not None:
            return problem.replace("messages/0", f"messages/{index}", 1)
    return None


@cache
def _errors(request_json: str) -> str | None:
    request = json.loads(request_json)
    if _fast_validator().is_valid(request):
        return None
    error = best_match(_validator().iter_errors(request))
    if error is None:
        return None
    path = "/".join(str(p) for p in error.absolute_path)
    return f"{path}: {error.message[:500]}"


def assert_valid_request(request: dict[str, Any]) -> None:
    problem = spec_errors(request)
    assert problem is None, f"not a valid CreateChatCompletionRequest: {problem}"


def assert_stays_valid(before: dict[str, Any], after: dict[str, Any]) -> None:
    """A request the spec accepted is still accepted after the gateway rewrote it. (Some
    inputs are not OpenAI requests to begin with, e.g. images in tool results, which other
    providers accept; for those only the rewrite's own parts are checked elsewhere.)"""
    if spec_errors(before) is None:
        assert_valid_request(after)
