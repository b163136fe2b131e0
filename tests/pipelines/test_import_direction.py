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
