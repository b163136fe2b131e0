"""The model catalog: what the pipeline needs to know about a model to budget for it.

Entries are matched by glob against the model name; the most specific pattern (the longest
one without wildcards counted) wins, so ``gpt-4o-mini*`` beats ``gpt-4o*``. A provider
prefix such as ``openai/`` or ``anthropic/`` is ignored for matching. A model that matches
nothing gets the defaults of ``UNKNOWN_MODEL`` (a 128,000-token window). The gateway's
configuration can add entries or override built-in ones.

Beside the budget facts, a price table (``ModelPrice``, matched the same way, except that a
configured price wins over every built-in one that matches) gives what a model's tokens
cost, for the inspector's estimates of what a request cost with the gateway and would have
cost without it. A model without a price has none: its cost is unknown, never guessed. The
built-in prices are the providers' published list prices for a few models whose prices are
settled (``BUILTIN_PRICES``); the configuration adds the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Final, Literal, TypeVar

__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PRICES",
    "DEFAULT_WINDOW",
    "ModelCatalog",
    "ModelInfo",
    "ModelPrice",
    "ThinkingStyle",
]

Family = Literal[
    "openai", "anthropic", "deepseek", "kimi", "mimo", "qwen", "gemini", "mistral", "llama", "other"
]
ThinkingStyle = Literal["anthropic", "reasoning_echo", "none"]
"""How a model's reasoning travels in history: Anthropic ``thinking`` blocks with
signatures; ``reasoning_content`` that must be echoed back on tool-call turns (DeepSeek,
Kimi, MiMo); or neither."""

DEFAULT_WINDOW: Final = 128_000


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Budget facts about one model."""

    pattern: str
    """Glob matched against the model name, e.g. ``gpt-4o*``."""
    context_window: int = DEFAULT_WINDOW
    """Total tokens the model accepts, input and output together."""
    output_reserve: int = 4_096
    """Tokens kept free for the reply when the request does not set ``max_tokens``."""
    family: Family = "other"
    """Provider family; decides reasoning cleanup and cache behaviour."""
    thinking: ThinkingStyle = "none"
    encoding: str = "o200k_base"
    """tiktoken encoding used to count this model's tokens."""
    cache_ttl: int = 300
    """Seconds the provider keeps a prompt-cache entry warm."""
    vision: bool = True
    """Whether the model accepts image parts."""
    soft_ratio: float = 0.30
    """Utilisation at which a cold cache lets the TTL prune soft-trim old tool results."""
    hard_ratio: float = 0.50
    """Utilisation at which a cold cache lets the TTL prune archive old tool results."""
    keeps_thinking: bool = False
    """Whether the model keeps the thinking of earlier turns in its context when the
    request does not say (Claude Opus 4.5 and later): its thinking blocks stay in the
    history it is sent. Otherwise only the current turn's are kept (the API ignores the
    rest)."""
    thinking_bound: bool = False
    """Whether a thinking block the model wrote is bound to the prompt before it
    (Anthropic's "preserved thinking", Claude Fable 5.1, Opus 5.5 and later): sent back
    after anything before it changed, the API refuses the request unless told to drop such
    blocks (``thinking.block_binding``)."""

    def __post_init__(self) -> None:
        if self.context_window < 1_000:
            raise ValueError(f"{self.pattern}: context_window must be at least 1000")
        if not 0 <= self.output_reserve < self.context_window:
            raise ValueError(f"{self.pattern}: output_reserve must be in [0, context_window)")
        if self.cache_ttl < 0:
            raise ValueError(f"{self.pattern}: cache_ttl must not be negative")
        if not 0 < self.soft_ratio <= self.hard_ratio <= 1:
            raise ValueError(f"{self.pattern}: need 0 < soft_ratio <= hard_ratio <= 1")


def _openai(pattern: str, window: int, reserve: int, encoding: str = "o200k_base") -> ModelInfo:
    return ModelInfo(pattern, window, reserve, "openai", "none", encoding, cache_ttl=600)


def _claude(pattern: str, window: int, reserve: int, *, bound: bool = False) -> ModelInfo:
    """A Claude model that keeps earlier turns' thinking (``bound``: and binds it to its
    prefix)."""
    return ModelInfo(
        pattern,
        window,
        reserve,
        "anthropic",
        "anthropic",
        cache_ttl=300,
        keeps_thinking=True,
        thinking_bound=bound,
    )


