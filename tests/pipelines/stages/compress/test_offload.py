"""compress without a store, or with one that fails: nothing is removed, and only the
budget forces shortening, with no copy kept and no ref named."""

from __future__ import annotations

import json

import orjson

from bench.compaction import requests_of
from pipelines import Pipeline, Policy
from pipelines.stages.compress import Compress
from tests.pipelines.stages.compress.samples import REF, TRACES
from tests.pipelines.stages.conftest import FailingStore


async def test_without_a_store_only_the_budget_forces_shortening() -> None:
    """With no store (or one that fails) nothing is removed while the request fits. When
    it cannot be sent otherwise, the largest texts are shortened and each says that no
    copy is kept; no ref is ever named, since nothing stands behind one."""
    trajectory = max(json.loads(TRACES.read_text()), key=lambda t: len(t["traj"]))["traj"]
    history = requests_of(trajectory)[-1]
    request = {"model": "gpt-4o", "messages": history}
    for pipeline in (
        Pipeline(stages=[Compress()]),
        Pipeline(stages=[Compress()], store=FailingStore()),
    ):
        roomy = await pipeline.compact(request, policy=Policy(max_input=9_000))
        assert roomy.report.tokens_before > 0.7 * 9_000
        assert not roomy.changed
        tight = await pipeline.compact(request, policy=Policy(max_input=4_000))
        assert tight.report.tokens_after <= 4_000
        sent = orjson.dumps(tight.request).decode()
        assert REF.search(sent) is None
        shortened = [
            m for m in tight.request["messages"] if "no copy is kept" in str(m.get("content"))
        ]
        assert len(shortened) == tight.report.stages[0].details["lossy_shortened"]
        assert tight.request["messages"][0] == history[0]
        assert tight.request["messages"][-1] == history[-1]
