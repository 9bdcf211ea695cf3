"""What every check module shares: where the project, the corpus and the check results are, and
how a result is saved. Check modules import this, never ``zoo.checks`` (the dispatcher imports them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
OUT = ROOT / "outputs" / "checks"


def save(name: str, data: dict[str, Any]) -> None:
    """``outputs/checks/<name>.json``, and a line saying so."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {OUT / name}.json")