BUILTIN_MODELS: Final[tuple[ModelInfo, ...]] = (
    _openai("gpt-5*", 400_000, 128_000),
    _openai("gpt-4.1*", 1_047_576, 32_768),
    _openai("gpt-4o*", 128_000, 16_384),
    _openai("chatgpt-4o*", 128_000, 16_384),
    _openai("o1*", 200_000, 100_000),
    _openai("o3*", 200_000, 100_000),
    _openai("o4-mini*", 200_000, 100_000),
    _openai("gpt-4-turbo*", 128_000, 4_096, "cl100k_base"),
    _openai("gpt-4-*preview*", 128_000, 4_096, "cl100k_base"),
    _openai("gpt-4", 8_192, 4_096, "cl100k_base"),
    _openai("gpt-4-0*", 8_192, 4_096, "cl100k_base"),
    _openai("gpt-4-32k*", 32_768, 4_096, "cl100k_base"),
    _openai("gpt-3.5-turbo*", 16_385, 4_096, "cl100k_base"),
    _openai("gpt-oss*", 131_072, 32_768),
    ModelInfo("claude-*", 200_000, 8_192, "anthropic", "anthropic", cache_ttl=300),
    ModelInfo("claude-3-haiku*", 200_000, 4_096, "anthropic", "anthropic", cache_ttl=300),
    _claude("claude-opus-4-5*", 200_000, 64_000),
    _claude("claude-opus-4-6*", 200_000, 128_000),
    _claude("claude-sonnet-4-6*", 200_000, 64_000),
    _claude("claude-opus-4-7*", 200_000, 128_000),
    _claude("claude-opus-4-8*", 200_000, 128_000),
    _claude("claude-opus-5*", 1_000_000, 128_000),
    _claude("claude-sonnet-5*", 1_000_000, 128_000),
    _claude("claude-haiku-5*", 1_000_000, 128_000),
    _claude("claude-opus-5-5*", 1_000_000, 128_000, bound=True),
    _claude("claude-sonnet-5-5*", 1_000_000, 128_000, bound=True),
    _claude("claude-haiku-5-5*", 1_000_000, 128_000, bound=True),
    _claude("claude-fable-*", 1_000_000, 128_000),
    _claude("claude-fable-5-[1-9]*", 1_000_000, 128_000, bound=True),
    _claude("claude-mythos-*", 1_000_000, 128_000),
    _claude("claude-mythos-5-[1-9]*", 1_000_000, 128_000, bound=True),
    ModelInfo("deepseek-*", 128_000, 8_192, "deepseek", "reasoning_echo", cache_ttl=3600),
    ModelInfo("kimi-*", 262_144, 16_384, "kimi", "reasoning_echo", cache_ttl=3600),
    ModelInfo("moonshot-*", 131_072, 8_192, "kimi", "reasoning_echo", cache_ttl=3600),
    ModelInfo("mimo-*", 131_072, 8_192, "mimo", "reasoning_echo", cache_ttl=3600),
    ModelInfo("qwen*", 131_072, 8_192, "qwen", "none", cache_ttl=300),
    ModelInfo("gemini-*", 1_048_576, 65_536, "gemini", "none", cache_ttl=3600),
    ModelInfo("mistral-*", 131_072, 8_192, "mistral", "none", vision=False),
    ModelInfo("llama*", 131_072, 8_192, "llama", "none", vision=False),
)

UNKNOWN_MODEL: Final = ModelInfo("*")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """What one model's tokens cost, in US dollars per million tokens."""

    pattern: str
    """Glob matched against the model name, as in ``ModelInfo``."""
    input: float
    """Input tokens not read from the provider's cache."""
    output: float
    cached_input: float | None = None
    """Input tokens read from the cache (``None``: priced as ``input``)."""
    cache_write: float | None = None
    """Input tokens written to the cache (``None``: priced as ``input``)."""


