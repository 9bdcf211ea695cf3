"""Reports of one or more runs: Markdown (the seeds' table style), CSV (every figure at full
precision, for other tools) and a self-contained HTML page (inline CSS, inline SVG plots, sortable
tables, no network).

Human-facing numbers carry their spread and are rounded where the noise lies: a median is shown
with its IQR, both cut at the IQR's second significant digit (as ``zoo bench`` prints them), and a
derived figure (images/s, TFLOP/s, speedups) at the same relative precision as the times it
comes from."""

from __future__ import annotations

import csv
import html as _html
import io
import json
import logging
import math
import os
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import machines
from .cells import Cell, Row, Run, _html_table, _md_table, fmt_ms, machine, natural, total_stats
from .history import read_any
from .interleave import median_ci, speed
from .results import ResultsError
from .stats import tail

log = logging.getLogger(__name__)
OPTIONAL = ("layout", "batch", "mode", "protocol", "concurrency")  # columns only where they vary
EAGER = ("torch", "fp32")  # the PyTorch eager fp32 baseline of the summary
OPENCV = ("opencv", "fp32")


# ---------------------------------------------------------------- loading




def _files(paths: list[Path]) -> list[tuple[Path, bool]]:
    """(file, found in a folder): a folder stands for every .json below it (a cnn-benchmarks folder)."""
    out: list[tuple[Path, bool]] = []
    for p in map(Path, paths):
        out += [(f, True) for f in sorted(p.rglob("*.json"))] if p.is_dir() else [(p, False)]
    return out


def _read(f: Path, in_folder: bool) -> dict[str, Any] | None:
    """A file named on the command line must be a results file; one found in a folder may be
    something else (a convert.json, say) and is then left out with a warning."""
    try:
        return read_any(f)
    except ResultsError as e:
        if not in_folder:
            raise
        log.warning("%s, left out", e)
        return None


def load_runs(paths: list[Path]) -> list[Run]:
    """Read every file; cnn-benchmarks files of one folder and one environment become one run
    (each file holds a single model). Empty runs are dropped with a warning."""
    groups: dict[Any, list[tuple[Path, dict[str, Any]]]] = defaultdict(list)
    for f, in_folder in _files(paths):
        doc = _read(f, in_folder)
        if doc is None:
            continue
        if not doc["rows"]:
            log.warning("%s: an empty run (no rows), left out", f)
            continue
        historic = doc["env"].get("origin") == "cnn-benchmarks"
        k = (str(f.parent), json.dumps(doc["env"], sort_keys=True)) if historic else str(f)
        groups[k].append((f, doc))
    if not groups:
        raise ResultsError("nothing to report: no rows in " + ", ".join(map(str, paths)))
    runs = [_merge(members) for members in groups.values()]
    return _unique_labels(runs)


def _merge(members: list[tuple[Path, dict[str, Any]]]) -> Run:
    first, doc = members[0]
    if len(members) == 1 and doc["env"].get("origin") != "cnn-benchmarks":
        return Run(first.name, doc)
    rows = [r for _, d in members for r in d["rows"]]
    cudnn = (doc["env"].get("gpu") or {}).get("cudnn")
    label = first.parent.name + ("" if "gpu" not in doc["env"] else f" cuDNN {cudnn or 'none'}")
    return Run(label, {**doc, "rows": rows})


def _unique_labels(runs: list[Run]) -> list[Run]:
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} #{seen[r.label]}"
    return runs


def all_rows(runs: list[Run]) -> list[Row]:
    """Every row, tagged with its run's label and machine (the CPU or GPU it ran on)."""
    return [{**r, "run": run.label, "machine": machine(run.doc["env"], r["device"]),
             "concurrency": r.get("concurrency") or 1}  # rows record it only above 1
            for run in runs for r in run.doc["rows"]]




# ---------------------------------------------------------------- numbers




def fmt_noisy(x: float | None, rel: float) -> str:
    """A derived figure rounded at the second significant digit of its spread ``x * rel``; three
    significant digits when the spread is unknown (a single sample)."""
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    if rel > 0:
        last = int(math.floor(math.log10(abs(x) * rel))) - 1  # exponent of the last digit kept
    else:
        last = int(math.floor(math.log10(abs(x)))) - 2
    if abs(x) < 1e-3:
        sig = max(1, int(math.floor(math.log10(abs(x)))) - last + 1)
        return f"{x:.{sig - 1}e}"
    return f"{x:.{max(0, -last)}f}"




