"""compact_json: JSON tool outputs without insignificant whitespace, losslessly, the same
bytes every time; and, through the pipeline, every offloaded output restoring as the
client sent it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy, TokenCounter
from pipelines.compact_json import JsonCompaction, compact_json
from tests.pipelines.stages.test_summarize import Scripted

TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "tau-bench-gpt-4o-airline.json"
REF = re.compile(r"ctx_[A-Za-z0-9_-]{22,}")


def trajectories() -> list[list[dict[str, Any]]]:
    return [t["traj"] for t in json.loads(TRACES.read_text())]


def test_real_tau_bench_outputs_lose_a_fifth_of_their_tokens() -> None:
    """On the tau-bench airline tool outputs, every compacted output reads back as the same
    value and the outputs cost at least 18% fewer o200k tokens (21% when measured)."""
    counter = TokenCounter("o200k_base")
    outputs = [m["content"] for t in trajectories() for m in t if m["role"] == "tool"]
    before = after = compacted = 0
    for text in outputs:
        compact = compact_json(text)
        if compact is not text:
            compacted += 1
            assert len(compact) < len(text)
            assert json.loads(compact) == json.loads(text)
        before += counter.count_text(text)
        after += counter.count_text(compact)
    assert compacted > 700
    assert after < 0.82 * before


def test_whitespace_inside_strings_escapes_and_unicode_are_kept() -> None:
    """Spaces, separators, escaped quotes, \\u escapes and non-ASCII inside strings are
    kept character for character; only the whitespace between values goes."""
    text = (
        '{"note": "a  b , c : d", "quote": "say \\"hi\\", then: \\\\ ",'
        ' "escaped": "caf\\u00e9", "raw": "café ☃ 日本", "tab": "x\\ty"}'
    )
    assert compact_json(text) == (
        '{"note":"a  b , c : d","quote":"say \\"hi\\", then: \\\\ ",'
        '"escaped":"caf\\u00e9","raw":"café ☃ 日本","tab":"x\\ty"}'
    )


def test_numbers_keep_their_text() -> None:
    """Numbers are kept as written: 1.10 stays 1.10, 1e5 stays 1e5, big integers whole."""
    text = "[1.10, 1e5, -0, 2E-3, 0.5000, 123456789012345678901234567890]"
    assert compact_json(text) == "[1.10,1e5,-0,2E-3,0.5000,123456789012345678901234567890]"


def test_indented_json_and_surrounding_whitespace() -> None:
    """Indented JSON and whitespace around the value are removed; key order is kept."""
    text = "\n  " + json.dumps({"z": 1, "a": [1, {"b": None}]}, indent=2) + "\n"
    assert compact_json(text) == '{"z":1,"a":[1,{"b":null}]}'


def test_what_is_not_a_json_object_or_array_is_left_alone() -> None:
    """Plain text, invalid JSON, JSON scalars and already-compact JSON come back as the
    very same string."""
    for text in (
        "Error: payment amount does not add up, total price is 305, but paid 255",
        "255.0",
        '"a string with  spaces"',
        "true",
        "",
        "   ",
        "{not json at all}",
        '{"a": 1,}',
        "[1, 2",
        '{"a": NaN}',
        '["lone \\ud800 surrogate"]',
        '{"a": 1} trailing words',
        '{"a":1,"b":[2,3]}',
        "[]",
    ):
        assert compact_json(text) is text, text


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(
    value=st.lists(json_values, max_size=4) | st.dictionaries(st.text(), json_values, max_size=4),
    indent=st.sampled_from([None, 0, 2, "\t"]),
    ascii_only=st.booleans(),
)
def test_compact_text_is_what_compact_separators_print(
    value: Any, indent: Any, ascii_only: bool
) -> None:
    """Any object or array printed with spaces or indentation compacts to exactly what
    json.dumps prints with compact separators (so it reads back as the same value)."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only)
    compact = compact_json(text)
    assert compact == (expected if len(expected) < len(text) else text)


def test_the_cache_gives_the_same_bytes_and_stays_bounded() -> None:
    """The cached compaction gives what compact_json gives, and keeps at most its
    entries and characters."""
    compaction = JsonCompaction(entries=2, chars=1_000)
    texts = [json.dumps({"i": i, "items": list(range(i * 10))}) for i in range(1, 6)]
    for text in texts + texts:
        assert compaction(text) == compact_json(text)
    assert len(compaction._kept) <= 2
    small = JsonCompaction(chars=30)
    big = json.dumps(list(range(100)))
    assert small(big) == compact_json(big)
    assert small._chars <= 30


