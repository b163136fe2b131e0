"""Reading chat messages: parts, text, and the conversation view."""

from __future__ import annotations

from pipelines.conversation import Conversation
from pipelines.messages import iter_parts, message_text


def test_parts_of_every_kind() -> None:
    """Text, refusal and thinking parts give text; images and media (an Anthropic PDF
    document too) give nothing; unknown parts give their JSON so they are still counted."""
    content = [
        {"type": "text", "text": "hello"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
        {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
        {"type": "refusal", "refusal": "no"},
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "mystery", "value": 1},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"},
        },
    ]
    assert list(iter_parts(content)) == [
        ("text", "hello"),
        ("image", ""),
        ("media", ""),
        ("text", "no"),
        ("text", "hmm"),
        ("other", '{"type":"mystery","value":1}'),
        ("media", ""),
    ]
    assert list(iter_parts(None)) == []
    assert message_text({"role": "user", "content": content}) == "hello\nno\nhmm"


def test_conversation_round_trip_keeps_fields_and_order() -> None:
    """A conversation gives back the request with its fields in their order, messages and
    changes applied, without touching the original."""
    request = {"model": "m", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    conversation = Conversation.from_request(request)
    changed = conversation.with_messages([{"role": "user", "content": "b"}]).with_fields(
        prompt_cache_key="k"
    )
    out = changed.to_request()
    assert list(out) == ["model", "messages", "temperature", "prompt_cache_key"]
    assert out["messages"] == [{"role": "user", "content": "b"}]
    assert request["messages"] == [{"role": "user", "content": "a"}]
    assert changed.get("prompt_cache_key") == "k"
    assert conversation.model == "m"


def test_a_compaction_blocks_summary_is_counted_as_text() -> None:
    """An Anthropic compaction block's readable summary is text the model reads (counted);
    its encrypted content, and a Responses compaction item, are opaque (estimated apart)."""
    anthropic_block = {
        "type": "compaction",
        "content": "The task so far.",
        "encrypted_content": "x",
    }
    responses_item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA"}
    assert list(iter_parts([anthropic_block, responses_item])) == [("text", "The task so far.")]