def fmt_err(v: dict[str, Any] | None) -> str:
    if not v or v.get("max_rel") is None:
        return "-"
    return f"{v['max_rel']:.1e}" + ("" if v.get("ok", True) else f" (> {v['tolerance']:g})")


def total(r: Row) -> tuple[float, float] | None:
    """Forward + backward median per call (as images/s is computed), and a combined IQR (the root
    sum of squares: the two spreads are not additive)."""
    t = total_stats(r)
    return (t["median_ms"], t["iqr_ms"]) if t else None




def _rel(r: Row) -> float:
    t = total(r)
    return t[1] / t[0] if t and t[0] > 0 else 0.0


# ---------------------------------------------------------------- tables


def _varying(rows: list[Row], keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if len({r.get(k) for r in rows}) > 1]


def case_table(rows: list[Row], multi_run: bool) -> tuple[list[str], list[list[Cell]]]:
    """One model's timed rows, fastest total first."""
    extra = _varying(rows, OPTIONAL)
    keys = (["run"] if multi_run else []) + ["runtime", "device", "precision"] + extra
    head = keys + ["Forward (ms)", "Backward (ms)", "Total (ms)", "fwd p50/p90/p99", "images/s", "TFLOP/s",
                   "% of peak", "× baseline (interleaved)", "max rel err"]
    body = []
    for r in sorted(rows, key=lambda r: total(r)[0]):
        t, rel = total(r), _rel(r)
        body.append([(str(r.get(k)), r.get(k)) for k in keys] + [
            (fmt_ms(r["forward"]), r["forward"]["median_ms"]),
            (fmt_ms(r.get("backward")), (r.get("backward") or {}).get("median_ms")),
            (fmt_ms(total_stats(r)), t[0]),
            (tail(r["forward"]) or "-", r["forward"].get("p90_ms")),
            (fmt_noisy(r.get("images_per_s"), rel), r.get("images_per_s")),
            (fmt_noisy(r.get("achieved_tflops"), rel), r.get("achieved_tflops")),
            (fmt_peak(r.get("pct_of_peak"), rel), r.get("pct_of_peak")),
            fmt_interleaved(r),
            (fmt_err(r.get("verification")), (r.get("verification") or {}).get("max_rel"))])
    return _drop_empty(head, body, ("fwd p50/p90/p99", "TFLOP/s", "% of peak", "× baseline (interleaved)",
                                    "max rel err"))


def fmt_interleaved(r: Row) -> Cell:
    """Speed against the interleaved baseline: '1.61× [1.55, 1.66] opencv' (the baseline's time over
    this runtime's; the 95% interval over sessions, or over rounds in older files), or '-'."""
    i = r.get("interleave") or {}
    if not i.get("ratio") or i.get("label") == i.get("baseline"):
        return "-", None
    return f"{speed(i)} {i['baseline']}", 1 / i["ratio"]


def fmt_peak(pct: float | None, rel: float) -> str:
    """% of the GEMM peak; above 100 it is not a fact but a peak measured under another load."""
    if pct is not None and pct > 100:
        return "unreliable"
    return fmt_noisy(pct, rel)


def warnings(rows: list[Row]) -> list[str]:
    """One line per case timed on a machine that was not quiet, or with a % of peak above 100."""
    out = []
    for r in rows:
        case = " ".join(str(r.get(k)) for k in ("runtime", "device", "precision", "layout", "batch", "mode"))
        if r.get("quiet") is False:
            out.append(f"{case}: the machine was not quiet ({r.get('quiet_reason', 'no reason recorded')})")
        if (r.get("pct_of_peak") or 0) > 100:
            out.append(f"{case}: {r['pct_of_peak']:.0f}% of the GEMM peak: the peak was measured under another "
                       "load, so % of peak is unreliable")
    return out


def _drop_empty(head: list[str], body: list[list[Cell]], names: tuple[str, ...]) -> tuple[list[str], list[list[Cell]]]:
    """Leave out the named columns where no row has a value (e.g. FLOPs of historical runs)."""
    keep = [i for i, h in enumerate(head) if h not in names or any(row[i][0] != "-" for row in body)]
    return [head[i] for i in keep], [[row[i] for i in keep] for row in body]


