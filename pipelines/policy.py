"""The compaction policy: every knob a tenant or a request may turn, with defaults and bounds.

Keys are spelled as on the wire (``x-contextgate-policy: trigger=0.7, keep-images=2``);
the attributes use underscores. ``Policy.from_mapping`` validates a partial mapping on top
of a base policy and names the offending key in its error. ``PolicyBounds`` says what a
caller may tune: a deployment or a tenant narrows the built-in ``BOUNDS`` of a numeric key,
lists the values a key may take, or locks a key so that only the configuration sets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Literal

from pipelines.errors import PolicyError

__all__ = ["BOUNDS", "UNBOUNDED", "Mode", "Policy", "PolicyBounds"]

Mode = Literal["summarize", "truncate", "off"]
_MODES: Final = ("summarize", "truncate", "off")
Native = Literal["off", "honour", "prefer"]
_NATIVES: Final = ("off", "honour", "prefer")

BOUNDS: Final[Mapping[str, tuple[float, float]]] = {
    "max_input": (4_000, 10_000_000),
    "prepare": (0.05, 1.0),
    "light": (0.05, 1.0),
    "trigger": (0.05, 1.0),
    "emergency": (0.05, 1.0),
    "target": (0.05, 1.0),
    "tail_ratio": (0.0, 0.9),
    "keep_images": (0, 100),
    "filter_tokens": (100, 1_000_000),
    "soft_ratio": (0.05, 1.0),
    "hard_ratio": (0.05, 1.0),
    "block_tokens": (1_000, 10_000_000),
    "summary_timeout": (0.1, 600.0),
    "offload_ttl": (60, 30 * 86_400),
}
"""Built-in (inclusive) bounds per numeric key; a tenant may narrow them."""


@dataclass(frozen=True, slots=True)
class Policy:
    """How hard the pipeline may work on one request. Defaults and ranges: docs/POLICY.md."""

    mode: Mode = "summarize"
    """``summarize`` (may call a model), ``truncate`` (deterministic only), ``off``
    (hygiene only)."""
    max_input: int | None = None
    """Caps the input budget below the model's window (cost control); ``None``: no cap."""
    prepare: float = 0.40
    """Utilisation at which a background summary is prepared (the request is not held);
    never above ``trigger`` in effect."""
    light: float = 0.50
    """Utilisation at which light compression (deduplication) starts; never above
    ``trigger`` in effect."""
    trigger: float = 0.70
    """Utilisation at which full compaction starts."""
    emergency: float = 0.90
    """Utilisation from which only deterministic steps run and rewrites that wait for a
    cold cache (the media window) happen anyway; never below ``trigger`` in effect."""
    target: float = 0.45
    """Utilisation compaction aims for."""
    tail_ratio: float = 0.20
    """Share of the budget kept verbatim at the end of the conversation."""
    keep_images: int = 2
    """Media-bearing messages, newest first, that keep their media."""
    filter_tokens: int = 5_000
    """Tool outputs above this many tokens are offloaded behind a preview."""
    compact_json: bool = True
    """Whether tool outputs that are JSON objects or arrays are sent without their
    insignificant whitespace (lossless; what is offloaded stays as the client sent it)."""
    soft_ratio: float | None = None
    """Cache-TTL prune soft-trim level; ``None``: the model family's default."""
    hard_ratio: float | None = None
    """Cache-TTL prune archive level; ``None``: the model family's default."""
    block_tokens: int = 120_000
    """Largest new user turn accepted, in tokens."""
    summary_model: str | None = None
    """Model that writes summaries; ``None``: the request's own model."""
    summary_timeout: float = 20.0
    """Seconds a summary call may take."""
    offload_ttl: int = 86_400
    """Seconds an offloaded object is kept."""
    native: Native = "honour"
    """Provider-native context management (``pipelines.native``): ``honour`` applies what
    the client asks (the provider, or the gateway where the provider cannot); ``prefer``
    also asks a provider that compacts server-side to do so instead of the gateway's own
    summary; ``off`` ignores it."""
    cache_markers: bool = True
    """Whether the gateway adds prompt-cache breakpoints (Anthropic, Qwen) and a
    ``prompt_cache_key`` (OpenAI); ``false`` for a client that places its own. Cache
    breaks are still detected either way."""

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise PolicyError("mode", f"must be one of {', '.join(_MODES)}, got {self.mode!r}")
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PolicyError(_wire(name), f"must be a number, got {value!r}")
            if not low <= value <= high:
                raise PolicyError(_wire(name), f"must be between {low:g} and {high:g}, got {value}")
        if self.native not in _NATIVES:
            raise PolicyError(
                "native", f"must be one of {', '.join(_NATIVES)}, got {self.native!r}"
            )
        if self.target >= self.trigger:
            raise PolicyError(
                "target", f"must be below trigger ({self.trigger}), got {self.target}"
            )
        for flag in ("compact_json", "cache_markers"):
            if not isinstance(getattr(self, flag), bool):
                raise PolicyError(_wire(flag), f"must be a boolean, got {getattr(self, flag)!r}")
        if self.summary_model is not None and not self.summary_model.strip():
            raise PolicyError("summary-model", "must not be empty")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: Policy | None = None) -> Policy:
        """``base`` (the defaults when omitted) with the wire-named ``values`` applied."""
        changes: dict[str, Any] = {}
        for key, value in values.items():
            name, kind = _field(key)
            changes[name] = _coerce(key, kind, value)
        try:
            return replace(base or cls(), **changes)
        except PolicyError as exc:
            if exc.key == "target" and "target" not in values and "trigger" in values:
                raise PolicyError(
                    "trigger",
                    f"must be above target ({changes.get('target', (base or cls()).target)})"
                    f", got {changes['trigger']}",
                ) from exc
            raise

    def as_wire(self) -> dict[str, Any]:
        """The policy as wire-named keys, for reports."""
        return {_wire(f.name): getattr(self, f.name) for f in fields(self)}


