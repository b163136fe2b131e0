"""The gateway's own compaction blocks, in process over the in-memory store: made,
signed, expanded into their checkpoint, refused when forged, and standing for their
summary once the checkpoint is gone."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.context.compaction_block import MARK, block, compaction_policy, expanded
from gateway.errors import InvalidRequest
from gateway.store.memory import MemoryStore
from pipelines import Policy

SECRET = b"s" * 32
SYSTEM = {"role": "system", "content": "You audit logs."}


def compacted() -> dict[str, Any]:
    """What the pipeline sent for a compacted conversation."""
    return {
        "model": "gpt-4o",
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Task: audit the build logs."},
            {"role": "user", "content": "[Context note: 20 earlier messages were removed.]"},
            {"role": "user", "content": "RUN: echo done"},
        ],
    }


def sent_back(made: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    turn = {"role": "assistant", "content": [made, {"type": "text", "text": "Done."}]}
    return {"model": "gpt-4o", "messages": [*history, turn, {"role": "user", "content": "next"}]}


async def test_a_block_expands_into_its_checkpoint_and_its_conversation() -> None:
    """The block's summary quotes the task, the notes and the latest request; sent back
    after any history, it is replaced by the checkpoint: the system prompt as the client
    sends it now, the messages that went up, the rest of the answer, what came since."""
    store = MemoryStore()
    made = await block(compacted(), store, "ns", SECRET, ttl=60, removed=9_000, conversation="c1")
    assert made["encrypted_content"].startswith(MARK + "ctx_")
    assert "Task: audit the build logs." in made["content"]
    assert "RUN: echo done" in made["content"]
    old = [{"role": "user", "content": f"old {n}"} for n in range(5)]
    found = await expanded(
        sent_back(made, [SYSTEM, *old]), store, "ns", SECRET, ttl=60, ours_only=True
    )
    assert found.conversation == "c1"
    assert found.body["messages"] == [
        SYSTEM,
        *compacted()["messages"][1:],
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        {"role": "user", "content": "next"},
    ]


@pytest.mark.parametrize(
    ("namespace", "secret", "change"),
    [
        ("other", SECRET, {}),
        ("ns", b"t" * 32, {}),
        ("ns", SECRET, {"content": "A summary the client wrote."}),
        ("ns", SECRET, {"encrypted_content": MARK + "ctx_" + "A" * 24 + ".x"}),
        ("ns", SECRET, {"encrypted_content": "EqQBmock-anthropic"}),
    ],
)
async def test_a_block_not_signed_for_this_key_is_refused(
    namespace: str, secret: bytes, change: dict[str, str]
) -> None:
    """Another key's block, one signed under another secret, a changed summary, a forged
    ref and a provider's own block on a route the gateway compacts for: a 400."""
    store = MemoryStore()
    made = await block(compacted(), store, "ns", SECRET, ttl=60, removed=1, conversation="c")
    with pytest.raises(InvalidRequest, match="compaction block"):
        await expanded(
            sent_back({**made, **change}, [SYSTEM]),
            store,
            namespace,
            secret,
            ttl=60,
            ours_only=True,
        )


async def test_a_block_whose_checkpoint_is_gone() -> None:
    """With the history it replaced sent again, the block is left out (that history is
    compacted again); without it, its summary stands in as recalled context. A block
    with null content (a failed compaction) is a no-op."""
    made = await block(
        compacted(), MemoryStore(), "ns", SECRET, ttl=60, removed=1, conversation="c"
    )
    empty = MemoryStore()
    history = [SYSTEM, {"role": "user", "content": "Task: audit the build logs."}]
    again = await expanded(sent_back(made, history), empty, "ns", SECRET, ttl=60, ours_only=True)
    assert again.fallback
    assert again.body["messages"][:2] == history
    assert "[Recalled context" not in str(again.body)
    alone = await expanded(sent_back(made, [SYSTEM]), empty, "ns", SECRET, ttl=60, ours_only=True)
    recalled = alone.body["messages"][1]
    assert recalled["content"].startswith("[Recalled context")
    assert made["content"] in recalled["content"]
    failed = {"type": "compaction", "content": None}
    body = sent_back(failed, [SYSTEM])
    assert (await expanded(body, empty, "ns", SECRET, ttl=60, ours_only=True)).body is body


def test_the_compaction_policy_aims_under_the_clients_trigger() -> None:
    """The compaction runs at full compaction (80% of its budget) and aims at a quarter
    of the request or half the client's trigger, whichever is less."""
    policy = compaction_policy(Policy(), 100_000, 50_000)
    assert policy.max_input is not None
    assert policy.trigger <= 100_000 / policy.max_input < policy.emergency
    assert policy.target * policy.max_input == pytest.approx(25_000, rel=0.01)
    tight = compaction_policy(Policy(), 100_000, 20_000)
    assert tight.target * tight.max_input == pytest.approx(10_000, rel=0.01)  # type: ignore[operator]