def constants(rows: list[Row]) -> str:
    """What all rows of a table share, said once above it (e.g. 'batch 16 · training')."""
    fixed = [k for k in OPTIONAL if k not in _varying(rows, OPTIONAL)
             and not (k == "concurrency" and (rows[0].get(k) or 1) == 1)]  # one request at a time: unsaid
    words = {"layout": "{}", "batch": "batch {}", "mode": "{}", "protocol": "protocol {}",
             "concurrency": "{} in flight"}
    return " · ".join(words[k].format(rows[0].get(k)) for k in fixed)


def not_timed(rows: list[Row]) -> list[str]:
    """Rows without a verified timing: skipped, error, unverified (with its timing when there is one)."""
    out = []
    for r in rows:
        if r["status"] == "ok":
            continue
        case = " ".join(str(r.get(k)) for k in ("runtime", "device", "precision", "layout", "batch", "mode"))
        timing = f" (forward {fmt_ms(r['forward'])} ms)" if r.get("forward") else ""
        out.append(f"{case}: {r['status']} — {r.get('reason', '')}{timing}")
    return out


def summary_table(rows: list[Row]) -> tuple[list[str], list[list[Cell]]]:
    """Per model and machine/device/batch/mode/protocol, and per precision: the fastest verified
    runtime, and its speedup over PyTorch eager fp32 and over OpenCV (fp32) measured in the same
    conditions (a line per precision: a faster bf16 does not hide the fastest fp32)."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok" and r.get("forward"):
            groups[tuple(r.get(k) for k in ("model", "machine", "device", *OPTIONAL))].append(r)
    flat = [rs[0] for rs in groups.values()]
    extra = (["machine"] if len({r["machine"] for r in flat}) > 1 else []) + ["device"] + _varying(flat, OPTIONAL)
    head = ["model"] + extra + ["fastest", "Total (ms)", "images/s", "× PyTorch eager fp32", "× OpenCV fp32"]
    body = []
    for k in sorted(groups, key=lambda k: tuple(map(natural, k))):
        rs = groups[k]
        for prec in sorted({r["precision"] for r in rs}, key=lambda p: (p != "fp32", p)):
            best = min((r for r in rs if r["precision"] == prec), key=lambda r: total(r)[0])
            t = total(best)
            body.append([(best["model"], best["model"])] + [(str(best.get(c)), best.get(c)) for c in extra] + [
                (f"{best['runtime']} {best['precision']}" + ("" if best.get("layout") in (None, "nchw")
                                                             else f" {best['layout']}"), best["runtime"]),
                (fmt_ms(total_stats(best)), t[0]),
                (fmt_noisy(best.get("images_per_s"), _rel(best)), best.get("images_per_s")),
                _speedup(rs, best, EAGER), _speedup(rs, best, OPENCV)])
    return _drop_empty(head, body, ("× PyTorch eager fp32", "× OpenCV fp32"))


def _speedup(rows: list[Row], best: Row, base: tuple[str, str]) -> Cell:
    cands = [r for r in rows if (r["runtime"], r["precision"]) == base]
    if not cands:
        return "-", None
    ref = min(cands, key=lambda r: (r.get("layout") != "nchw", total(r)[0]))  # nchw: the plain case
    turns, sessions = _turns(ref, best)
    if turns:  # timed in turns: the speedup per round, with its interval over sessions and rounds
        x, lo, hi = median_ci(turns, sessions=sessions)
        return f"{x:.2f}× [{lo:.2f}, {hi:.2f}]", x
    x = total(ref)[0] / total(best)[0]
    return fmt_noisy(x, math.hypot(_rel(ref), _rel(best))) + "×", x


def _turns(ref: Row, best: Row) -> tuple[list[float], list[int] | None]:
    """ref's time over best's, round by round, when the two took turns in one interleaved group,
    and each round's session (None in results written before sessions)."""
    a, b = ref.get("interleave") or {}, best.get("interleave") or {}
    # precisions take turns in one group since sessions came in (2026-12); before, each had its own
    fields = ("model", "device", *OPTIONAL) + (() if a.get("round_session") and b.get("round_session") else ("precision",))
    same = a.get("order") and a.get("order") == b.get("order") and ref.get("run") == best.get("run") and \
        all(ref.get(k) == best.get(k) for k in fields)
    if not same or a.get("label") == b.get("label") or len(a.get("round_ms", [])) != len(b.get("round_ms", [])):
        return [], None
    return [x / y for x, y in zip(a["round_ms"], b["round_ms"])], a.get("round_session")


