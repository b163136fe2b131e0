"""The gateway's own headers: the policy header in, the report headers out."""

from __future__ import annotations

import http_sfv
import pytest

from gateway.errors import InvalidRequest
from gateway.headers import policy_from_header, report_headers
from pipelines import Policy, Report


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
