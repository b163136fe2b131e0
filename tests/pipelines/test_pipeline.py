"""The pipeline as a library: the stage order and ``compact``."""

from __future__ import annotations

import ast
from pathlib import Path

import pipelines
from pipelines import DEFAULT_STAGES, STAGE_NAMES, Pipeline, Policy, compact
from pipelines.counting import THREADED_MEASURE_CHARS

ELEVEN = (
    "guard_inbound",
    "native_edits",
    "thinking",
    "media",
    "filter",
    "ttl_prune",
    "compress",
    "summarize",
    "normalize",
    "cache_markers",
    "guard_outbound",
)


def test_default_stages_are_the_eleven_in_order() -> None:
    """DEFAULT_STAGES names the ten stages of the design in its order, with the client's
    native edits applied (where the upstream cannot) right after the inbound guard."""
    assert STAGE_NAMES == ELEVEN
    assert len(DEFAULT_STAGES) == 11


def test_stage_order_is_one_literal_tuple() -> None:
    """The order is written once, as a literal tuple, in pipelines/stages/__init__.py."""
    source = Path(pipelines.__file__).parent / "stages" / "__init__.py"
    assignments = [
        node
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and "DEFAULT_STAGES" in ast.unparse(node).split("=")[0]
    ]
    assert len(assignments) == 1
    assert isinstance(assignments[0].value, ast.Tuple)


async def test_module_compact_uses_request_model_and_policy() -> None:
    """``pipelines.compact`` budgets for the request's model, or the one it is told."""
    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    result = await compact(request)
    assert (result.report.model, result.report.budget) == ("gpt-4o", 128_000 - 16_384)
    capped = await compact(request, model="gpt-4.1", policy=Policy(max_input=20_000))
    assert (capped.report.model, capped.report.budget) == ("gpt-4.1", 20_000)


async def test_long_history_counts_the_same_on_a_worker_thread() -> None:
    """A history long enough to be counted off the event loop counts the same as the sum of
    its messages."""
    messages = [
        {
            "role": "user" if i % 2 else "assistant",
            "content": f"turn {i}: " + "some words of history " * 400,
        }
        for i in range(20)
    ]
    assert sum(len(m["content"]) for m in messages) > THREADED_MEASURE_CHARS
    pipeline = Pipeline()
    result = await pipeline.compact({"model": "gpt-4o", "messages": messages})
    counter = pipeline.counter("o200k_base")
    assert result.report.tokens_before == counter.count_messages(messages)


async def test_module_compact_with_io_shares_token_caches() -> None:
    """``pipelines.compact`` with a store of its own still reuses the shared token counts."""

    class Store:
        async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
            return "ctx_" + "a" * 22

        async def get(self, namespace: str, ref: str) -> bytes | None:
            return None

    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "shared cache"}]}
    await compact(request)
    default_counter = pipelines.pipeline._default.counter("o200k_base")  # type: ignore[union-attr]
    hits, misses = default_counter.hits, default_counter.misses
    await compact(request, store=Store())
    assert default_counter.misses == misses
    assert default_counter.hits > hits


class _Objects:
    """An offload store in a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put(self, namespace: str, content: bytes, *, ttl: int) -> str:
        ref = f"ctx_{len(self.objects):024d}"
        self.objects[ref] = content
        return ref

    async def get(self, namespace: str, ref: str) -> bytes | None:
        return self.objects.get(ref)


async def test_a_providers_compaction_block_is_pinned_through_every_stage() -> None:
    """A conversation that carries a provider's compaction block (Anthropic's, sent back by
    the client), compacted hard under a tight budget, emergency included: the message that
    holds the block reaches the upstream as it came, after the opening it follows."""
    block = {"type": "compaction", "content": "Summary so far.", "encrypted_content": "EqQ" * 400}
    holder = {"role": "assistant", "content": [block, {"type": "text", "text": "Carrying on."}]}
    messages: list[dict[str, object]] = [{"role": "user", "content": "Start the audit."}]
    for step in range(30):
        messages.append({"role": "assistant", "content": f"Looking at part {step}. " * 40})
        messages.append({"role": "user", "content": f"Part {step} looks like this: " + "x " * 400})
        if step == 5:
            messages.append(holder)
            messages.append({"role": "user", "content": "Go on."})
    request = {"model": "gpt-4o", "messages": messages}
    for max_input in (20_000, 6_000):
        result = await Pipeline(store=_Objects()).compact(
            request, policy=Policy(max_input=max_input, mode="truncate")
        )
        assert result.changed
        sent = result.request["messages"]
        assert sum(message == holder for message in sent) == 1
        assert sent.index(holder) > sent.index(messages[0])
