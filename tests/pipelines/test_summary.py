"""The structured summary: its schema, the prompt, checking an answer, the entity audit
and the message that carries it."""

from __future__ import annotations

import orjson
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from pipelines.summary import (
    FIELDS,
    LIST_FIELDS,
    SummaryInvalid,
    key_entities,
    parse_summary,
    retention,
    summary_message,
    summary_request_messages,
    summary_schema,
)

GOOD = {name: ([] if name in LIST_FIELDS else "") for name in FIELDS} | {
    "user_goal": "Change reservation 8JE9YY to the 2024-05-24 flight HAT170.",
    "completed_actions": ["Looked up user sofia_kim_7287: gold member"],
    "files_modified": ["/srv/app/config.yaml"],
}


def test_exactly_eleven_fields_and_a_schema_that_accepts_a_good_answer() -> None:
    assert len(FIELDS) == 11
    assert len(set(FIELDS)) == 11
    Draft202012Validator(summary_schema()).validate(GOOD)
    with pytest.raises(ValidationError):
        Draft202012Validator(summary_schema()).validate({**GOOD, "extra": "x"})


def test_a_good_answer_parses_even_inside_a_code_fence() -> None:
    text = "Here it is:\n```json\n" + orjson.dumps(GOOD).decode() + "\n```"
    assert parse_summary(text) == GOOD


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("I could not summarise this.", "no JSON object"),
        ("{not json}", "not valid JSON"),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "last_action"}).decode(), "missing"),
        (orjson.dumps({**GOOD, "mood": "good"}).decode(), "unexpected"),
        (orjson.dumps({**GOOD, "key_findings": "one finding"}).decode(), "list of strings"),
        (orjson.dumps({**GOOD, "active_task": ["a"]}).decode(), "must be a string"),
    ],
)
def test_bad_answers_are_refused_with_the_reason(answer: str, says: str) -> None:
    with pytest.raises(SummaryInvalid, match=says):
        parse_summary(answer)


def test_key_entities_and_their_retention() -> None:
    texts = [
        "Reservation 8JE9YY, flight HAT170 on 2024-05-24, paid $1,240.50 with card 9879898.",
        "See https://example.com/booking/8JE9YY and /srv/app/config.yaml; error E1042.",
        "Thanks, that is all.",
    ]
    entities = key_entities(texts)
    for expected in ("8JE9YY", "HAT170", "2024-05-24", "9879898", "E1042", "/srv/app/config.yaml"):
        assert expected in entities
    assert "https://example.com/booking/8JE9YY" in entities
    assert "Thanks" not in entities
    assert retention(GOOD, entities) < 0.6
    full = {**GOOD, "key_findings": sorted(entities)}
    assert retention(full, entities) == 1.0
    assert retention(GOOD, frozenset()) == 1.0


def test_the_prompt_asks_for_the_fields_and_merges_a_previous_summary() -> None:
    messages = [
        {"role": "user", "content": "Quiero cambiar la reserva 8JE9YY."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_reservation", "arguments": '{"id": "8JE9YY"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "confirmed"}'},
    ]
    fresh = summary_request_messages(messages)
    system, user = fresh[0]["content"], fresh[1]["content"]
    assert all(name in system for name in FIELDS)
    assert "language the user writes in" in system
    assert "Copy identifiers exactly" in system
    assert "get_reservation" in user
    assert "8JE9YY" in user
    assert "Merge" not in system
    merged = summary_request_messages(messages, previous=GOOD)
    assert "Merge, do not start over" in merged[0]["content"]
    assert "HAT170" in merged[0]["content"]


def test_the_summary_message_is_recalled_context_with_its_refs() -> None:
    message = summary_message(GOOD, ["ctx_" + "A" * 24])
    assert message["role"] == "user"
    content = message["content"]
    assert content.startswith("[Recalled context")
    assert "not a new request" in content
    assert "user goal: Change reservation 8JE9YY" in content
    assert "- /srv/app/config.yaml" in content
    assert "ctx_" + "A" * 24 in content
    assert "pending user asks" not in content  # empty fields are left out
