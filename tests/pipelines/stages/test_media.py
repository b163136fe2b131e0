"""media: media parts only in the last keep-images media-bearing messages; the rest
offloaded first and restorable byte for byte."""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.store import MemoryStore
from pipelines import ConversationState, Pipeline, Policy
from pipelines.stages.media import Media
from tests.openai_schema import assert_stays_valid
from tests.pipelines.stages.conftest import FailingStore


def shot(n: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{'A' * 400}{n}"}}


def session() -> list[dict[str, Any]]:
    """A computer-use style session: screenshots in user and tool messages."""
    call = {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    return [
        {"role": "system", "content": "You operate a browser."},
        {"role": "user", "content": [{"type": "text", "text": "Open the page"}, shot(1)]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [shot(2)]},
        {"role": "assistant", "content": "Opened."},
        {"role": "user", "content": [{"type": "text", "text": "Now this one"}, shot(3)]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [shot(4)]},
    ]


async def compact(messages: list[dict[str, Any]], store: Any, **policy: Any) -> Any:
    request = {"model": "gpt-4o", "messages": messages}
    result = await Pipeline(stages=[Media()], store=store).compact(request, policy=Policy(**policy))
    assert_stays_valid(request, result.request)
    return result


async def test_older_media_offloaded_newest_kept() -> None:
    """With keep-images=2 the two newest media-bearing messages keep their images; older
    ones get a placeholder whose ref restores the exact original part; tokens drop."""
    store = MemoryStore()
    result = await compact(session(), store)
    out = result.request["messages"]
    assert out[5]["content"][1] == shot(3)
    assert out[7]["content"] == [shot(4)]
    for index, original in ((1, shot(1)), (3, shot(2))):
        placeholder = next(p for p in out[index]["content"] if "removed" in p.get("text", ""))
        ref = re.search(r"ctx_[A-Za-z0-9_-]{22,}", placeholder["text"]).group()  # type: ignore[union-attr]
        assert orjson.loads(await store.get("", ref)) == original  # type: ignore[arg-type]
    assert out[1]["content"][0] == {"type": "text", "text": "Open the page"}
    report = result.report
    assert report.tokens_after < report.tokens_before - 1_000
    assert report.stages[0].details["parts_offloaded"] == 2


async def test_same_conversation_gives_same_bytes() -> None:
    """The rewrite is deterministic: the same request twice gives identical output."""
    store = MemoryStore()
    first = await compact(session(), store)
    second = await compact(session(), store)
    assert orjson.dumps(first.request) == orjson.dumps(second.request)


async def test_keep_images_is_tunable() -> None:
    """keep-images=0 removes every media part; a large value keeps them all."""
    store = MemoryStore()
    none_kept = (await compact(session(), store, keep_images=0)).request["messages"]
    assert all("image_url" not in orjson.dumps(m).decode() for m in none_kept)
    assert not (await compact(session(), store, keep_images=10)).changed


async def test_nothing_removed_without_a_store_or_when_it_fails() -> None:
    """Without a store, or with one that does not acknowledge writes, media stays."""

    assert not (await compact(session(), None)).changed
    failing = await compact(session(), FailingStore())
    assert not failing.changed
    assert failing.report.stages[0].details["store_failures"] == 2


def screenshots(count: int) -> list[dict[str, Any]]:
    """A session of ``count`` screenshot tool calls after one user request."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Watch the deploy."}]
    for n in range(count):
        call = {"id": f"s{n}", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"s{n}", "content": [shot(n)]})
    return messages


async def test_a_warm_cache_moves_the_window_in_batches() -> None:
    """The first request (cold) keeps 2 screenshots. While the cache is warm, newer ones
    pile up without rewriting the earlier outgoing messages, until 4 are beyond the window;
    then the window moves all at once, and the record remembers where it is."""
    store = MemoryStore()
    pipeline = Pipeline(stages=[Media()], store=store)
    state, now, previous = None, 1_000.0, None
    moves = []
    for count in range(3, 12):
        now += 10
        result = await pipeline.compact(
            {"model": "gpt-4o", "messages": screenshots(count)}, state=state, now=now
        )
        out = result.request["messages"]
        kept = sum(1 for m in out if m["role"] == "tool" and m["content"][0]["type"] == "image_url")
        details = result.report.stages[0].details
        if details.get("moved"):
            moves.append(count)
            assert kept == 2
        elif previous is not None:
            assert out[: len(previous)] == previous
            assert kept == 2 + details["deferred"]
        state, previous = result.state.answered(at=now), out
    assert moves == [3, 7, 11]


async def test_pressure_moves_the_window_even_with_a_warm_cache() -> None:
    warm = ConversationState(last_seen=995.0, calls=4, media_cut=1)
    messages = screenshots(6)  # 4 beyond the window, 1 already stripped: 3 deferred
    pipeline = Pipeline(stages=[Media()], store=MemoryStore())
    request = {"model": "gpt-4o", "messages": messages}
    roomy = await pipeline.compact(request, state=warm, now=1_000.0)
    assert roomy.state.media_cut == 1
    assert roomy.report.stages[0].details["deferred"] == 3
    # over 0.90 of a 4,000-token budget
    assert roomy.report.tokens_before >= 0.9 * 4_000
    tight = await pipeline.compact(request, state=warm, now=1_000.0, policy=Policy(max_input=4_000))
    assert tight.state.media_cut == 4


def pdf(n: int) -> dict[str, Any]:
    data = f"JVBERi0xLjQK{'B' * 4_000}{n}"
    return {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }


async def test_pdf_documents_are_windowed_like_images() -> None:
    """Anthropic PDF ``document`` parts count as media: only the newest keep-images
    messages keep theirs; an older one is offloaded behind a placeholder that says a
    document was removed, and its ref restores the exact part."""
    store = MemoryStore()
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"Read file {n}"}, pdf(n)]}
        if n % 2 == 0
        else {"role": "assistant", "content": f"Read {n}."}
        for n in range(6)
    ]
    result = await compact(messages, store)
    out = result.request["messages"]
    assert out[2]["content"][1] == pdf(2)
    assert out[4]["content"][1] == pdf(4)
    placeholder = out[0]["content"][1]["text"]
    assert "An earlier document was removed" in placeholder
    ref = re.search(r"ctx_[A-Za-z0-9_-]{22,}", placeholder).group()  # type: ignore[union-attr]
    assert orjson.loads(await store.get("", ref)) == pdf(0)  # type: ignore[arg-type]