def env_items(env: dict[str, Any]) -> list[tuple[str, str]]:
    """The environment as (what, value) lines, in reading order."""
    items = []
    if env.get("origin"):
        items.append(("origin", f"{env['origin']} result files (Torch7)"))
    if env.get("origin") and not env.get("cpu") and not env.get("gpu"):
        items.append(("CPU", "not recorded in the result files"))
    if env.get("cpu"):
        cores = f"{env.get('cores_physical', '?')} physical / {env.get('cores_logical', '?')} logical cores"
        items.append(("CPU", f"{env['cpu']}, {cores}, {env.get('threads', '?')} threads"))
    if env.get("memory_bytes"):
        items.append(("memory", f"{env['memory_bytes'] / 2**30:.1f} GiB"))
    if env.get("gpu"):
        items.append(("GPU", _gpu(env["gpu"])))
    if env.get("os"):
        items.append(("OS", f"{env['os']} ({env.get('hostname', '?')})"))
    if env.get("libraries"):
        items.append(("libraries", ", ".join(f"{k} {v}" for k, v in env["libraries"].items())))
    if env.get("env_vars"):
        items.append(("variables", " ".join(f"{k}={v}" for k, v in env["env_vars"].items())))
    if "tf32" in env:
        items.append(("TF32", "on" if env["tf32"] else "off"))
    items += _details(env)
    for device, per in (env.get("gemm_peak") or {}).items():
        for precision, p in (per or {}).items():
            if isinstance(p, dict) and p.get("tflops"):
                items.append((f"GEMM peak {device} {precision}",
                              f"{fmt_noisy(p['tflops'], 0)} TFLOP/s (n={p.get('n', '?')})"))
    return items


def _details(env: dict[str, Any]) -> list[tuple[str, str]]:
    """The CPU's ISA level and math libraries, the runtimes' versions, the load at the start."""
    items = []
    c = env.get("cpu_details") or {}
    if c:
        flags = " ".join(c.get("isa_flags", []))
        items.append(("CPU details", f"torch ISA {c.get('torch_cpu_capability')}, flags {flags}, "
                      f"oneDNN {c.get('onednn')}, MKL {c.get('mkl')}, numpy BLAS {c.get('numpy_blas')}, "
                      f"governor {c.get('governor')}"))
    for name, v in (env.get("runtimes") or {}).items():
        if isinstance(v, dict):
            items.append((name, ", ".join(f"{k} {' '.join(x) if isinstance(x, list) else x}" for k, x in v.items())))
    load = env.get("load_at_start")
    if load:
        busy = ", ".join(f"{b['name']} {b['cpu_pct']:g}%" for b in load.get("busy", []))
        items.append(("load at start", f"load average {' '.join(map(str, load['loadavg']))}; busiest others: {busy}"))
    return items


