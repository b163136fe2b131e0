"""The gateway's own headers: the inbound policy header and the outbound report headers.

``x-contextgate-policy`` is an RFC 8941 dictionary (``mode=truncate, trigger=0.6``);
``x-contextgate-tokens`` is one too (``before=1200, after=800``), and
``x-contextgate-actions`` an RFC 8941 list of the stages that changed the request.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final

from http_sfv.dictionary import Dictionary
from http_sfv.item import Item

from gateway.errors import InvalidRequest
from pipelines import Policy, PolicyBounds, PolicyError, Report
from pipelines.policy import UNBOUNDED

__all__ = [
    "POLICY_HEADER",
    "policy_from_header",
    "report_headers",
    "summary_header",
    "summary_path",
]

POLICY_HEADER: Final = "x-contextgate-policy"


def policy_from_header(value: str | None, base: Policy, bounds: PolicyBounds = UNBOUNDED) -> Policy:
    """``base`` tuned by the header's keys within ``bounds``; a bad header is a 400 that
    names the key and what it may be."""
    if not value:
        return base
    parsed = Dictionary()
    try:
        parsed.parse(value.encode("latin-1"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidRequest(
            f"The {POLICY_HEADER} header is not an RFC 8941 dictionary"
            " (e.g. 'mode=truncate, trigger=0.6').",
            code="invalid_policy",
            param=POLICY_HEADER,
        ) from exc
    values: dict[str, Any] = {}
    for key, member in parsed.items():
        if not isinstance(member, Item) or member.params:
            raise InvalidRequest(
                f"{POLICY_HEADER}: policy key {key!r}: must be a single value,"
                " without a list or parameters",
                code="invalid_policy",
                param=f"{POLICY_HEADER}.{key}",
            )
        values[key] = _plain(member.value)
    try:
        policy = Policy.from_mapping(values, base)
        bounds.check(values)
        return policy
    except PolicyError as exc:
        raise InvalidRequest(
            f"{POLICY_HEADER}: {exc}", code="invalid_policy", param=f"{POLICY_HEADER}.{exc.key}"
        ) from exc


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def report_headers(request_id: str, report: Report | None, overhead_ms: float) -> dict[str, str]:
    """The ``x-contextgate-*`` headers of one proxied response."""
    headers = {
        "x-contextgate-request-id": request_id,
        "x-contextgate-overhead-ms": f"{overhead_ms:.3f}",
    }
    if report is not None:
        tokens = f"before={report.tokens_before}, after={report.tokens_after}"
        headers["x-contextgate-tokens"] = tokens if report.exact else f"{tokens}, estimated"
        headers["x-contextgate-actions"] = ", ".join(report.actions)
        summary = summary_header(report)
        if summary:
            headers["x-contextgate-summary"] = summary
    return headers


_SUMMARY_PATHS: Final = {
    "summarised": "made",
    "merged": "made",
    "checkpoint reused": "reused",
    "prepared checkpoint used": "prepared",
    "checkpoint extended": "extended",
}


def summary_header(report: Report) -> str:
    """What the summarize stage did, for ``x-contextgate-summary``: the path (``made``
    now, ``prepared`` in the background, ``reused``, ``extended``, ``notes-kept``,
    ``fallback``) and whether a background summary was asked for (``prepare=scheduled``,
    or ``prepare=skipped``: one is already queued or running for the conversation, the
    queue is full, or the request is a dry run)."""
    stage = report.stage("summarize")
    if stage is None:
        return ""
    parts = []
    path = summary_path(report)
    if path is not None:
        parts.append(path)
    prepare = stage.details.get("prepare")
    if prepare is not None:
        parts.append("prepare=scheduled" if isinstance(prepare, list) else "prepare=skipped")
    return ", ".join(parts)


def summary_path(report: Report) -> str | None:
    """The path the summarize stage took (``made``, ``prepared``, ``reused``,
    ``extended``, ``notes-kept``, ``fallback``), or ``None`` when it took none."""
    stage = report.stage("summarize")
    path = stage.details.get("path") if stage is not None else None
    if not isinstance(path, str):
        return None
    if path.startswith("fallback"):
        return "fallback"
    if path.startswith("notes kept"):
        return "notes-kept"
    return next((v for k, v in _SUMMARY_PATHS.items() if path.startswith(k)), "made")
