"""bench.quality: fact retention and reversibility of a compacted request."""

from __future__ import annotations

import re
from typing import Any

import orjson

from bench.quality import (
    Fact,
    Quality,
    due_at,
    facts_of,
    occurs,
    removed_bytes,
    restored,
    tracked_values,
)

REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")
STORED = "ctx_" + "a" * 22
BOOK = {
    "name": "book_reservation",
    "kwargs": {
        "user_id": "mia_li_3668",
        "origin": "JFK",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li"}],
        "payment_methods": [{"payment_id": "certificate_7504069", "amount": 250}],
        "total_baggages": 3,
        "insurance": "no",
        "nonfree": False,
    },
}


def call(name: str, arguments: dict[str, Any], ident: str = "c1") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": ident,
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
        ],
    }


def conversation() -> list[dict[str, Any]]:
    """The user gives an id, a tool output gives a flight; the booking call uses both."""
    return [
        {"role": "system", "content": "You are the airline's agent."},
        {"role": "user", "content": "Book me on the morning flight; my id is mia_li_3668."},
        call("search", {"origin": "JFK"}),
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": '{"flights": [{"flight_number": "HAT136", "price": 250}]}',
        },
        {"role": "user", "content": "Yes, that one."},
        call("book_reservation", {"user_id": "mia_li_3668", "flight": "HAT136"}, "c2"),
    ]


def test_tracked_values_keep_identifiers_and_amounts() -> None:
    """Ids, codes, dates and amounts are tracked; names, enum words, counts, booleans not."""
    assert tracked_values([BOOK]) == [
        "mia_li_3668",
        "JFK",
        "HAT136",
        "2024-05-20",
        "certificate_7504069",
        "250",
    ]


def test_occurs_matches_whole_tokens_only() -> None:
    """A value inside a longer identifier or number is not an occurrence."""
    assert occurs("250", "price: 250.0")
    assert not occurs("250", "price 1250")
    assert not occurs("HAT136", "HAT1360")


def test_facts_are_needed_at_the_final_call_and_seen_before_it() -> None:
    """Each value is needed at the message making the action's call; values never seen
    before it (the date, the certificate) are not tracked."""
    messages = conversation()
    facts = facts_of(messages, [BOOK])
    assert facts == [
        Fact("mia_li_3668", 5),
        Fact("JFK", len(messages)),  # the call never names it: needed at the end
        Fact("HAT136", 5),
        Fact("250", len(messages)),
    ]


def test_due_at_picks_the_request_just_before_the_need() -> None:
    """A fact is checked at the last request whose history ends at or before its need."""
    due = due_at([Fact("x", 5), Fact("y", 6)], [2, 4, 5, 6])
    assert due == {2: [Fact("x", 5)], 3: [Fact("y", 6)]}


def test_everything_sent_is_everything_retained() -> None:
    """The raw history retains every fact and removes nothing."""
    messages = conversation()
    history = messages[:5]
    quality = Quality()
    quality.start_session()
    quality.add(history, history, facts_of(messages, [BOOK]), [])
    quality.finish()
    assert (quality.retained, quality.tracked) == (4, 4)
    assert quality.whole_sessions == quality.sessions == 1
    assert quality.reversibility is None


def test_a_dropped_fact_is_lost_unless_restorable() -> None:
    """Dropping the tool output loses its flight number and amount; the same cut with the
    output behind a restorable ref keeps them, and the removal is fully reversible."""
    messages = conversation()
    history = messages[:5]
    facts = facts_of(messages, [BOOK])
    cut = [*history[:3], {"role": "tool", "tool_call_id": "c1", "content": STORED}, history[4]]

    lost = Quality()
    lost.start_session()
    lost.add(history, cut, facts, [])
    lost.finish()
    assert (lost.retained, lost.tracked) == (2, 4)
    assert lost.retention < 1.0
    assert lost.whole_sessions == 0
    assert lost.reversibility == 0.0

    kept = Quality()
    kept.start_session()
    kept.add(history, cut, facts, [str(history[3]["content"])])
    kept.finish()
    assert kept.retention == 1.0
    assert kept.reversibility == 1.0


def test_reserialised_json_is_not_a_removal() -> None:
    """A tool output re-sent without JSON whitespace counts as kept; a shortened one as
    removed, all of its bytes."""
    output = '{"a": [1, 2, 3], "b": "x"}'
    history = [{"role": "tool", "tool_call_id": "c", "content": output}]
    minified = [{"role": "tool", "tool_call_id": "c", "content": '{"a":[1,2,3],"b":"x"}'}]
    shortened = [{"role": "tool", "tool_call_id": "c", "content": '{"a":[1],"b":"x"}'}]
    assert removed_bytes(history, minified, []) == (0, 0)
    assert removed_bytes(history, shortened, []) == (len(output), 0)
    assert removed_bytes(history, shortened, [output]) == (len(output), len(output))


async def test_restored_follows_refs_inside_restored_content() -> None:
    """An index object naming further refs restores their content too, and the texts of
    a stored list of messages are listed one by one."""
    inner = "ctx_" + "b" * 22
    objects = {
        STORED: f"see {inner}".encode(),
        inner: orjson.dumps([{"role": "user", "content": "my id is mia_li_3668"}]),
    }

    async def fetch(ref: str) -> bytes | None:
        return objects.get(ref)

    texts = await restored(f"placeholder {STORED} and ctx_{'z' * 22}", fetch, REF)
    assert "my id is mia_li_3668" in texts
    assert any(inner in text for text in texts)
