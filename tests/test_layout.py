"""Imports run one way: zoo -> bench -> convert (and zoo -> convert); convert and bench never import
zoo, convert never imports bench. Within convert the Caffe and Torch7 frontends never import each
other, ops never import a frontend or api, and no project module imports itself through a circle
(function-level imports count: they only defer a circle)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"convert": {"zoo", "bench"}, "bench": {"zoo"}}  # zoo -> bench -> convert


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        bad = imported_packages(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_top_level_layout() -> None:
    for d in ("convert", "bench", "zoo", "prototxt", "tests", "outputs"):
        assert (ROOT / d).is_dir(), d


PACKAGES = ("convert", "bench", "zoo")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that ``name`` imports anywhere in its file (top level, in functions or
    under TYPE_CHECKING), relative imports resolved; ``from pkg import sub`` names the submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # a name inside a module: the module itself
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_resolved() -> None:
    """Relative, function-level and ``from package import module`` imports are all edges."""
    graph = import_graph()
    assert "convert.caffe.builder" in graph["convert.caffe.layers"]  # from .builder import ...
    assert "convert.caffe.layers" in graph["convert.caffe.frontend"]  # from . import layers
    assert "convert.ir" in graph["convert.caffe.builder"]  # from ..ir import ...


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("source, banned", [
    ("convert.caffe", ("convert.torch7",)),
    ("convert.torch7", ("convert.caffe",)),
    ("convert.ops", ("convert.caffe", "convert.torch7", "convert.api")),
])
def test_convert_layering(source: str, banned: tuple[str, ...]) -> None:
    bad = sorted(f"{m} imports {t}" for m, targets in import_graph().items() if _under(m, source)
                 for t in targets if any(_under(t, b) for b in banned))
    assert not bad, "; ".join(bad)
