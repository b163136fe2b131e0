"""The gateway's own headers: the policy header in, the report headers out."""

from __future__ import annotations

import http_sfv
import pytest

from gateway.errors import InvalidRequest
from gateway.http.headers import policy_from_header, report_headers
from pipelines import Policy, PolicyBounds, Report
from pipelines.policy import BOUNDS

_COMPANIONS = {"trigger": "target=0.05", "target": "trigger=1"}
"""What a key's edge values need beside them (target stays below trigger)."""


def _header(key: str, value: float) -> str:
    wire = key.replace("_", "-")
    shown = f"{value:.3f}" if isinstance(value, float) else str(value)
    companion = _COMPANIONS.get(key)
    return f"{wire}={shown}" + (f", {companion}" if companion else "")


def _edges(key: str) -> list[float]:
    low, high = BOUNDS[key]
    kind = type(getattr(Policy(), key) if getattr(Policy(), key) is not None else low)
    if key == "max_input":
        kind = int
    inside = [kind(low), kind(high)]
    if key == "trigger":
        inside[0] = 0.06
    if key == "target":
        inside[1] = 0.999
    return inside


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_every_numeric_key_is_accepted_at_its_bounds_and_refused_past_them(key: str) -> None:
    """Each numeric policy key takes the edges of its documented range; one step past
    either edge is a 400 that names the key and the range."""
    for value in _edges(key):
        policy = policy_from_header(_header(key, value), Policy())
        assert getattr(policy, key) == pytest.approx(value)
    low, high = BOUNDS[key]
    step = 1 if isinstance(_edges(key)[0], int) else 0.01
    for value in (low - step, high + step):
        typed = int(value) if step == 1 else float(value)
        with pytest.raises(InvalidRequest) as refused:
            policy_from_header(_header(key, typed), Policy())
        wire = key.replace("_", "-")
        assert refused.value.param == f"x-contextgate-policy.{wire}"
        assert f"between {low:g} and {high:g}" in refused.value.message


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("mode=fast", "mode"),
        ("mode=2", "mode"),
        ("cache-markers=1", "cache-markers"),
        ("summary-model=?1", "summary-model"),
        ('summary-model=""', "summary-model"),
        ("keep-images=1.5", "keep-images"),
        ('trigger="high"', "trigger"),
        ("keep_images=2", "keep_images"),
        ("compress=?1", "compress"),
    ],
)
def test_wrong_types_and_unknown_keys_name_the_key(header: str, key: str) -> None:
    """A value of the wrong type, a bad choice, or an unknown key is a 400 naming it."""
    with pytest.raises(InvalidRequest) as refused:
        policy_from_header(header, Policy())
    assert refused.value.param == f"x-contextgate-policy.{key}"


def test_the_other_keys_take_their_values() -> None:
    """mode, summary-model and cache-markers take every value they document."""
    for mode in ("summarize", "truncate", "off"):
        assert policy_from_header(f"mode={mode}", Policy()).mode == mode
    assert policy_from_header("cache-markers=?0", Policy()).cache_markers is False
    assert policy_from_header("summary-model=gpt-4o-mini", Policy()).summary_model == "gpt-4o-mini"


def test_bounds_narrow_what_the_header_may_say() -> None:
    """Within a deployment's bounds a value inside passes and one outside names the
    narrowed range; a locked key is refused whatever its value."""
    bounds = PolicyBounds.from_mapping(
        {"keep-images": [0, 4], "mode": ["truncate"], "summary-timeout": False}
    )
    assert policy_from_header("keep-images=4, mode=truncate", Policy(), bounds).keep_images == 4
    for header, says in [
        ("keep-images=5", "between 0 and 4"),
        ("mode=off", "one of truncate"),
        ("summary-timeout=5", "callers may not change it"),
    ]:
        with pytest.raises(InvalidRequest) as refused:
            policy_from_header(header, Policy(), bounds)
        assert says in refused.value.message


def test_policy_header_tunes_the_base() -> None:
    """Tokens, decimals, integers and strings arrive as the policy's types."""
    base = Policy(keep_images=4)
    policy = policy_from_header(
        'mode=truncate, trigger=0.6, filter-tokens=2000, summary-model="gpt-4o-mini"', base
    )
    assert (policy.mode, policy.trigger, policy.filter_tokens, policy.keep_images) == (
        "truncate",
        0.6,
        2000,
        4,
    )
    assert policy.summary_model == "gpt-4o-mini"
    assert policy_from_header(None, base) is base


@pytest.mark.parametrize("header", ["trigger=", "a b c", "mode=truncate;x", "k=?2"])
def test_malformed_policy_header(header: str) -> None:
    """Anything that is not an RFC 8941 dictionary of known keys is a 400 invalid_policy."""
    with pytest.raises(InvalidRequest) as caught:
        policy_from_header(header, Policy())
    assert caught.value.code == "invalid_policy"


def test_report_headers_are_structured_fields() -> None:
    """The tokens header parses as an RFC 8941 dictionary and the actions as a list."""
    report = Report("gpt-4o", 128_000, 16_384, 111_616, tokens_before=900, tokens_after=600)
    headers = report_headers("cg-1", report, 1.23456)
    tokens = http_sfv.Dictionary()
    tokens.parse(headers["x-contextgate-tokens"].encode())
    assert {k: v.value for k, v in tokens.items()} == {"before": 900, "after": 600}
    assert headers["x-contextgate-overhead-ms"] == "1.235"
    report.exact = False
    estimated = http_sfv.Dictionary()
    estimated.parse(report_headers("cg-1", report, 0)["x-contextgate-tokens"].encode())
    assert estimated["estimated"].value is True
