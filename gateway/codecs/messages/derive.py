"""What the ``/v1/messages`` checks accept, read from the installed ``anthropic`` SDK's
request types (its ``MessageParam`` and ``BetaMessageParam`` unions and the block types in
them), and written out as ``gateway/codecs/messages/sdk_tables.py``.

The SDK's types take a second and some 60 MB to import, so the checks read the written
tables instead, and the SDK is loaded only when a request goes to Anthropic. A test
(``tests/gateway/codecs/test_sdk_tables.py``) derives the tables again from the installed
SDK and fails when they differ, so a role, block or field the SDK has learnt is not
refused here for long::

    python -m gateway.codecs.messages.derive          # rewrite sdk_tables.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import IO, Any, Literal, Required, Union, get_args, get_origin, get_type_hints

import anthropic.types as sdk
import anthropic.types.beta as beta
from anthropic.types import MessageCountTokensParams as CountTokensParams
from anthropic.types.beta import MessageCountTokensParams as BetaCountTokensParams
from typing_extensions import is_typeddict

__all__ = ["TABLES", "derived", "render"]

TABLES = Path(__file__).with_name("sdk_tables.py")
"""Where the tables are written."""

_Fields = tuple[tuple[str, type], ...]


def _union(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (an ``Iterable[...]``'s items, ``Optional`` unwrapped)."""
    origin = get_origin(annotation)
    if origin is Union:
        return tuple(m for arg in get_args(annotation) for m in _union(arg))
    if (
        origin is not None
        and origin is not Literal
        and issubclass(origin, Iterable)
        and not (issubclass(origin, Mapping))
    ):
        return tuple(m for arg in get_args(annotation) for m in _union(arg))
    return (annotation,)


def _runtime_type(annotation: Any) -> type | None:
    """The JSON type a field annotated ``annotation`` must have: ``str`` for strings and
    string literals, ``dict`` for objects (a ``TypedDict``, a ``Dict``, a union of them),
    ``bool``; ``None`` for anything else (not checked here)."""
    origin = get_origin(annotation)
    if annotation is str or (
        origin is Literal and all(isinstance(a, str) for a in get_args(annotation))
    ):
        return str
    if annotation is bool:
        return bool
    # Files the SDK would read and send as base64 are strings on the wire.
    members = (
        [m for m in _union(annotation) if not _is_file(m)] if origin is Union else [annotation]
    )
    if members == [str]:
        return str
    if members and all(_is_object(m) for m in members):
        return dict
    return None


def _is_file(annotation: Any) -> bool:
    return get_origin(annotation) is IO or annotation is PathLike


def _is_object(annotation: Any) -> bool:
    origin = get_origin(annotation) or annotation
    return isinstance(origin, type) and (issubclass(origin, dict) or issubclass(origin, Mapping))


def _required(typed: Any) -> dict[str, Any]:
    """The fields ``typed`` (an SDK ``TypedDict``) requires, with their annotations."""
    hints = get_type_hints(typed, include_extras=True)
    return {name: get_args(hint)[0] for name, hint in hints.items() if get_origin(hint) is Required}


def _kind(typed: Any) -> str | None:
    """The ``type`` literal of a block ``TypedDict``, if it has one."""
    hint = get_type_hints(typed).get("type")
    values = get_args(hint) if get_origin(hint) is Literal else ()
    return values[0] if len(values) == 1 and isinstance(values[0], str) else None


def _fields(typed: Any) -> _Fields:
    """The required fields of ``typed`` whose JSON type can be told, but ``type``."""
    found = ((name, _runtime_type(hint)) for name, hint in _required(typed).items())
    return tuple((name, kind) for name, kind in found if kind is not None and name != "type")


def _roles(*unions: Any) -> frozenset[str]:
    roles: set[str] = set()
    for union in unions:
        for member in get_args(union):
            roles.update(get_args(get_type_hints(member)["role"]))
    return frozenset(roles)


