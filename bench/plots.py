"""Figures of a report (matplotlib, PNG and SVG): forward/backward time per model, throughput
against batch size, and a roofline-style scatter of achieved TFLOP/s against model GFLOPs.

Figures are built with ``matplotlib.figure.Figure`` directly, not pyplot: no global state and no
GUI backend, so this works headless and from several threads."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

Row = dict[str, Any]
COLORS = {"forward": "#4C72B0", "backward": "#DD8452"}



def plain(text: str) -> str:
    """Text from a results file for matplotlib as it is: a '$' in a model name would otherwise start
    a math formula (and an unbalanced one fails the whole figure)."""
    return text.replace("$", r"\$")

def _label(r: Row, extra: tuple[str, ...] = ()) -> str:
    parts = [r["runtime"], r["precision"]] + [f"b{r[k]}" if k == "batch" else str(r[k]) for k in extra]
    return " ".join(parts)


def _varying(rows: list[Row], keys: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in keys if len({r.get(k) for r in rows}) > 1)


def _quartiles(stats: dict[str, Any]) -> tuple[float, float]:
    """Distances from the median down to Q1 and up to Q3 (asymmetric when the samples are)."""
    s = stats.get("samples_ms")
    med = stats["median_ms"]
    if s:
        q1, q3 = np.percentile(s, [25, 75])
        return max(0.0, med - q1), max(0.0, q3 - med)
    return stats["iqr_ms"] / 2, stats["iqr_ms"] / 2


def timing_bars(model: str, rows: list[Row]) -> Figure | None:
    """Horizontal bars of forward (and backward) median time per runtime+precision, IQR whiskers."""
    rows = [r for r in rows if r.get("forward")]
    if not rows:
        return None
    extra = _varying(rows, ("device", "layout", "batch", "mode", "run"))
    rows = sorted(rows, key=lambda r: -_total(r))  # fastest at the top
    parts = [p for p in ("forward", "backward") if any(r.get(p) for r in rows)]
    fig = Figure(figsize=(8, 1.2 + 0.45 * len(rows) * len(parts)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))
    h = 0.8 / len(parts)
    for i, part in enumerate(parts):
        med = [r[part]["median_ms"] if r.get(part) else 0.0 for r in rows]
        err = np.array([_quartiles(r[part]) if r.get(part) else (0.0, 0.0) for r in rows]).T
        offset = ((len(parts) - 1) / 2 - i) * h  # forward above backward
        ax.barh(y + offset, med, h, xerr=err, color=COLORS[part], label=part, capsize=3,
                error_kw={"elinewidth": 1})
    ax.set_yticks(y, [plain(_label(r, extra)) for r in rows])
    what = "time per call" if len(parts) > 1 else f"{parts[0]} time per call"
    ax.set_xlabel(f"median {what} (ms); whiskers: interquartile range")
    ax.set_title(plain(model))
    if len(parts) > 1:
        ax.legend(loc="best", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _total(r: Row) -> float:
    return r["forward"]["median_ms"] + (r["backward"]["median_ms"] if r.get("backward") else 0.0)


def throughput(rows: list[Row]) -> Figure | None:
    """images/s against batch size, one line per model+runtime+precision+device+mode measured at
    two batch sizes or more; None when no case was."""
    series: dict[tuple[Any, ...], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r.get("images_per_s") and r["status"] == "ok":
            k = (r["model"], r["runtime"], r["precision"], r["device"], r["mode"], r.get("layout"))
            series[k].append((r["batch"], r["images_per_s"]))
    series = {k: sorted(v) for k, v in series.items() if len({b for b, _ in v}) > 1}
    if not series:
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for (model, runtime, precision, device, mode, layout), pts in sorted(series.items()):
        b, ips = zip(*pts)
        ax.plot(b, ips, marker="o", label=plain(f"{model} {runtime} {precision} {device} {mode} {layout}"))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 1 2 4 8, not 2^0 2^1
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s")
    ax.set_title("Throughput against batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    return fig


def roofline(rows: list[Row], envs: list[dict[str, Any]]) -> Figure | None:
    """Achieved TFLOP/s against model GFLOPs per image (log-log), with each measured GEMM peak
    (env["gemm_peak"][device][precision]["tflops"]) as a horizontal line; None without FLOP data."""
    pts = [r for r in rows if r.get("achieved_tflops") and r.get("gflops_per_image") and r["status"] == "ok"]
    if not pts:
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    by_rt: dict[str, list[Row]] = defaultdict(list)
    for r in pts:
        by_rt[f"{r['runtime']} {r['precision']} {r['device']}"].append(r)
    markers = "osD^vP*X<>"
    for i, (name, rs) in enumerate(sorted(by_rt.items())):
        ax.scatter([r["gflops_per_image"] for r in rs], [r["achieved_tflops"] for r in rs],
                   marker=markers[i % len(markers)], label=plain(name), zorder=3)
    peaks = _peaks(envs, {(r["device"], r["precision"]) for r in pts})
    for i, (name, tflops) in enumerate(peaks):  # grey lines: the points keep the colours
        ax.axhline(tflops, color="0.35", linestyle=("--", ":", "-.")[i % 3], linewidth=1,
                   label=f"GEMM peak {name} (best measured)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis, [r["gflops_per_image"] for r in pts])
    _plain_log_ticks(ax.yaxis, [r["achieved_tflops"] for r in pts] + [t for _, t in peaks])
    ax.margins(x=0.12, y=0.1)  # room for the model names next to the points
    ax.set_xlabel("model GFLOPs per image (multiply-adds x 2)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Achieved throughput against model size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="x-small")
    _name_points(fig, ax, [(r["model"], r["gflops_per_image"], r["achieved_tflops"]) for r in pts])
    return fig


# Where a point's name may go, in points from the point: right/left, above/below, then farther.
_SPOTS = [(4, 1), (4, -9), (-4, 1), (-4, -9), (4, 7), (4, -15), (-4, 7), (-4, -15), (10, -4), (-10, -4)]


def _name_points(fig: Figure, ax: Any, points: list[tuple[str, float, float]], size: float = 7) -> None:
    """Name every point where its label covers no other label or point, or the least of them:
    names of close models would otherwise print over each other. Sizes are estimated from the
    font size (a character about 0.6 em wide), positions come from the laid-out axes."""
    fig.draw_without_rendering()
    px = fig.dpi / 72  # pixels per point
    xy = ax.transData.transform([(x, y) for _, x, y in points])
    frame = ax.get_window_extent()
    dot = 4 * px
    taken = [(x - dot, y - dot, x + dot, y + dot) for x, y in xy]

    def cost(box: tuple[float, float, float, float]) -> float:
        out = max(0.0, frame.x0 - box[0]) + max(0.0, box[2] - frame.x1) + max(0.0, box[3] - frame.y1) \
            + max(0.0, frame.y0 - box[1])
        hit = sum(max(0.0, min(box[2], t[2]) - max(box[0], t[0])) * max(0.0, min(box[3], t[3]) - max(box[1], t[1]))
                  for t in taken)
        return hit + 1e3 * out

    w_char, h = 0.6 * size * px, 1.15 * size * px
    for (name, x, y), (cx, cy) in sorted(zip(points, xy), key=lambda p: -p[1][1]):
        boxes, w = [], w_char * len(name)
        for dx, dy in _SPOTS:
            x0 = cx + dx * px if dx > 0 else cx + dx * px - w
            boxes.append(((x0, cy + dy * px, x0 + w, cy + dy * px + h), dx, dy))
        box, dx, dy = min(boxes, key=lambda b: cost(b[0]))  # the first of the cheapest
        taken.append(box)
        ax.annotate(name, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=size,
                    ha="left" if dx > 0 else "right", va="bottom")


def _plain_log_ticks(axis: Any, values: list[float]) -> None:
    """GFLOPs read better as '2  3  5' than '2x10^0'; minor ticks get labels when the data span
    less than about two decades (else they would crowd)."""
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    span = np.log10(max(values) / min(values)) if min(values) > 0 else 9
    axis.set_minor_formatter(plain if span < 1.5 else NullFormatter())


def _peaks(envs: list[dict[str, Any]], wanted: set[tuple[str, str]]) -> list[tuple[str, float]]:
    found = {}
    for env in envs:
        for device, per in (env.get("gemm_peak") or {}).items():
            for precision, p in (per or {}).items():
                if (device, precision) in wanted and isinstance(p, dict) and p.get("tflops"):
                    found[f"{device} {precision}"] = max(p["tflops"], found.get(f"{device} {precision}", 0))
    return sorted(found.items())


def figures(rows: list[Row], envs: list[dict[str, Any]]) -> dict[str, Figure]:
    """Every figure of a report by a file-name stem: one timing chart per model, then throughput
    and roofline when the data allow."""
    out: dict[str, Figure] = {}
    by_model: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            by_model[r["model"]].append(r)
    for model, rs in sorted(by_model.items()):
        fig = timing_bars(model, rs)
        if fig:
            out[timing_name(model)] = fig
    for name, fig in (("throughput", throughput(rows)), ("roofline", roofline(rows, envs))):
        if fig:
            out[name] = fig
    return out


def timing_name(model: str) -> str:
    """The file-name stem of a model's timing chart (safe for any model name)."""
    return "time-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-") or "model")


def save(figs: dict[str, Figure], out_dir: Path, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    import matplotlib

    with matplotlib.rc_context(_SAME_BYTES):
        for name, fig in figs.items():
            for fmt in formats:
                p = out_dir / f"{name}.{fmt}"
                fig.savefig(p, dpi=110, metadata=_METADATA.get(fmt))
                paths.append(p)
    return paths


# No creation date or software version in the files, and SVG ids from a fixed salt (else random):
# the same data give the same bytes.
_METADATA = {"svg": {"Date": None, "Creator": None}, "png": {"Software": None}}
_SAME_BYTES = {"svg.hashsalt": "zoo"}


def svg_inline(fig: Figure) -> str:
    """The figure as an <svg> element for embedding in HTML (text kept as text: smaller, and the
    browser's sans-serif renders it)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", **_SAME_BYTES}):
        fig.savefig(buf, format="svg", metadata=_METADATA["svg"])
    text = buf.getvalue()
    return text[text.index("<svg"):]
