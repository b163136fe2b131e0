"""compress's memos: the last cut re-applied gives the same bytes as computing it, and the
cuts kept stay within their bound."""

from __future__ import annotations

import json

import orjson
import pytest

from bench.compaction import Session, requests_of
from gateway.store import MemoryStore
from pipelines import Pipeline, Policy
from pipelines.stages.compress import Compress
from tests.pipelines.stages.compress.samples import TRACES


@pytest.mark.parametrize("max_input", [4_000, 8_000])
async def test_reusing_the_last_cut_gives_the_same_bytes_as_computing_it(max_input: int) -> None:
    """A pipeline that re-applies each conversation's last cut sends exactly what a fresh
    pipeline (no memory of earlier requests) computes, turn by turn, on every trace."""
    from pipelines.stages import DEFAULT_STAGES, PassThrough

    store = MemoryStore()
    policy = Policy(max_input=max_input)
    remembering = Pipeline(store=store)
    reused = 0
    for trajectory in json.loads(TRACES.read_text()):
        session = Session(remembering, policy)
        for history in requests_of(trajectory["traj"]):
            state = session.state
            result = await session.send(history)
            fresh = Pipeline(
                stages=[s if isinstance(s, PassThrough) else type(s)() for s in DEFAULT_STAGES],
                store=store,
            )
            fresh._counters = remembering._counters
            computed = await fresh.compact(
                {"model": "gpt-4o", "messages": history},
                policy=policy,
                state=state,
                now=session.now,
            )
            assert orjson.dumps(result.request) == orjson.dumps(computed.request)
            compress = result.report.stage("compress")
            reused += bool(compress and compress.details.get("reused"))
    # With compact JSON the traces leave 77 cut requests at 8,000 tokens (686 at 4,000).
    assert reused > 50


async def test_the_cuts_kept_for_reuse_stay_within_their_bound() -> None:
    """Each conversation's last cut is kept to be re-applied, with the tool outputs before
    it (whole histories' worth on long conversations): together they stay within
    ``memo_chars``, the least recently used conversations dropped first, and the latest
    conversation still has its cut re-applied."""
    from pipelines.stages import DEFAULT_STAGES

    compress = Compress(memo_chars=40_000)
    stages = [compress if isinstance(s, Compress) else s for s in DEFAULT_STAGES]
    pipeline = Pipeline(stages=stages, store=MemoryStore())
    messages = json.loads(TRACES.read_text())[0]["traj"]
    for number in range(8):
        # Eight conversations: the same trace under eight system prompts.
        system = {**messages[0], "content": f"Agent {number}. {messages[0]['content']}"}
        session = Session(pipeline, Policy(max_input=4_000))
        # Request 9 makes a clean cut, the next ones re-apply it.
        for history in requests_of([system, *messages[1:]])[:12]:
            result = await session.send(history)
        assert compress._memos.held <= 40_000
    details = result.report.stage("compress").details  # type: ignore[union-attr]
    assert details.get("reused")
    assert 2 <= len(compress._memos) < 8
