"""Messages requests checked against the anthropic SDK's own request types.

``MessageCreateParams`` and the TypedDicts under it say which keys each object may have,
which it must have, and which literal ``type`` each block kind has; ``param_errors`` walks
a request with them all the way down, so an unknown key on any block, tool or turn, a
missing field or an unknown block type is reported with its path. Top-level fields the SDK
does not list (``temperature`` and ``top_k`` are gone from its newest types, and a client
may send fields newer than the SDK) are the client's, forwarded as they came, and not
checked.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

import typing_extensions
from anthropic.types.beta.message_create_params import (
    MessageCreateParams as BetaMessageCreateParams,
)
from anthropic.types.beta.message_create_params import MessageCreateParamsBase as _BETA_BASE
from anthropic.types.message_create_params import MessageCreateParams
from anthropic.types.message_create_params import MessageCreateParamsBase as _BASE
from typing_extensions import is_typeddict


def param_errors(request: Any) -> list[str]:
    """Why ``request`` is not a ``MessageCreateParams`` (nor, for what only a beta takes,
    such as a mid-conversation system message's ``output_config``, the beta one); empty
    when it is one."""
    problems = _errors(_known(request, _BASE), MessageCreateParams, "request")
    if problems:
        beta = _errors(_known(request, _BETA_BASE), BetaMessageCreateParams, "request")
        return beta and problems
    return problems


def _known(request: Any, base: Any) -> dict[str, Any]:
    return {key: value for key, value in request.items() if key in _hints(base)}


def assert_valid_params(request: Any) -> None:
    problems = param_errors(request)
    assert not problems, f"not a valid MessageCreateParams: {problems[:5]}"


@cache
def _hints(typed_dict: type) -> dict[str, Any]:
    return typing.get_type_hints(typed_dict)


@cache
def _required(typed_dict: Any) -> frozenset[str]:
    """The keys ``typed_dict`` requires. (Its ``__required_keys__`` cannot tell: the SDK's
    annotations are strings when the class is made.)"""
    hints = typing.get_type_hints(typed_dict, include_extras=True)
    return frozenset(
        key
        for key, hint in hints.items()
        if get_origin(hint) in _REQUIRED
        or (typed_dict.__total__ and get_origin(hint) not in _NOT_REQUIRED)
    )


_REQUIRED = (typing.Required, typing_extensions.Required)
_NOT_REQUIRED = (typing.NotRequired, typing_extensions.NotRequired)


def _errors(value: Any, kind: Any, path: str) -> list[str]:
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any or kind is object:
        return []
    if origin is typing.Annotated:
        return _errors(value, args[0], path)
    if origin is Union or origin is types.UnionType:
        tries = [(_errors(value, member, path), member) for member in args]
        if any(not problems for problems, _ in tries):
            return []
        # Report against the member the value was meant to be (an array for an array, the
        # block whose ``type`` it has), not the one with the fewest complaints.
        meant = [p for p, member in tries if _meant(value, member)] or [p for p, _ in tries]
        return min(meant, key=len)
    if origin is Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if kind is type(None):
        return [] if value is None else [f"{path}: expected null"]
    if is_typeddict(kind):
        return _typed_dict_errors(value, kind, path)
    if origin in (dict, collections.abc.Mapping):
        return [] if isinstance(value, dict) else [f"{path}: expected an object"]
    if origin is not None and _is_sequence(origin):
        if not isinstance(value, list):
            return [f"{path}: expected an array"]
        return [e for i, item in enumerate(value) for e in _errors(item, args[0], f"{path}.{i}")]
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(kind, type):
        ok = isinstance(value, kind)
    else:
        ok = True
    return [] if ok else [f"{path}: expected {kind}, got {type(value).__name__}"]


def _typed_dict_errors(value: Any, kind: Any, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({kind.__name__})"]
    hints = _hints(kind)
    problems = [
        f"{path}.{key}: unknown key for {kind.__name__}" for key in value if key not in hints
    ]
    problems += [
        f"{path}.{key}: required by {kind.__name__}" for key in _required(kind) if key not in value
    ]
    for key, item in value.items():
        if key in hints:
            problems += _errors(item, hints[key], f"{path}.{key}")
    return problems


def _is_sequence(origin: Any) -> bool:
    return origin in (list, collections.abc.Iterable, collections.abc.Sequence) or (
        getattr(origin, "__name__", "") == "SequenceNotStr"
    )


def _meant(value: Any, member: Any) -> bool:
    origin = get_origin(member)
    if is_typeddict(member):
        literal = _hints(member).get("type")
        if get_origin(literal) is not Literal:
            return isinstance(value, dict)
        return isinstance(value, dict) and value.get("type") in get_args(literal)
    if origin is not None and _is_sequence(origin):
        return isinstance(value, list)
    return isinstance(member, type) and isinstance(value, member)
