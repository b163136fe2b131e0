"""The model catalog: glob lookup, specificity, defaults and overrides."""

from __future__ import annotations

import pytest

from pipelines.catalog import DEFAULT_WINDOW, ModelCatalog, ModelInfo, ModelPrice


@pytest.mark.parametrize(
    ("model", "window", "family", "encoding"),
    [
        ("gpt-4o", 128_000, "openai", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", 128_000, "openai", "o200k_base"),
        ("gpt-4.1", 1_047_576, "openai", "o200k_base"),
        ("openai/gpt-4.1-mini", 1_047_576, "openai", "o200k_base"),
        ("gpt-3.5-turbo-0125", 16_385, "openai", "cl100k_base"),
        ("gpt-4", 8_192, "openai", "cl100k_base"),
        ("gpt-4-0314", 8_192, "openai", "cl100k_base"),
        ("gpt-4-32k-0613", 32_768, "openai", "cl100k_base"),
        ("gpt-4-0125-preview", 128_000, "openai", "cl100k_base"),
        ("claude-sonnet-4-5", 200_000, "anthropic", "o200k_base"),
        ("deepseek-reasoner", 128_000, "deepseek", "o200k_base"),
        ("Kimi-K2-Thinking", 262_144, "kimi", "o200k_base"),
    ],
)
def test_lookup(model: str, window: int, family: str, encoding: str) -> None:
    """Known model names, with or without a provider prefix or date suffix, find their entry."""
    info = ModelCatalog().lookup(model)
    assert (info.context_window, info.family, info.encoding) == (window, family, encoding)


def test_unknown_model_gets_default_window() -> None:
    """A model the catalog does not know is budgeted at 128,000 tokens."""
    info = ModelCatalog().lookup("my-private-model")
    assert info.context_window == DEFAULT_WINDOW == 128_000
    assert info.pattern == "my-private-model"


def test_knows_built_in_and_configured_models_only() -> None:
    """``knows`` tells a matched model (by glob or exact configured name) from one that
    only gets the defaults."""
    catalog = ModelCatalog().extended([ModelInfo("local-llama", 8_192, 1_024)])
    assert catalog.knows("gpt-4o-2024-08-06")
    assert catalog.knows("openai/gpt-4.1")
    assert catalog.knows("local-llama")
    assert not catalog.knows("my-private-model")
    assert not ModelCatalog().knows("local-llama")


def test_more_specific_pattern_wins() -> None:
    """``claude-3-haiku*`` beats ``claude-*`` however the entries are ordered."""
    assert ModelCatalog().lookup("claude-3-haiku-20240307").output_reserve == 4_096


def test_configuration_overrides_and_extends() -> None:
    """Configured entries replace built-ins with the same pattern and add new ones."""
    catalog = ModelCatalog().extended(
        [
            ModelInfo("gpt-4o*", 64_000, 2_000, "openai"),
            ModelInfo("local-llama", 8_192, 1_024, "llama"),
        ]
    )
    assert catalog.lookup("gpt-4o").context_window == 64_000
    assert catalog.lookup("local-llama").context_window == 8_192
    assert ModelCatalog().lookup("gpt-4o").context_window == 128_000


def test_invalid_entry_is_refused() -> None:
    """An entry whose reserve does not fit its window is refused at construction."""
    with pytest.raises(ValueError, match="output_reserve"):
        ModelInfo("x", 8_000, 9_000)


def test_prices_are_known_only_where_published_or_configured() -> None:
    """A price is found by the same glob rules; a model without one has none (never a
    neighbour's guessed), and the configuration adds or replaces prices."""
    catalog = ModelCatalog()
    opus = catalog.price("anthropic/claude-opus-4-5-20251101")
    assert opus is not None
    assert (opus.input, opus.output) == (5.0, 25.0)
    assert catalog.price("gpt-4o-mini-2024-07-18") == ModelPrice("gpt-4o-mini*", 0.15, 0.60, 0.075)
    # An older gpt-4o snapshot had another price: not matched by the alias's entry.
    assert catalog.price("gpt-4o-2024-05-13") is None
    assert catalog.price("claude-opus-5-5") is None
    assert catalog.price("my-model") is None
    extended = catalog.extended((), (ModelPrice("my-*", 1.0, 2.0), ModelPrice("gpt-4o", 9.0, 9.0)))
    assert extended.price("my-model") == ModelPrice("my-*", 1.0, 2.0)
    assert extended.price("gpt-4o") == ModelPrice("gpt-4o", 9.0, 9.0)
    assert extended.lookup("gpt-4o").context_window == 128_000
    # A configured price wins over a built-in one, however specific the built-in.
    broad = catalog.extended(
        (), (ModelPrice("gpt-4o*", 1.0, 1.0), ModelPrice("claude-*", 2.0, 2.0))
    )
    assert broad.price("gpt-4o") == ModelPrice("gpt-4o*", 1.0, 1.0)
    assert broad.price("claude-opus-4-5-20251101") == ModelPrice("claude-*", 2.0, 2.0)