def _wire(name: str) -> str:
    return name.replace("_", "-")


_FIELD_TYPES: Final[Mapping[str, type]] = {
    "mode": str,
    "max_input": int,
    "prepare": float,
    "light": float,
    "trigger": float,
    "emergency": float,
    "target": float,
    "tail_ratio": float,
    "keep_images": int,
    "filter_tokens": int,
    "compact_json": bool,
    "soft_ratio": float,
    "hard_ratio": float,
    "block_tokens": int,
    "summary_model": str,
    "summary_timeout": float,
    "offload_ttl": int,
    "cache_markers": bool,
    "native": str,
}


def _field(key: str) -> tuple[str, type]:
    """The attribute name and type of wire key ``key``; ``PolicyError`` if there is none."""
    name = key.replace("-", "_")
    kind = _FIELD_TYPES.get(name) if "_" not in key else None
    if kind is None:
        known = ", ".join(sorted(_wire(n) for n in _FIELD_TYPES))
        raise PolicyError(key, f"unknown key; known keys: {known}")
    return name, kind


def _coerce(key: str, kind: type, value: Any) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise PolicyError(key, f"must be a boolean (?1 or ?0), got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise PolicyError(key, f"must be a string or token, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(key, f"must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise PolicyError(key, f"must be a whole number, got {value!r}")
        return int(value)
    return float(value)


@dataclass(frozen=True, slots=True)
class PolicyBounds:
    """What callers may ask for, key by key (wire names), within the built-in ``BOUNDS``.

    In configuration form (``PolicyBounds.from_mapping``) a numeric key takes
    ``[low, high]``, any other key the list of values it may take, and ``false`` locks a
    key: callers may not send it at all. Keys not named keep their built-in range.
    """

    ranges: Mapping[str, tuple[float, float]]
    """Numeric keys narrowed to an inclusive range."""
    choices: Mapping[str, tuple[Any, ...]]
    """Keys that may only take one of these values."""
    locked: frozenset[str]
    """Keys a caller may not set."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PolicyBounds:
        """Bounds from their configuration form; ``PolicyError`` names a bad key."""
        ranges: dict[str, tuple[float, float]] = {}
        choices: dict[str, tuple[Any, ...]] = {}
        locked: set[str] = set()
        for key, bound in values.items():
            name, kind = _field(key)
            if bound is False:
                locked.add(key)
            elif name in BOUNDS:
                ranges[key] = _range(key, bound, BOUNDS[name])
            elif isinstance(bound, list | tuple) and bound:
                choices[key] = tuple(_coerce(key, kind, value) for value in bound)
                for value in choices[key]:
                    Policy.from_mapping({key: value})
            else:
                raise PolicyError(key, "bounds must list the values allowed, or be false")
        return cls(ranges, choices, frozenset(locked))

    def narrowed(self, inner: PolicyBounds) -> PolicyBounds:
        """These bounds further narrowed by ``inner`` (a tenant's, within the deployment's);
        ``PolicyError`` when ``inner`` allows something these do not."""
        ranges = dict(self.ranges)
        for key, (low, high) in inner.ranges.items():
            outer_low, outer_high = ranges.get(key, BOUNDS[key.replace("-", "_")])
            if low < outer_low or high > outer_high:
                raise PolicyError(
                    key, f"[{low:g}, {high:g}] is wider than [{outer_low:g}, {outer_high:g}]"
                )
            ranges[key] = (low, high)
        choices = dict(self.choices)
        for key, allowed in inner.choices.items():
            if key in choices and set(allowed) - set(choices[key]):
                raise PolicyError(key, f"allows values the deployment does not: {allowed}")
            choices[key] = allowed
        return PolicyBounds(ranges, choices, self.locked | inner.locked)

    def check(self, values: Mapping[str, Any]) -> None:
        """``PolicyError`` naming the first of ``values`` (wire names, as sent) that is
        locked or outside these bounds, with what is allowed."""
        for key, value in values.items():
            if key in self.locked:
                raise PolicyError(
                    key, "is set by the gateway's configuration; callers may not change it"
                )
            bound = self.ranges.get(key)
            if bound is not None and isinstance(value, int | float) and not isinstance(value, bool):
                low, high = bound
                if not low <= value <= high:
                    raise PolicyError(key, f"must be between {low:g} and {high:g}, got {value}")
            allowed = self.choices.get(key)
            if allowed is not None and value not in allowed:
                listed = ", ".join(_shown(v) for v in allowed)
                raise PolicyError(key, f"must be one of {listed}, got {_shown(value)}")

    def as_wire(self) -> dict[str, Any]:
        """The bounds of every key as callers see them (for documentation and tests)."""
        shown: dict[str, Any] = {}
        for name in _FIELD_TYPES:
            key = _wire(name)
            if key in self.locked:
                shown[key] = False
            elif key in self.choices:
                shown[key] = list(self.choices[key])
            elif name in BOUNDS:
                shown[key] = list(self.ranges.get(key, BOUNDS[name]))
        return shown


UNBOUNDED: Final = PolicyBounds({}, {}, frozenset())
"""The built-in bounds only."""


def _range(key: str, bound: Any, limits: tuple[float, float]) -> tuple[float, float]:
    if (
        not isinstance(bound, list | tuple)
        or len(bound) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in bound)
    ):
        raise PolicyError(key, f"bounds must be [low, high], got {bound!r}")
    low, high = float(bound[0]), float(bound[1])
    if not limits[0] <= low <= high <= limits[1]:
        raise PolicyError(
            key, f"bounds [{low:g}, {high:g}] must lie within [{limits[0]:g}, {limits[1]:g}]"
        )
    return low, high


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "?1" if value else "?0"
    return str(value)
