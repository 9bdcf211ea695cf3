"""Imports run one way: zoo -> convert, zoo -> bench; convert and bench never import zoo, and bench
does not import convert (it takes artifacts and callables)."""

from __future__ import annotations

import ast
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
