"""Terminal tables that fit the terminal: the full table where it fits without wrapping (and the
terminal is wider than 100 columns), else a compact one: fewer columns, short units, the fields that
are the same on every row said once below it, abbreviations explained in one footer line. The files
(results JSON, ``zoo report``) always keep everything."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from convert.naming import printable

COMPACT_AT = 100  # columns: at most this wide, always the compact table
RUNTIME_ABBREV = {"onnxruntime": "ort", "onnxruntime-trt": "ort-trt", "onnxruntime-cuda": "ort-cuda",
                  "torch-compile": "compile", "openvino": "ov"}
MODE_ABBREV = {"inference": "inf", "training": "train"}
PART_ABBREV = {"forward": "fwd", "backward": "bwd"}
VERDICT_ABBREV = {"no significant difference": "same"}


def fit(full: Table, width: int, compact: Callable[[], RenderableType]) -> RenderableType:
    """``full`` if it fits in ``width`` columns unwrapped (and ``width`` > COMPACT_AT), else ``compact()``."""
    measure = Console(width=10_000, markup=False, highlight=False, emoji=False).measure  # unwrapped width
    if width > COMPACT_AT and measure(full).maximum <= width:
        return full
    return compact()


def short_ms(ms: float | None) -> str:
    """'353 ms', '35.3 ms', '3.53 ms', '75.3 µs', '1.24 s': three significant digits, the unit in the cell."""
    if ms is None:
        return "-"
    value, unit = (ms / 1000, "s") if ms >= 999.5 else (ms, "ms") if ms >= 0.9995 else (ms * 1000, "µs")
    return f"{value:.{2 if value < 9.995 else 1 if value < 99.95 else 0}f} {unit}"


def compact(columns: Sequence[str], rows: list[list[str]], case: list[dict[str, str]],
            notes: list[str]) -> Group:
    """A borderless table of ``columns`` plus a 'case' column made of the ``case`` fields (device,
    precision, batch, mode...) that differ between rows; below it, a footer: the fields equal on
    every row, the abbreviations used, and ``notes``."""
    varying = [k for k in (case[0] if case else {}) if len({c[k] for c in case}) > 1]
    same = [v for k, v in (case[0] if case else {}).items() if k not in varying]
    names = list(columns[:2]) + (["case"] if varying else []) + list(columns[2:])
    table = Table(*names, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)
    for col in table.columns:
        col.overflow = "fold"  # a long name breaks, it is never cut with '…'
    for r, c in zip(rows, case):
        table.add_row(*r[:2], *([" ".join(c[k] for k in varying)] if varying else []), *r[2:])
    used = {a: b for a, b in _abbrevs().items() if any(a in cell.split() for r in rows for cell in r)
            or any(a in c.values() for c in case)}
    footer = ([f"every row: {' '.join(same)}"] if same else []) + \
        ([", ".join(f"{a} = {b}" for a, b in used.items())] if used else []) + notes
    return Group(table, Text("; ".join(footer)))


def _abbrevs() -> dict[str, str]:
    out: dict[str, str] = {}
    for d in (RUNTIME_ABBREV, MODE_ABBREV, PART_ABBREV, VERDICT_ABBREV):
        out.update({v: k for k, v in d.items()})
    return out


def case_fields(r: dict[str, Any], part: str | None = None) -> dict[str, str]:
    fields = {"device": str(r["device"]), "precision": str(r["precision"]), "batch": f"b{r['batch']}",
              "mode": MODE_ABBREV.get(r["mode"], str(r["mode"]))}
    return fields | ({"part": PART_ABBREV.get(part, part)} if part else {})


def runtime(name: str) -> str:
    return printable(RUNTIME_ABBREV.get(name, name), 40)


def compact_summary(rows: list[dict[str, Any]]) -> Group:
    """``zoo bench``'s summary: model, runtime, forward (and backward) median, img/s, status; why a
    case was skipped or failed is said once per reason below the table."""
    backward = any(r.get("backward") for r in rows)
    cells = [[printable(r["model"], 60), runtime(r["runtime"]), short_ms((r.get("forward") or {}).get("median_ms")),
              *([short_ms((r.get("backward") or {}).get("median_ms"))] if backward else []),
              f"{r['images_per_s']:.3g}" if r.get("images_per_s") else "-", r["status"]] for r in rows]
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] != "ok":
            why = printable(f"{r['status']}: {r.get('reason', '')}", 100)
            reasons[why] = reasons.get(why, 0) + 1
    notes = [f"{why} ({n}x)" for why, n in reasons.items()]
    names = ["model", "runtime", "fwd", *(["bwd"] if backward else []), "img/s", "status"]
    return compact(names, cells, [case_fields(r) for r in rows], ["times: median per call", *notes])


def compact_compare(lines: list[Any], fmt_ratio: Callable[[Any], str]) -> Group:
    """``zoo compare``: model, runtime, A and B medians, B/A with its 95% interval, the verdict."""
    keys = ("model", "runtime", "device", "precision", "batch", "mode")
    cells, case = [], []
    for ln in lines:
        r = dict(zip(keys, ln.case))
        case.append(case_fields(r, ln.part))
        ms = lambda m, q: short_ms(m)  # noqa: E731
        cells.append([printable(str(r["model"]), 60), runtime(str(r["runtime"])), ln.side("A", ms), ln.side("B", ms),
                      fmt_ratio(ln).replace(", ", ","), VERDICT_ABBREV.get(ln.verdict, ln.verdict)])
    return compact(["model", "runtime", "A", "B", "B/A [95% CI]", "verdict"], cells, case,
                   ["A, B: median per call"])