BUILTIN_PRICES: Final[tuple[ModelPrice, ...]] = (
    ModelPrice("gpt-4o", 2.50, 10.00, 1.25),
    ModelPrice("gpt-4o-2024-08-06", 2.50, 10.00, 1.25),
    ModelPrice("gpt-4o-2024-11-20", 2.50, 10.00, 1.25),
    ModelPrice("gpt-4o-mini*", 0.15, 0.60, 0.075),
    ModelPrice("gpt-4.1", 2.00, 8.00, 0.50),
    ModelPrice("gpt-4.1-2025-04-14", 2.00, 8.00, 0.50),
    ModelPrice("gpt-4.1-mini*", 0.40, 1.60, 0.10),
    ModelPrice("gpt-4.1-nano*", 0.10, 0.40, 0.025),
    ModelPrice("claude-sonnet-4-5*", 3.00, 15.00, 0.30, 3.75),
    ModelPrice("claude-opus-4-5*", 5.00, 25.00, 0.50, 6.25),
    ModelPrice("claude-haiku-4-5*", 1.00, 5.00, 0.10, 1.25),
)
"""List prices as the providers published them in 2025 (standard tier, five-minute cache
writes); exact names where a family's snapshots were priced differently."""

_Entry = TypeVar("_Entry", ModelInfo, ModelPrice)


def _matching(entries: Iterable[_Entry]) -> tuple[_Entry, ...]:
    """``entries`` by pattern, the later of equal patterns kept, the most specific first."""
    by_pattern = {entry.pattern: entry for entry in entries}
    return tuple(sorted(by_pattern.values(), key=lambda e: _specificity(e.pattern), reverse=True))


def _match(entries: tuple[_Entry, ...], model: str) -> _Entry | None:
    name = model.rsplit("/", 1)[-1].lower()
    return next((entry for entry in entries if fnmatchcase(name, entry.pattern.lower())), None)


def _specificity(pattern: str) -> tuple[int, int]:
    literal = sum(1 for ch in pattern if ch not in "*?[]")
    return literal, -pattern.count("*")


_KEPT_LOOKUPS: Final = 4_096
"""Model names whose entry and price a catalog keeps found (each once matched)."""


class ModelCatalog:
    """Looks up ``ModelInfo`` by model name; later entries override earlier equal patterns."""

    __slots__ = ("_configured_prices", "_entries", "_lookups", "_priced", "_prices")

    def __init__(
        self,
        entries: Iterable[ModelInfo] = BUILTIN_MODELS,
        prices: Iterable[ModelPrice] = BUILTIN_PRICES,
        configured_prices: Iterable[ModelPrice] = (),
    ) -> None:
        self._entries = _matching(entries)
        self._prices = _matching(prices)
        self._configured_prices = _matching(configured_prices)
        self._lookups: dict[str, ModelInfo] = {}
        self._priced: dict[str, ModelPrice | None] = {}

    def extended(
        self, entries: Iterable[ModelInfo], prices: Iterable[ModelPrice] = ()
    ) -> ModelCatalog:
        """A catalog with ``entries`` added, replacing built-ins with the same pattern, and
        ``prices`` configured: a configured price wins over every built-in one that
        matches the model, however specific (an operator's ``gpt-4o*`` is what its
        ``gpt-4o`` costs)."""
        return ModelCatalog(
            (*self._entries, *entries), self._prices, (*self._configured_prices, *prices)
        )

    def price(self, model: str) -> ModelPrice | None:
        """What ``model``'s tokens cost, or ``None`` when the catalog has no price for it."""
        if model in self._priced:  # the ledger prices every request: no globbing each time
            return self._priced[model]
        found = _match(self._configured_prices, model) or _match(self._prices, model)
        if len(self._priced) < _KEPT_LOOKUPS:
            self._priced[model] = found
        return found

    def knows(self, model: str) -> bool:
        """Whether an entry matches ``model`` (else it gets the unknown-model defaults)."""
        found = self.lookup(model)
        return found.pattern != model or any(e.pattern == model for e in self._entries)

    def lookup(self, model: str) -> ModelInfo:
        """The entry for ``model``, or the unknown-model defaults."""
        found = self._lookups.get(model)
        if found is not None:
            return found
        found = _match(self._entries, model)
        if found is None:
            found = replace(UNKNOWN_MODEL, pattern=model)
        if len(self._lookups) < _KEPT_LOOKUPS:
            self._lookups[model] = found
        return found
