"""The thinking binding: asked only of a request that sends thinking back, never over
thinking turned off or a binding of the client's own, its beta added to the client's."""

from __future__ import annotations

from gateway.codecs.chat_anthropic import (
    THINKING_BINDING_BETA,
    sends_thinking,
    unbinding,
    with_beta,
)

THOUGHT = {"type": "thinking", "thinking": "Hm.", "signature": "c2ln"}
DROP = {"prefix_mismatch_behavior": "drop_block"}


def test_a_request_sends_thinking_back_in_an_answers_blocks_or_parts() -> None:
    """Thinking blocks or thinking parts of an earlier answer count; a user's do not."""
    answer = {"role": "assistant", "content": "Mild."}
    assert sends_thinking({"messages": [{**answer, "thinking_blocks": [THOUGHT]}]})
    assert sends_thinking({"messages": [{**answer, "content": [THOUGHT]}]})
    assert not sends_thinking({"messages": [{"role": "user", "content": [THOUGHT]}, answer]})


def test_the_binding_is_asked_unless_thinking_is_off_or_already_bound() -> None:
    """No setting becomes adaptive thinking with the binding; a client's own is kept."""
    enabled = {"type": "enabled", "budget_tokens": 2_048}
    assert unbinding(None) == {"type": "adaptive", "block_binding": DROP}
    assert unbinding(enabled) == {**enabled, "block_binding": DROP}
    assert unbinding({"type": "disabled"}) is None
    assert unbinding({**enabled, "block_binding": {"prefix_mismatch_behavior": "x"}}) is None


def test_the_beta_joins_the_clients_betas_once() -> None:
    """The client's betas stay, in order; one already there is not repeated."""
    headers = {"anthropic-beta": "a-1, b-2", "x-api-key": "k"}
    assert with_beta(headers, THINKING_BINDING_BETA) == {
        "anthropic-beta": f"a-1,b-2,{THINKING_BINDING_BETA}",
        "x-api-key": "k",
    }
    assert with_beta({"anthropic-beta": "b-2"}, "b-2") == {"anthropic-beta": "b-2"}