def _gpu(g: dict[str, Any]) -> str:
    parts = [g.get("name", "?")]
    for key, word in (("driver", "driver"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("capability", "sm")):
        if key in g:
            parts.append(f"{word} {g[key] if g[key] is not None else 'none'}")
    if g.get("memory_bytes"):
        parts.append(f"{g['memory_bytes'] / 2**30:.0f} GiB")
    if g.get("clocks_mhz"):
        parts.append(f"SM clock {g['clocks_mhz'].get('sm')}/{g['clocks_mhz'].get('sm_max')} MHz")
    return ", ".join(map(str, parts))


def _env_cells(env: dict[str, Any]) -> list[list[Cell]]:
    return [[(k, k), (v, v)] for k, v in env_items(env)]




def by_model(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        out[r["model"]].append(r)
    return dict(sorted(out.items(), key=lambda kv: natural(kv[0])))


def _legend(runs: list[Run]) -> str:
    n = sum(len(r.doc["rows"]) for r in runs)
    return (f"{n} cases from {len(runs)} run(s): " + ", ".join(r.label for r in runs) + ". Times are "
            "per call: median ± interquartile range; Total = forward + backward medians. Numbers are "
            "rounded where their spread lies.")


# ---------------------------------------------------------------- Markdown




def markdown(runs: list[Run], figure_links: dict[str, str] | None = None) -> str:
    """The report in Markdown; ``figure_links`` maps figure names to image paths to show."""
    from . import plots

    rows = all_rows(runs)
    multi = len(runs) > 1
    out = ["# zoo benchmark report", "", _legend(runs), "", "## Summary", "",
           "Fastest verified runtime per model and conditions.", ""]
    out += _md_table(*summary_table(rows))
    out += machines.markdown(runs, figure_links)  # several machines: side by side (bench/machines.py)
    for model, rs in by_model(rows).items():
        out += ["", f"## {model}", ""]
        timed = [r for r in rs if r["status"] == "ok"]
        if timed:
            out += [constants(timed), ""] + _md_table(*case_table(timed, multi))
        rest = not_timed(rs)
        if rest:
            out += ["", "Not timed or not verified:", ""] + [f"- {s}" for s in rest]
        warned = warnings(rs)
        if warned:
            out += ["", "Warnings:", ""] + [f"- ⚠ {s}" for s in warned]
        link = (figure_links or {}).get(plots.timing_name(model)) if figure_links else None
        if link:
            out += ["", f"![{model}: time per call]({link})"]
    for name in ("throughput", "roofline"):
        if (figure_links or {}).get(name):
            out += ["", f"## {name.capitalize()}", "", f"![{name}]({figure_links[name]})"]
    out += ["", "## Environment"]
    for run in runs:
        out += ["", f"### {run.label}", ""] + _md_table(["", ""], _env_cells(run.doc["env"]))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- CSV

CSV_STATS = ("median_ms", "iqr_ms", "p5_ms", "p95_ms", "p90_ms", "p99_ms", "cv", "n")
CSV_HEAD = ["run", "model", "runtime", "device", "precision", "layout", "batch", "mode", "protocol", "concurrency",
            "status", "reason"] + [f"{p}_{s}" for p in ("forward", "backward") for s in CSV_STATS] + [
            "total_ms", "images_per_s", "gflops_per_image", "achieved_tflops", "pct_of_peak", "max_rel_err",
            "tolerance"]


def csv_text(runs: list[Run]) -> str:
    """One line per row, every figure at full precision (this is for other programs, which round
    as they need)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEAD)
    for r in all_rows(runs):
        t, v = total(r), r.get("verification") or {}
        stats = [(r.get(p) or {}).get(s) for p in ("forward", "backward") for s in CSV_STATS]
        w.writerow([r.get(k) for k in CSV_HEAD[:12]] + stats + [
            t[0] if t else None, r.get("images_per_s"), r.get("gflops_per_image"), r.get("achieved_tflops"),
            r.get("pct_of_peak"), v.get("max_rel"), v.get("tolerance")])
    return buf.getvalue()


# ---------------------------------------------------------------- HTML

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;margin:0;background:#f5f6f8}
main{max-width:1320px;margin:0 auto;padding:24px 32px 48px;background:#fff}
h1{font-size:26px;margin:0 0 6px}h2{font-size:20px;margin:34px 0 8px;border-bottom:2px solid #e3e6ec;padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}.meta,.fixed{color:#596275}.fixed{margin:2px 0 8px}
nav a{margin-right:12px}a{color:#2f5fb3;text-decoration:none}
table{border-collapse:collapse;margin:6px 0 10px;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid #e3e6ec;text-align:right;white-space:nowrap}
th{background:#eef1f6;position:sticky;top:0;cursor:pointer;user-select:none}
th.asc:after{content:" ▲"}th.desc:after{content:" ▼"}
td.t,th.t{text-align:left}tbody tr:nth-child(even){background:#fafbfc}tbody tr:hover{background:#eef4ff}
table.env td{white-space:normal;text-align:left;max-width:1000px}
table.env td:first-child{font-weight:600;white-space:nowrap}
ul.rest{margin:4px 0 10px;color:#8a4b08}figure{margin:10px 0}figure svg{max-width:100%;height:auto}
.scroll{overflow-x:auto}
"""

# Click a header to sort by that column (numbers by their data-v value, text otherwise).
JS = """
document.querySelectorAll("table.sortable th").forEach(function(th){th.addEventListener("click",function(){
var t=th.closest("table"),b=t.tBodies[0],i=Array.prototype.indexOf.call(th.parentNode.children,th);
var asc=!th.classList.contains("asc");t.querySelectorAll("th").forEach(function(h){h.classList.remove("asc","desc")});
th.classList.add(asc?"asc":"desc");var rows=Array.prototype.slice.call(b.rows);
rows.sort(function(x,y){var a=x.cells[i].dataset.v,c=y.cells[i].dataset.v,na=parseFloat(a),nc=parseFloat(c);
var r=(isNaN(na)||isNaN(nc))?String(a).localeCompare(String(c)):na-nc;return asc?r:-r});
rows.forEach(function(r){b.appendChild(r)})})});
"""




def html(runs: list[Run]) -> str:
    """A single self-contained page: no external file, font, script or network access."""
    from . import plots

    rows = all_rows(runs)
    figs = plots.figures(rows, [r.doc["env"] for r in runs])
    svg = {name: plots.svg_inline(fig) for name, fig in figs.items()}
    e = _html.escape
    models = by_model(rows)
    links = "".join(f'<a href="#m-{e(m)}">{e(m)}</a>' for m in models) + '<a href="#env">environment</a>'
    parts = ["<h1>zoo benchmark report</h1>", f'<p class="meta">{e(_legend(runs))} Click a column to sort.</p>',
             f"<nav>{links}</nav>", "<h2>Summary</h2>", _html_table(*summary_table(rows))]
    parts += machines.html(runs)
    for model, rs in models.items():
        parts.append(_html_model(model, rs, len(runs) > 1, svg.get(plots.timing_name(model))))
    for name, title in (("throughput", "Throughput against batch size"), ("roofline", "Roofline")):
        if name in svg:
            parts += [f"<h2>{title}</h2>", f"<figure>{svg[name]}</figure>"]
    parts.append('<h2 id="env">Environment</h2>')
    for run in runs:
        parts += [f"<h3>{e(run.label)}</h3>",
                  _html_table(["", ""], _env_cells(run.doc["env"]), "env")]
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>zoo benchmark report</title>'
            f'<meta name="viewport" content="width=device-width"><style>{CSS}</style></head><body><main>'
            + "\n".join(parts) + f"</main><script>{JS}</script></body></html>\n")


def _html_model(model: str, rows: list[Row], multi: bool, svg: str | None) -> str:
    e = _html.escape
    out = [f'<h2 id="m-{e(model)}">{e(model)}</h2>']
    timed = [r for r in rows if r["status"] == "ok"]
    if timed:
        out += [f'<p class="fixed">{e(constants(timed))}</p>', _html_table(*case_table(timed, multi))]
    rest = not_timed(rows) + [f"⚠ {s}" for s in warnings(rows)]
    if rest:
        out.append('<ul class="rest">' + "".join(f"<li>{e(s)}</li>" for s in rest) + "</ul>")
    if svg:
        out.append(f"<figure>{svg}</figure>")
    return "\n".join(out)


# ---------------------------------------------------------------- output


def render(runs: list[Run], fmt: str, out: Path | None = None, plots_dir: Path | None = None) -> str:
    """The report as text in ``fmt`` (md, html, csv); with ``plots_dir`` also the figures as PNG
    and SVG files there (the Markdown then links them, relative to ``out``)."""
    if fmt not in ("md", "html", "csv"):
        raise ResultsError(f"unknown format {fmt!r} (choose from md, html, csv)")
    links = _save_plots(runs, plots_dir, out) if plots_dir else None
    if fmt == "md":
        return markdown(runs, links)
    return html(runs) if fmt == "html" else csv_text(runs)


def _save_plots(runs: list[Run], plots_dir: Path, out: Path | None) -> dict[str, str]:
    from . import plots

    figs = {**plots.figures(all_rows(runs), [r.doc["env"] for r in runs]), **machines.figures(runs)}
    plots.save(figs, plots_dir)
    base = Path(out).parent if out else Path.cwd()
    return {name: os.path.relpath(Path(plots_dir) / f"{name}.png", base) for name in figs}


def write(text: str, out: Path) -> None:
    """Write atomically: a half-written report never replaces a good one."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # a report is for reading: not mkstemp's owner-only mode
    os.replace(tmp, out)


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def screenshot(html_path: Path, png_path: Path, width: int = 1400, height: int = 2000,
               timeout_s: float = 90.0) -> tuple[bool, str]:
    """Render an HTML file in headless Chromium to a PNG; (False, why) when it cannot."""
    exe = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if not exe:
        return False, "no chromium on PATH (apt-get install chromium)"
    with tempfile.TemporaryDirectory(prefix="zoo-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--screenshot={Path(png_path).resolve()}",
               f"--window-size={width},{height}", Path(html_path).resolve().as_uri()]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"chromium did not finish in {timeout_s:.0f} s"
    if not Path(png_path).exists():
        return False, f"chromium wrote no screenshot (exit {p.returncode}): {p.stderr.strip()[-300:]}"
    return True, str(png_path)