def test_text_that_is_plainly_not_json_is_not_kept() -> None:
    """Outputs that open like JSON but are not (a log line starting with ``[``) are
    rejected at their first characters each time, without filling the cache; a text that
    fails late (a long JSON array cut short) is kept, so its long parse is not repeated."""
    compaction = JsonCompaction()
    lines = [f"[{n}] booking BK{n:04d}: seat 7C, confirmed\n" * 80 for n in range(50)]
    assert all(compaction(text) is text for text in lines)
    assert len(compaction._kept) == 0
    cut = json.dumps(list(range(2_000)))[:-1]
    assert compaction(cut) is cut
    assert len(compaction._kept) == 1


# Through the pipeline.


def with_output(output: str, *, tail: int = 0) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an airline agent."},
        {"role": "user", "content": "Find flights"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "search", "content": output},
    ]
    for i in range(tail):
        messages += [
            {"role": "assistant", "content": f"Answer {i}: " + "details " * 200},
            {"role": "user", "content": f"Question {i}"},
        ]
    return messages


SPACED = json.dumps(
    [{"flight": f"HAT{i:03d}", "price": 100.10, "note": "a  b"} for i in range(40)], indent=2
)


async def test_the_flag_off_leaves_the_request_byte_identical() -> None:
    """With compact-json=?0 a request with JSON tool outputs goes out byte for byte as
    sent; with the default it goes out compact and the filter reports the saving."""
    # The client's own prompt_cache_key: else cache_markers sets one.
    request = {"model": "gpt-4o", "messages": with_output(SPACED), "prompt_cache_key": "k"}
    pipeline = Pipeline(store=MemoryStore())
    off = await pipeline.compact(request, policy=Policy(compact_json=False))
    assert not off.changed
    assert orjson.dumps(off.request) == orjson.dumps(request)
    on = await pipeline.compact(request, policy=Policy())
    assert on.request["messages"][3]["content"] == compact_json(SPACED)
    assert "filter" in on.report.actions
    filtered = on.report.stage("filter")
    assert filtered is not None
    assert filtered.details["json_compacted"] == 1
    saved = filtered.details["json_tokens_saved"]
    assert saved > 0
    assert filtered.tokens_before - filtered.tokens_after == saved
    assert on.report.tokens_after < off.report.tokens_after


async def test_text_parts_are_compacted_one_by_one() -> None:
    """A tool output given as text parts has each JSON part compacted, other parts kept."""
    parts = [{"type": "text", "text": SPACED}, {"type": "text", "text": "and a  note"}]
    messages = with_output("")
    messages[3] = {**messages[3], "content": parts}
    result = await Pipeline(store=MemoryStore()).compact({"model": "gpt-4o", "messages": messages})
    sent = result.request["messages"][3]["content"]
    assert sent == [{"type": "text", "text": compact_json(SPACED)}, parts[1]]


async def test_an_output_that_fits_once_compact_is_sent_whole() -> None:
    """An indented output over filter-tokens as sent but under it once compact is sent
    whole (compact), not offloaded behind a preview."""
    counter = TokenCounter("o200k_base")
    limit = (counter.count_text(SPACED) + counter.count_text(compact_json(SPACED))) // 2
    result = await Pipeline(store=MemoryStore()).compact(
        {"model": "gpt-4o", "messages": with_output(SPACED)}, policy=Policy(filter_tokens=limit)
    )
    assert result.request["messages"][3]["content"] == compact_json(SPACED)
    assert result.report.stage("filter").details["outputs_offloaded"] == 0  # type: ignore[union-attr]


async def restored(store: MemoryStore, request: dict[str, Any]) -> list[str]:
    """Every text the refs of ``request`` restore, following refs inside restored
    content: raw objects as they are, stored message lists as their contents."""
    texts: list[str] = []
    pending = REF.findall(orjson.dumps(request).decode())
    seen: set[str] = set()
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        data = await store.get("", ref)
        assert data is not None, ref
        text = data.decode()
        texts.append(text)
        pending += REF.findall(text)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            texts += [m["content"] for m in value if isinstance(m, dict) and "content" in m]
    return texts


