"""The kernel path's layering (issue #21): no package imports one above it.  From the bottom:
``ir``/``analysis``, the kernel IR and its printer (``codegen``), the cost model (``cost``: it
reads kernels), the families (body, space, template, ranking), then building, orchestration and
the runtime.  Imports are read from the source (module level and inside functions alike)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tilefuse"

# package -> packages it must never import (directly or from inside a function)
FORBIDDEN = {
    "codegen": ("families", "orchestrate", "runtime", "api", "build", "cost"),
    "cost": ("families", "orchestrate", "runtime", "api", "build"),
    "families": ("orchestrate", "runtime", "api", "build"),
    "analysis": ("codegen", "cost", "families", "orchestrate", "runtime", "api", "build"),
    "ir": ("codegen", "cost", "families", "orchestrate", "runtime", "api", "build"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """The tilefuse modules ``path`` imports, as dotted names below ``tilefuse``."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    package = rel[:-1] if rel[-1] != "__init__" else rel[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                name = ".".join(base + tuple(filter(None, (node.module or "").split("."))))
            elif (node.module or "").startswith("tilefuse"):
                name = node.module.removeprefix("tilefuse").lstrip(".")
            else:
                continue
            out.append((node.lineno, name))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.removeprefix("tilefuse").lstrip(".")) for a in node.names
                    if a.name.startswith("tilefuse")]
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_import(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, name in _imports(path):
            top = name.split(".")[0]
            if top in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports tilefuse.{name}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_relative_imports():
    """``from ...cost.work import work`` inside families/gemm resolves to ``cost.work``."""
    names = [n for _, n in _imports(ROOT / "families" / "gemm" / "__init__.py")]
    assert "cost.work" in names and "families.gemm.template" in names
