"""The pipeline is a library of its own: nothing in pipelines/ imports the gateway."""

from __future__ import annotations

import ast
from pathlib import Path

import pipelines


def test_pipelines_never_imports_gateway() -> None:
    """No module under pipelines/ imports gateway, directly or by a from-import."""
    root = Path(pipelines.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "gateway"]
    assert list(root.rglob("*.py"))
    assert offenders == []


def _type_checking_imports(tree: ast.Module) -> list[str]:
    """The modules imported under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
        if name != "TYPE_CHECKING":
            continue
        for inner in node.body:
            for child in ast.walk(inner):
                if isinstance(child, ast.Import):
                    found += [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom) and child.module:
                    found.append(child.module)
    return found


def test_pipelines_has_no_type_checking_cycles() -> None:
    """No module under pipelines/ imports another under ``if TYPE_CHECKING:``, the mark of
    an import cycle broken by hand."""
    root = Path(pipelines.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        offenders += [
            f"{path.relative_to(root)}: {name}"
            for name in _type_checking_imports(tree)
            if name.split(".")[0] == "pipelines"
        ]
    assert offenders == []
