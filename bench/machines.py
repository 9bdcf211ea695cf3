"""Machines side by side, as the seeds' per-GPU tables: for each precision (and mode, batch, layout,
protocol), one table whose rows are models and whose columns are machine x runtime, each cell the
forward / backward / total median ± IQR; a bar chart of the totals; and the environment facts that
differ between the machines. Shown by ``zoo report`` when its runs come from more than one machine
(``zoo bench --cluster`` writes one file per machine)."""

from __future__ import annotations

import html as _html
import re
from collections import defaultdict
from typing import Any

from matplotlib.figure import Figure

from . import cells as rep
from . import plots
from .compare import env_differences
from .env import machine_name

GROUP = ("precision", "mode", "batch", "layout", "protocol")


def machine_of(run: rep.Run) -> str:
    """A run's machine: the name zoo bench gives its results folder (zoo bench --cluster records it),
    else (a file from elsewhere) its CPU or GPU."""
    env = run.doc["env"]
    try:
        return str(env.get("machine") or machine_name(env))
    except (KeyError, TypeError, AttributeError):
        return rep.machine(env, run.doc["rows"][0]["device"] if run.doc["rows"] else "cpu")


def by_machine(runs: list[rep.Run]) -> dict[str, list[rep.Run]]:
    out: dict[str, list[rep.Run]] = defaultdict(list)
    for r in runs:
        out[machine_of(r)].append(r)
    return dict(out)


def _groups(runs: list[rep.Run]) -> dict[tuple[Any, ...], dict[tuple[str, str], dict[str, rep.Row]]]:
    """(precision, mode, batch, layout, protocol) -> (machine, runtime) -> model -> timed row."""
    out: dict[tuple[Any, ...], dict[tuple[str, str], dict[str, rep.Row]]] = defaultdict(lambda: defaultdict(dict))
    for m, rs in by_machine(runs).items():
        for run in rs:
            for r in run.doc["rows"]:
                if r["status"] == "ok":
                    out[tuple(r[k] for k in GROUP)][(m, r["runtime"])][r["model"]] = r
    return {g: dict(cols) for g, cols in sorted(out.items(), key=lambda kv: tuple(map(str, kv[0])))}


def _title(g: tuple[Any, ...]) -> str:
    p, mode, batch, layout, protocol = g
    return f"{p} · {mode} · batch {batch} · {layout} · protocol {protocol}"


def _cell(r: rep.Row | None) -> rep.Cell:
    if r is None:
        return "-", float("inf")
    t = rep.total_stats(r)
    if not r.get("backward"):
        return rep.fmt_ms(r["forward"]), t["median_ms"] if t else float("inf")
    text = f"F {rep.fmt_ms(r['forward'])} / B {rep.fmt_ms(r['backward'])} / T {rep.fmt_ms(t)}"
    return text, t["median_ms"] if t else float("inf")


def tables(runs: list[rep.Run]) -> list[tuple[str, list[str], list[list[rep.Cell]]]]:
    """(title, head, body) per group: rows models, columns machine x runtime; none for one machine."""
    if len(by_machine(runs)) < 2:
        return []
    out = []
    for g, cols in _groups(runs).items():
        order = sorted(cols, key=lambda c: (c[0], c[1]))
        models = sorted({m for c in order for m in cols[c]}, key=rep.natural)
        head = ["model"] + [f"{m} {rt} (ms)" for m, rt in order]
        body = [[(model, model)] + [_cell(cols[c].get(model)) for c in order] for model in models]
        out.append((_title(g), head, body))
    return out


def differences(runs: list[rep.Run]) -> list[str]:
    """The environment facts that differ between the first machine and each other one."""
    ms = by_machine(runs)
    names = list(ms)
    first = ms[names[0]][0].doc["env"]
    return [f"{names[0]} vs {n}: {d}" for n in names[1:] for d in env_differences(first, ms[n][0].doc["env"])]


def figure_name(title: str) -> str:
    return "machines-" + re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()


def figures(runs: list[rep.Run]) -> dict[str, Figure]:
    """Per group: total time per model, one bar per machine x runtime (log scale, IQR whiskers)."""
    if len(by_machine(runs)) < 2:
        return {}
    out = {}
    for g, cols in _groups(runs).items():
        order = sorted(cols)
        models = sorted({m for c in order for m in cols[c]}, key=rep.natural)
        fig = Figure(figsize=(max(6.0, 1.2 * len(models) * max(1, len(order)) / 3), 4.2))
        ax = fig.add_subplot()
        width = 0.8 / len(order)
        for i, c in enumerate(order):
            xs, ys, es = [], [], []
            for j, model in enumerate(models):
                t = rep.total_stats(cols[c][model]) if model in cols[c] else None
                if t:
                    xs.append(j + (i - (len(order) - 1) / 2) * width)
                    ys.append(t["median_ms"])
                    es.append(t["iqr_ms"] / 2)
            ax.bar(xs, ys, width, yerr=es, label=plots.plain(f"{c[0]} {c[1]}"), capsize=2)
        ax.set_xticks(range(len(models)), [plots.plain(m) for m in models], rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("total time per call (ms)")
        ax.set_title(plots.plain(_title(g)), fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out[figure_name(_title(g))] = fig
    return out


def markdown(runs: list[rep.Run], links: dict[str, str] | None = None) -> list[str]:
    """The machines section of the Markdown report (nothing for a single machine)."""
    ts = tables(runs)
    if not ts:
        return []
    out = ["", "## Machines side by side", "",
           "Per call, median ± IQR (F forward, B backward, T total where training)."]
    for title, head, body in ts:
        out += ["", f"### {title}", ""] + rep._md_table(head, body)
        link = (links or {}).get(figure_name(title))
        if link:
            out += ["", f"![{title}]({link})"]
    diffs = differences(runs)
    out += ["", "Environment differences between the machines:", ""] + [f"- {d}" for d in diffs or ["none recorded"]]
    return out


def html(runs: list[rep.Run]) -> list[str]:
    """The same section for the HTML page (figures inline as SVG)."""

    ts = tables(runs)
    if not ts:
        return []
    e = _html.escape
    figs = figures(runs)
    parts = ["<h2>Machines side by side</h2>"]
    for title, head, body in ts:
        parts += [f"<h3>{e(title)}</h3>", rep._html_table(head, body)]
        if figure_name(title) in figs:
            parts.append(f"<figure>{plots.svg_inline(figs[figure_name(title)])}</figure>")
    parts.append("<ul>" + "".join(f"<li>{e(d)}</li>" for d in differences(runs) or ["none recorded"]) + "</ul>")
    return parts
