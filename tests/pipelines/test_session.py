"""The conversation record: when the provider's cache counts as cold, and its wire form."""

from __future__ import annotations

import pytest

from pipelines import ConversationState, conversation_id
from pipelines.session import cache_status

NOW = 10_000.0


def test_a_new_conversation_is_cold() -> None:
    assert cache_status(None, ttl=300, now=NOW) == (True, "new")


def test_within_the_ttl_the_cache_is_hot_and_past_it_cold() -> None:
    state = ConversationState(last_seen=NOW - 299, calls=3)
    assert cache_status(state, ttl=300, now=NOW) == (False, "hot")
    assert cache_status(state, ttl=60, now=NOW) == (True, "expired")


@pytest.mark.parametrize(
    ("calls", "prompt", "cached", "cold"),
    [
        (3, 10_000, 500, True),  # stable sample, 5% hits: the provider is not caching
        (3, 10_000, 3_500, False),  # 35% hits
        (1, 1_000, 0, False),  # one small call says nothing yet
        (1, 5_000, 0, True),  # but a big one does
        (3, 10_000, None, False),  # no feedback: time decides
    ],
)
def test_provider_feedback_can_say_the_cache_is_not_working(
    calls: int, prompt: int, cached: int | None, cold: bool
) -> None:
    state = ConversationState(
        last_seen=NOW - 10, calls=calls, prompt_tokens=prompt, cached_tokens=cached
    )
    assert cache_status(state, ttl=300, now=NOW)[0] is cold


def test_answered_reads_openai_usage_and_counts_calls() -> None:
    usage = {"prompt_tokens": 9_000, "prompt_tokens_details": {"cached_tokens": 8_000}}
    state = ConversationState(media_cut=2).answered(at=NOW, usage=usage)
    assert state == ConversationState(
        last_seen=NOW, calls=1, prompt_tokens=9_000, cached_tokens=8_000, media_cut=2
    )
    assert ConversationState.from_json(state.to_json()) == state
    assert ConversationState.from_json(b'{"calls": 4, "added_later": 1}').calls == 4


def test_conversation_identity_follows_system_prompt_first_user_and_namespace() -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Book a flight."},
        {"role": "assistant", "content": "Where to?"},
    ]
    longer = [*history, {"role": "user", "content": "Paris."}]
    assert conversation_id("t1", history) == conversation_id("t1", longer)
    assert conversation_id("t1", history) != conversation_id("t2", history)
    other = [history[0], {"role": "user", "content": "Book a hotel."}]
    assert conversation_id("t1", history) != conversation_id("t1", other)


async def test_a_record_of_another_history_does_not_apply() -> None:
    """A record left by a conversation with the same identity but another history (or an
    edited one) is not used: the request counts as cold ("diverged") and no cut of the
    other conversation is applied."""
    from gateway.store import MemoryStore
    from pipelines import Pipeline

    def history(tag: str, turns: int) -> list[dict[str, object]]:
        messages: list[dict[str, object]] = [{"role": "user", "content": "Start."}]
        for n in range(turns):
            messages += [
                {"role": "assistant", "content": f"{tag} step {n} " * 200},
                {"role": "user", "content": f"{tag} next {n}"},
            ]
        return messages

    pipeline = Pipeline(store=MemoryStore())
    first = await pipeline.compact({"model": "gpt-4o", "messages": history("a", 6)}, now=NOW)
    state = first.state.answered(at=NOW)
    assert state.seen == 13
    same = await pipeline.compact(
        {"model": "gpt-4o", "messages": history("a", 7)}, state=state, now=NOW + 5
    )
    assert same.report.cache == "hot"
    other = await pipeline.compact(
        {"model": "gpt-4o", "messages": history("b", 7)}, state=state, now=NOW + 5
    )
    assert other.report.cache == "diverged"
    assert other.state.seen == 15


def test_a_client_moving_its_cache_marker_still_continues_the_history() -> None:
    """A client that marks its newest message each turn (and so unmarks the previous
    one) sends a continuation of its previous request, not another history."""
    history = [
        {"role": "user", "content": "Book a flight."},
        {"role": "assistant", "content": "Where to?", "cache_control": {"type": "ephemeral"}},
    ]
    state = ConversationState().with_history(history, sent_tokens=20, cold=True)
    later = [
        history[0],
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "Paris.", "cache_control": {"type": "ephemeral"}},
    ]
    assert state.follows(later)
    assert not state.follows([history[0], {"role": "assistant", "content": "Where?"}])


async def test_the_misses_of_a_request_that_broke_its_prefix_do_not_make_the_next_cold() -> None:
    """A request that changed the tools (a predicted cache break) reads nothing from the
    provider's cache; that low hit rate was expected, so the next request, which changes
    nothing, still counts the cache as hot and gets no cold-cache rewrites."""
    from pipelines import Pipeline

    tool = {"type": "function", "function": {"name": "search", "parameters": {}}}
    other = {"type": "function", "function": {"name": "book", "parameters": {}}}
    messages: list[dict[str, object]] = [{"role": "user", "content": "Find a flight " * 300}]
    usage = {"prompt_tokens": 5_000, "prompt_tokens_details": {"cached_tokens": 4_000}}
    pipeline = Pipeline()
    request = {"model": "gpt-4o", "messages": messages, "tools": [tool]}
    first = await pipeline.compact(request, now=NOW)
    state = first.state.answered(at=NOW, usage=usage)
    messages = [*messages, {"role": "assistant", "content": "Which date?"}]
    messages = [*messages, {"role": "user", "content": "Tomorrow."}]
    request = {"model": "gpt-4o", "messages": messages, "tools": [tool, other]}
    broke = await pipeline.compact(request, state=state, now=NOW + 5)
    assert broke.report.cache == "hot"
    assert broke.report.cache_break == "tools"
    missed = {"prompt_tokens": 5_100, "prompt_tokens_details": {"cached_tokens": 0}}
    state = broke.state.answered(at=NOW + 5, usage=missed)
    messages = [*messages, {"role": "assistant", "content": "Booked."}]
    after = await pipeline.compact({**request, "messages": messages}, state=state, now=NOW + 10)
    assert after.report.cache == "hot"
    assert after.report.cache_break is None


def test_a_record_standing_for_a_checkpoint_follows_either_history() -> None:
    """After a compaction the gateway made for its client, the record follows the
    checkpoint's history (the block sent back, expanded) and still the client's own (the
    client retrying a request whose answer, with the block, never reached it); the next
    request's history is the only one again."""
    own = [{"role": "user", "content": f"turn {n}"} for n in range(6)]
    checkpoint = [{"role": "user", "content": "[Context note: ...]"}, own[-1]]
    state = ConversationState().with_history(own, sent_tokens=100, cold=False)
    stood = state.standing_for(checkpoint, sent_tokens=20, cold=True)
    later = {"role": "user", "content": "next"}
    assert stood.follows([*checkpoint, later])
    assert stood.follows([*own, later])
    assert not stood.follows([{"role": "user", "content": "another"}, later])
    moved = stood.with_history([*checkpoint, later], sent_tokens=30, cold=False)
    assert not moved.follows([*own, later])
