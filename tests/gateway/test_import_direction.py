"""The house's rule (docs/ARCHITECTURE.md, "The house"): each sub-package of gateway/ imports
only from those below it, so no import cycle can form between them, and no module imports
another of the gateway's through ``TYPE_CHECKING`` or inside a function to break one."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2] / "gateway"
RANKS: Final = {
    "errors": 0,
    "breaker": 0,
    "config": 1,
    "codecs": 2,
    "http": 3,
    "telemetry": 4,
    "store": 5,
    "tenancy": 6,
    "providers": 6,
    "summaries": 7,
    "context": 8,
    "edge": 9,
    "runtime": 10,
    "routes": 11,
    "app": 12,
    "cli": 13,
}
"""Where each sub-package (or top-level module) stands: it may import those ranked lower."""
LATE: Final = {
    "gateway.store.stores -> gateway.store.redis",
    "gateway.store.stores -> gateway.store.redis (in build)",
    "gateway.store.stores -> gateway.store.ledger_redis (in build)",
    "gateway.tenancy.limits -> gateway.store.redis",
}
"""Imports put off for memory, not to break a cycle (``gateway.store.redis`` imports
nothing of ``stores`` or ``tenancy``): the Redis backends load the Redis client, which
only a gateway with a Redis store loads; elsewhere they are named for type checkers."""


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(encoding="utf-8"))


def gateway_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name == "gateway" or name.startswith("gateway.")]


def part(module: str) -> str:
    """The sub-package (or top-level module) of ``gateway.<part>...``."""
    return module.split(".")[1]


def test_every_part_of_the_gateway_has_a_place() -> None:
    """Each sub-package and top-level module is ranked (a new one must be given a place)."""
    assert {part(name) for name, _ in modules() if name != "gateway"} == set(RANKS)


def test_imports_go_down_the_house() -> None:
    """A module imports from its own sub-package or from one ranked below it, never up or
    sideways: the direction that leaves no room for a cycle between sub-packages."""
    upward = []
    for name, tree in modules():
        if name == "gateway":
            continue
        mine = part(name)
        for imported in gateway_imports(tree):
            theirs = part(imported) if imported != "gateway" else "gateway"
            if theirs != mine and RANKS.get(theirs, 99) >= RANKS[mine]:
                upward.append(f"{name} -> {imported}")
    assert upward == []


def test_no_import_is_hidden_from_the_direction() -> None:
    """No module imports the gateway's modules under ``if TYPE_CHECKING:``, nor its own
    sub-package's inside a function: the marks of a cycle broken by hand. (A function may
    load a lower sub-package late: the command line loads the server only to serve. The
    package's face, ``gateway/__init__.py``, names what it loads lazily for type checkers,
    and the Redis backends are loaded late, ``LATE``.)"""
    hidden = []
    for name, tree in modules():
        if name == "gateway":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for statement in node.body:
                    hidden += [f"{name} -> {m}" for m in gateway_imports(statement)]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for statement in ast.walk(node):
                    if isinstance(statement, ast.Import | ast.ImportFrom):
                        hidden += [
                            f"{name} -> {m} (in {node.name})"
                            for m in gateway_imports(statement)
                            if name != "gateway" and part(m) == part(name)
                        ]
    assert sorted(set(hidden) - LATE) == []
    assert set(hidden) >= LATE, "an import no longer put off: take it out of LATE"
