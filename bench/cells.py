"""The vocabulary of the report's tables, below both the report and its machines section: runs,
rows and cells, the machine a row ran on, and median ± IQR formatting, as Markdown or HTML cells."""

from __future__ import annotations

import html as _html
import math
import re
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]
Cell = tuple[str, Any]  # shown text, sort key (a number, or text)


@dataclass
class Run:
    label: str
    doc: dict[str, Any]


def machine(env: dict[str, Any], device: str) -> str:
    if device.startswith("cuda"):
        return (env.get("gpu") or {}).get("name") or "unknown GPU"
    return env.get("cpu") or "unknown CPU"


def _decimals(spread: float, cap: int = 3) -> int:
    """Decimals that keep the spread's second significant digit (zoo bench's rule)."""
    if not spread > 0 or not math.isfinite(spread):
        return 2
    return max(0, min(cap, -int(math.floor(math.log10(spread))) + 1))


def fmt_ms(stats: dict[str, Any] | None) -> str:
    """'12.3 ± 0.41': median ± IQR, identical to zoo bench's table."""
    if not stats:
        return "-"
    if stats["iqr_ms"] == 0 and stats.get("n", 2) < 2:  # one sample: no spread to show
        return f"{stats['median_ms']:.{_sig3(stats['median_ms'])}f} (n=1)"
    d = _decimals(stats["iqr_ms"])
    return f"{stats['median_ms']:.{d}f} ± {stats['iqr_ms']:.{d}f}"


def _sig3(x: float) -> int:
    """Decimals for three significant digits (at least; no rounding of integer digits)."""
    return max(0, 2 - int(math.floor(math.log10(abs(x))))) if x else 0


def total_stats(r: Row) -> dict[str, Any] | None:
    f, b = r.get("forward"), r.get("backward")
    if not f:
        return None
    if not b:
        return f
    return {"median_ms": f["median_ms"] + b["median_ms"], "iqr_ms": math.hypot(f["iqr_ms"], b["iqr_ms"]),
            "n": min(f.get("n", 2), b.get("n", 2))}


def natural(s: Any) -> tuple[Any, ...]:
    """A sort key that puts resnet18 before resnet101."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(s)))


def _md_table(head: list[str], body: list[list[Cell]]) -> list[str]:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(esc, head)) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(esc(t) for t, _ in row) + " |" for row in body]


def _html_table(head: list[str], body: list[list[Cell]], cls: str = "sortable") -> str:
    e = _html.escape
    numeric = [all(isinstance(row[i][1], (int, float)) or row[i][1] is None for row in body)
               for i in range(len(head))]
    ths = "".join(f'<th class="{"" if n else "t"}">{e(h)}</th>' for h, n in zip(head, numeric))
    trs = []
    for row in body:
        tds = "".join(f'<td class="{"" if n else "t"}" data-v="{e(_sort_key(k))}">{e(t)}</td>'
                      for (t, k), n in zip(row, numeric))
        trs.append(f"<tr>{tds}</tr>")
    thead = f"<thead><tr>{ths}</tr></thead>" if any(head) else ""  # key-value tables have no header
    return f'<div class="scroll"><table class="{cls}">{thead}<tbody>{"".join(trs)}</tbody></table></div>'


def _sort_key(k: Any) -> str:
    return "" if k is None else repr(k) if isinstance(k, float) else str(k)