async def assert_offloads_are_as_received(
    store: MemoryStore, history: list[dict[str, Any]], request: dict[str, Any]
) -> int:
    """Every JSON output of ``history`` that ``request`` does not carry (as sent or
    compact) restores through its refs as the client sent it, and no restored text is a
    compacted output; how many outputs were restored."""
    sent = orjson.dumps(request).decode()
    texts = await restored(store, request)
    found = set(texts)
    restored_outputs = 0
    for message in history:
        content = message.get("content")
        if message["role"] != "tool" or not isinstance(content, str):
            continue
        compact = compact_json(content)
        if compact is content:
            continue
        assert compact not in found, "the gateway's compact form was offloaded"
        if orjson.dumps(compact).decode() in sent:
            continue
        assert content in found or any(content in text for text in texts)
        restored_outputs += 1
    return restored_outputs


async def test_outputs_offloaded_by_compress_restore_as_sent() -> None:
    """Replaying traces at max-input 4,000 (compress's notes, shortening, deduplication):
    each removed JSON output restores byte for byte as the client sent it, never as the
    compact text that was sent instead."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    total = 0
    for trajectory in trajectories()[:30]:
        session = Session(pipeline, Policy(max_input=4_000))
        for history in requests_of(trajectory):
            result = await session.send(history)
            total += await assert_offloads_are_as_received(store, history, result.request)
    assert total > 300


async def test_outputs_archived_after_a_pause_restore_as_sent() -> None:
    """With the cache lapsing (15 minutes between turns) the cache-TTL prune archives and
    trims old outputs: each restores as the client sent it."""
    store = MemoryStore()
    pipeline = Pipeline(store=store)
    total = archived = 0
    for trajectory in trajectories()[:30]:
        session = Session(pipeline, Policy(max_input=8_000))
        for history in requests_of(trajectory):
            result = await session.send(history, after=900.0)
            pruned = result.report.stage("ttl_prune")
            archived += bool(pruned and pruned.changed)
            total += await assert_offloads_are_as_received(store, history, result.request)
    assert archived > 20
    assert total > 50


async def test_outputs_a_summary_stands_for_restore_as_sent() -> None:
    """With summaries, the originals a checkpoint stores are the outputs as sent, and the
    summary model reads them compact."""
    store = MemoryStore()
    summarizer = Scripted()
    trajectory = max(trajectories(), key=len)
    history = requests_of(trajectory)[-1]
    result = await Pipeline(store=store, summarizer=summarizer).compact(
        {"model": "gpt-4o", "messages": history}, policy=Policy(max_input=5_500)
    )
    assert result.report.stage("summarize").details["path"] == "summarised"  # type: ignore[union-attr]
    assert await assert_offloads_are_as_received(store, history, result.request) > 5
    read = [m["content"] for call in summarizer.calls for m in call["messages"]]
    outputs = [m["content"] for m in history if m["role"] == "tool"]
    compacted = [compact_json(text) for text in outputs if compact_json(text) is not text]
    assert any(text in read for text in compacted)
    assert not any(text in read for text in outputs if compact_json(text) is not text)


async def test_an_output_shortened_in_an_emergency_restores_as_sent() -> None:
    """An output in the protected tail shortened to fit (emergency) names a ref that
    restores the client's bytes."""
    big = json.dumps([{"id": i, "text": "word " * 20} for i in range(300)], indent=2)
    store = MemoryStore()
    result = await Pipeline(store=store).compact(
        {"model": "gpt-4o", "messages": with_output(big)},
        policy=Policy(max_input=4_000, filter_tokens=100_000),
    )
    assert result.report.tokens_after <= 4_000
    out = result.request["messages"][3]["content"]
    assert out.startswith("[Shortened")
    ref = REF.search(out).group()  # type: ignore[union-attr]
    assert await store.get("", ref) == big.encode()


async def test_the_same_history_twice_gives_the_same_bytes() -> None:
    """The same history, sent again (to the same gateway, or to a fresh one sharing the
    store's secret), goes out byte for byte the same; and a growing history keeps its
    compacted outputs' bytes from turn to turn."""
    store = MemoryStore()
    trajectory = trajectories()[0]
    request = {"model": "gpt-4o", "messages": trajectory}
    first = await Pipeline(store=store).compact(request)
    again = await Pipeline(store=store).compact(request)
    assert first.report.stage("filter").details["json_compacted"] > 0  # type: ignore[union-attr]
    assert orjson.dumps(first.request) == orjson.dumps(again.request)
    session = Session(Pipeline(store=store), Policy())
    previous: list[dict[str, Any]] = []
    for history in requests_of(trajectory):
        sent = (await session.send(history)).request["messages"]
        assert orjson.dumps(sent[: len(previous)]) == orjson.dumps(previous)
        previous = sent