def _blocks(*annotations: Any) -> dict[str, Any]:
    """Block kind -> its ``TypedDict``, for the block types in ``annotations`` (content
    unions)."""
    found: dict[str, Any] = {}
    for annotation in annotations:
        for member in _union(annotation):
            kind = _kind(member) if is_typeddict(member) else None
            if kind is not None:
                found.setdefault(kind, member)
    return found


def derived() -> dict[str, Any]:
    """The tables, by name, as the installed SDK defines them."""
    content = _blocks(
        get_type_hints(sdk.UserMessageParam)["content"],
        get_type_hints(beta.BetaUserMessageParam)["content"],
    )
    create = sdk.message_create_params.MessageCreateParamsBase
    beta_create = beta.message_create_params.MessageCreateParamsBase
    return {
        "ROLES": _roles(sdk.MessageParam, beta.BetaMessageParam),
        "BLOCK_FIELDS": {kind: _fields(content[kind]) for kind in CONVERTED if kind in content},
        "SOURCE_FIELDS": {
            _kind(source): _fields(source)
            for source in _union(_required(sdk.ImageBlockParam)["source"])
            if _kind(source) in ("base64", "url")
        },
        "SYSTEM_BLOCKS": frozenset(
            _blocks(get_type_hints(create)["system"], get_type_hints(beta_create)["system"])
        ),
        "TURN_BLOCKS": {
            kind: _fields(typed)
            for kind, typed in _blocks(
                get_type_hints(sdk.SystemMessageParam)["content"],
                get_type_hints(beta.BetaSystemMessageParam)["content"],
            ).items()
        },
        "THINKING_KINDS": frozenset(
            _blocks(get_type_hints(create)["thinking"], get_type_hints(beta_create)["thinking"])
        ),
        "CUSTOM_TOOL": _fields(sdk.ToolParam),
        "COUNTED": (
            CountTokensParams.__required_keys__
            | CountTokensParams.__optional_keys__
            | BetaCountTokensParams.__required_keys__
            | BetaCountTokensParams.__optional_keys__
        )
        - {"betas"},
    }


CONVERTED = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
"""The block kinds the codec converts, whose fields are checked."""

_DOCS = {
    "ROLES": "The roles of ``messages`` the SDK knows.",
    "BLOCK_FIELDS": (
        "The fields the SDK requires of a block of each kind the codec converts, with their\n"
        "types (other fields, and other kinds of block, are the API's to check)."
    ),
    "SOURCE_FIELDS": "The fields an image's ``base64`` or ``url`` source requires.",
    "SYSTEM_BLOCKS": "The block kinds the top-level ``system`` takes.",
    "TURN_BLOCKS": (
        "The block kinds a mid-conversation system message takes, with their required fields."
    ),
    "THINKING_KINDS": "The kinds of ``thinking`` setting the SDK knows.",
    "CUSTOM_TOOL": "The fields a custom tool requires.",
    "COUNTED": (
        "The fields Anthropic's ``count_tokens`` takes (it refuses the rest), beta ones\n"
        "included: a field that changes the count (``context_management``, a top-level\n"
        "``cache_control``, ...) is not dropped. The SDK sends ``betas`` as a header."
    ),
}


def render(tables: Mapping[str, Any]) -> str:
    """The source of ``sdk_tables.py`` holding ``tables``."""
    lines = [
        '"""Written by ``python -m gateway.codecs.messages.derive`` from the installed',
        '``anthropic`` SDK\'s request types: do not edit (a test derives them again)."""',
        "",
        "from typing import Final",
        "",
    ]
    for name, value in tables.items():
        lines += [f"{name}: Final = {_literal(value)}", f'"""{_DOCS[name]}"""']
    return "\n".join(lines) + "\n"


def _literal(value: Any) -> str:
    """``value`` (frozensets, dicts and tuples of strings and the types str, dict, bool) as
    Python source, sorted where the order is the SDK's and not meaningful."""
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, frozenset):
        return "frozenset({" + ", ".join(repr(item) for item in sorted(value)) + "})"
    if isinstance(value, tuple):
        items = [_literal(item) for item in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {value!r}")


def main() -> int:
    TABLES.write_text(render(derived()))
    print(f"wrote {TABLES}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
