"""The ``zoo`` command: thin Typer commands over the pipeline functions."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from convert.errors import ConvertError
from convert.naming import printable

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Convert, verify and benchmark the classic CNN model zoo (Caffe, Torch7).")
# Wide tables stay readable in logs and CI (rich would assume 80 columns off a terminal).
# Text from model files reaches the terminal: no markup, emoji codes or highlighting is read in it.
_PLAIN = {"markup": False, "emoji": False, "highlight": False}
out = Console(**_PLAIN) if sys.stdout.isatty() else Console(width=160, **_PLAIN)
err = Console(stderr=True, **_PLAIN) if sys.stderr.isatty() else Console(stderr=True, width=160, **_PLAIN)


def tell(console: Console, label: str, style: str, message: object) -> None:
    """``label: message`` with the label styled and the message printed as plain text (control
    characters and escape sequences removed, length bounded)."""
    console.print(Text.assemble((f"{label}:", style), " ", printable(message)), soft_wrap=True)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A user's mistake is one line on stderr and exit code 2; anything else keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        try:
            return fn(*a, **k)
        except ConvertError as e:
            tell(err, "error", "red", e)
            raise typer.Exit(2) from None

    return wrapper


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno >= logging.WARNING else "info"
        tell(err, level, "yellow", record.getMessage())


def versions() -> str:
    """'zoo 0.1.0 (torch 2.13.0+cpu, onnx 1.23.2, onnxruntime 1.32.0)', read without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"zoo {v('zoo')} (" + ", ".join(f"{n} {v(n)}" for n in ("torch", "onnx", "onnxruntime")) + ")"


def _version(flag: bool) -> None:
    if flag:
        typer.echo(versions())
        raise typer.Exit()


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show info messages."),
         version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the versions of zoo, torch, onnx and onnxruntime.")) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_Handler()]
    root.setLevel(logging.INFO if verbose else logging.WARNING)


def _shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    from convert.artifacts import parse_shape

    return dict(parse_shape(s) for s in specs or [])


def _args(specs: list[str] | None) -> dict[str, str]:
    res = {}
    for s in specs or []:
        k, sep, v = s.partition("=")
        if not sep or not k:
            raise ConvertError(f"--arg {s!r}: expected key=value")
        res[k] = v
    return res


def si(x: float) -> str:
    """Three significant digits and a unit: 724406816 -> '724M', 1.583e9 -> '1.58G', 43200 -> '43.2k'
    (a small net's multiply-adds are not '0.000 G')."""
    scale, unit = next(((s, u) for s, u in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
                        if abs(x) >= 0.9995 * s), (1.0, ""))
    v = x / scale
    return f"{v:.{2 if abs(v) < 9.995 else 1 if abs(v) < 99.95 else 0}f}{unit}"


def folding(table: Table) -> Table:
    """On a narrow terminal a long cell breaks onto the next line rather than being cut with '…'."""
    for col in table.columns:
        col.overflow = "fold"
    return table


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


@app.command("convert")
@user_errors
def convert_cmd(
    models: list[str] = typer.Argument(None, help="Model files (.prototxt, .t7, .lua) or zoo names."),
    all_: bool = typer.Option(False, "--all", help="Every model of the zoo."),
    weights: Path | None = typer.Option(None, help="Caffe weights (.caffemodel)."),
    out_dir: Path = typer.Option(Path("outputs/models"), "--out", help="Artifacts go to OUT/<name>/."),
    input_shape: list[str] = typer.Option(None, help="NAME=N,C,H,W (repeatable)."),
    arg: list[str] = typer.Option(None, help="key=value for a Lua definition (repeatable)."),
    seed: int = typer.Option(0, help="Seed of random weights and of the verification input."),
    verify: bool = typer.Option(True, help="Check the conversion numerically (default on)."),
    fold: bool = typer.Option(False, "--fold", help="Fold batch norms into the preceding convolution "
                              "in model.py too (model.onnx always has them folded, as torch.onnx.export "
                              "writes an eval-mode module)."),
    fp16: bool = typer.Option(False, "--fp16", help="Also write model.fp16.onnx (fp16 weights and compute, "
                              "float32 inputs/outputs), verified with the fp16 tolerance."),
    jobs: int = typer.Option(1, "--jobs", help="Convert N models at once, each in its own process."),
    cluster: str | None = typer.Option(None, help="Convert on a Ray cluster (ray://HOST:10001, auto, local): "
                                       "a task per model, artifacts written on the node that converted it."),
) -> None:
    """Convert models to PyTorch (model.py + model.safetensors) and ONNX, and verify them."""
    from .parallel import convert_many
    from .pipeline import targets

    ts = targets(models or [], all_)
    if weights and len(ts) > 1:
        raise ConvertError("--weights applies to a single model")
    table = folding(Table("model", "status", "params", "MACs", "PyTorch", "ONNX Runtime", "OpenCV", "seconds",
                          title="max |a-b| / max |ref| against the float64 reference"))
    failed = False
    work = [((t, out_dir, weights, _shapes(input_shape), seed, verify, _args(arg)), {"fold": fold, "fp16": fp16})
            for t in ts]
    for t, (res, secs) in zip(ts, convert_many(work, jobs, cluster)):
        info = res.report
        b = info["verification"].get("backends", {})
        cv = b.get("opencv", {})
        cv_txt = _fmt(cv.get("max_rel")) if "max_rel" in cv else cv.get("status", "-")
        table.add_row(printable(t.name, 60), info["status"], si(info["params"]),
                      si(info["macs_per_image"]), _fmt(b.get("pytorch", {}).get("max_rel")),
                      _fmt(b.get("onnxruntime", {}).get("max_rel")), cv_txt, f"{secs:.1f}")
        if info["status"] == "mismatch":
            failed = True
            div = info["verification"].get("first_divergence")
            where = "" if not div else f" first divergence: layer {div['layer']!r} ({div['backend']})" \
                if div.get("layer") is not None else f" ({div['backend']}: {div.get('reason')})"
            tell(err, "mismatch", "red", f"{t.name}{where}")
        out.print(printable(f"{t.name}: {info['status']} -> {res.dir}"))
        if "fp16" in info:  # --fp16: model.fp16.onnx's own verification
            f16 = info["fp16"]
            by = f16.get("verified_by") or "ONNX Runtime"
            back = f16.get("backends", {})
            err16 = _fmt((back.get("openvino") or back.get("onnxruntime") or {}).get("max_rel"))
            out.print(printable(f"{t.name}: model.fp16.onnx {f16['status']} ({by}; max rel {err16}) "
                                f"{f16.get('reason', '')}".rstrip()))
    out.print(table)
    if failed:
        raise typer.Exit(1)


@app.command("verify")
@user_errors
def verify_cmd(dirs: list[Path] = typer.Argument(..., help="Artifact directories (OUT/<name>).")) -> None:
    """Re-run the numerical check of existing artifacts."""
    from convert.api import reverify

    bad = False
    for d in dirs:
        res = reverify(d)
        v = res.report["verification"]
        parts = [f"{k} {_fmt(b.get('max_rel'))}" if "max_rel" in b else f"{k} {b.get('status')}"
                 for k, b in v["backends"].items()]
        out.print(printable(f"{d}: {res.report['status']} ({', '.join(parts)})"))
        bad |= res.report["status"] != "verified"
    if bad:
        raise typer.Exit(1)


@app.command("list")
@user_errors
def list_cmd(out_dir: Path = typer.Option(Path("outputs/models"), "--out")) -> None:
    """The zoo: name, definition file, input size, parameters, multiply-adds, conversion status."""
    from .catalogue import list_rows  # not the pipeline: a warm `zoo list` imports no torch

    table = folding(Table("name", "source", "input", "params", "MACs", "status",
                          caption="MACs: multiply-adds per image"))
    for r in list_rows(out_dir):
        table.add_row(r["name"], r["source"], r["input"], si(r["params"]), si(r["macs"]), r["status"])
    out.print(table)


@app.command("clean")
@user_errors
def clean_cmd(models: list[str] = typer.Argument(None, help="Zoo names (or folder names under --out)."),
              all_: bool = typer.Option(False, "--all", help="Every converted model."),
              out_dir: Path = typer.Option(Path("outputs/models"), "--out")) -> None:
    """Remove converted models: OUT/MODEL and the benchmark's variants of it in outputs/cache (folders zoo
    wrote only; anything else is left)."""
    from .pipeline import clean, converted_dirs, is_variant

    dirs, left = converted_dirs(models or [], all_, out_dir)
    for m in models or []:
        if not any(d.name == m or is_variant(m, d.name) for d in dirs):
            out.print(printable(f"{m}: not converted, nothing to remove"))
    freed = clean(dirs)
    for d in dirs:
        out.print(printable(f"removed {d}"))
    for d in left:
        out.print(printable(f"left {d}: not a folder zoo wrote"))
    out.print(f"{len(dirs)} converted model folder(s) removed, {freed / 1e9:.2f} GB freed", highlight=False)


@app.command("info")
@user_errors
def info_cmd(model: str = typer.Argument(..., help="A model file or zoo name."),
             input_shape: list[str] = typer.Option(None, help="NAME=N,C,H,W (repeatable).")) -> None:
    """Layers, output shapes, parameters and multiply-adds of a model."""
    from .pipeline import describe, layer_rows, resolve

    g = describe(resolve(model), _shapes(input_shape))
    table = folding(Table("layer", "op", "output", "params", "MACs"))
    for r in layer_rows(g):
        table.add_row(printable(r["layer"], 60), r["op"], "x".join(map(str, r["output"])),
                      f"{r['params']:,}" if r["params"] else "", f"{r['macs']:,}" if r["macs"] else "")
    out.print(table)
    batch = next(iter(g.inputs.values()))[0]
    out.print(printable(f"inputs {dict(g.inputs)}  outputs {g.outputs}"))
    out.print(f"parameters {g.param_count():,}   multiply-adds {g.macs():,} "
              f"({si(g.macs() / batch)} per image)", highlight=False)


@app.command("bench")
@user_errors
def bench_cmd(
    models: list[str] = typer.Argument(None, help="Zoo names or model files."),
    all_: bool = typer.Option(False, "--all", help="Every model of the zoo (or of the protocol)."),
    gpu: int | None = typer.Option(None, help="CUDA device index; without it, the CPU."),
    runtime: list[str] = typer.Option(None, help="Runtimes (repeatable); default: all."),
    precision: list[str] = typer.Option(None, help="fp32, fp16, bf16 (repeatable)."),
    layout: list[str] = typer.Option(None, help="nchw, channels_last (repeatable); default nchw."),
    batch: list[int] = typer.Option(None, help="Batch sizes (repeatable); default 1."),
    mode: str = typer.Option("", help="inference, training or both (default inference)."),
    protocol: str = typer.Option("zoo", help="zoo, cnn-benchmarks or convnet-benchmarks."),
    layers: bool = typer.Option(
        False, "--layers", help="convnet-benchmarks' L1-L5 convolutions (MODEL names pick some: L4 L5)."),
    out_file: Path | None = typer.Option(
        None, "--out", help="Results file (default outputs/results/<machine>/<time>.json)."),
    resume: bool = typer.Option(False, help="Continue the --out file: skip the cases it has."),
    dry_run: bool = typer.Option(False, help="List the cases and an estimated duration."),
    budget: float | None = typer.Option(None, help="Seconds for the whole sweep: iteration counts shrink to fit."),
    quick: bool = typer.Option(False, help="AlexNet, GoogLeNet, ResNet-18 on torch, onnxruntime, opencv, 8 "
                                           "rounds (about 4 minutes on a busy 2-core machine, converting included)."),
    threads: int | None = typer.Option(None, help="Threads for every runtime (default: physical cores)."),
    isolate: bool = typer.Option(True, help="Each case in a fresh process (default)."),
    interleave: bool = typer.Option(
        True, help="The runtimes and precisions of one model/batch/mode take turns in rounds, each in its own "
                   "long-lived process, and get a ratio to --baseline with a 95% interval (default; "
                   "--no-interleave: one case per process, one after the other)."),
    baseline: str | None = typer.Option(None, help="Interleaved: the runtime the others are divided by "
                                        "(default opencv where timed, else the first runtime)."),
    rounds: int | None = typer.Option(None, help="Interleaved: rounds of one 0.3 s window per runtime "
                                      "(default 16; 8 with --quick; at least 8, rounded up to a multiple of 8: four sessions)."),
    concurrency: int = typer.Option(1, help="Throughput mode: N inference requests in flight at once, N sessions "
                                    "of threads/N threads each (onnxruntime, openvino; others skipped)."),
    timeout: float = typer.Option(900.0, help="Seconds before a case is stopped (an error row)."),
    seed: int = typer.Option(0),
    input_data: Path | None = typer.Option(
        None, "--input-data", help="A folder of real inputs: .npy arrays (C,H,W or N,C,H,W) or images (.jpg/.png, "
        "resized and normalized as the model expects); default: seeded random inputs."),
    keep: bool = typer.Option(False, "--keep", help="Keep each model's converted files (outputs/models, "
                              "outputs/cache) after its cases; by default what this run wrote is removed."),
    cluster: str | None = typer.Option(
        None, help="Run on a Ray cluster: ray://HOST:10001, auto, or local (--out DIR/RUN.json: one file per "
                   "machine, DIR/<machine>/RUN.json)."),
    accelerator: list[str] = typer.Option(None, help="With --cluster: the accelerator types to time on (repeatable)."),
    all_accelerators: bool = typer.Option(False, "--all-accelerators",
                                          help="With --cluster: every accelerator type present (no CPU-only node)."),
) -> None:
    """Time converted models under identical conditions across runtimes, devices and precisions."""
    from .bench_cli import run_bench

    run_bench(out, err, models=models or [], all_=all_, gpu=gpu, runtimes=runtime or [],
              precisions=precision or [], layouts=layout or [], batches=batch or [], mode=mode,
              protocol=protocol, layers=layers, out_file=out_file, resume=resume, dry_run=dry_run,
              budget=budget, quick=quick, threads=threads, isolate=isolate, timeout=timeout, seed=seed,
              interleave=interleave, baseline=baseline, rounds=rounds, input_data=input_data, concurrency=concurrency,
              keep=keep, cluster=cluster, accelerators=accelerator or [], all_accelerators=all_accelerators)


@app.command("report")
@user_errors
def report_cmd(
    results_files: list[Path] = typer.Argument(
        ..., help="Results files (zoo, or cnn-benchmarks JSON: auto-detected) or folders of them."),
    fmt: str = typer.Option("md", "--format", help="md, html or csv."),
    out_file: Path | None = typer.Option(None, "--out", help="Write the report to this file (default: stdout)."),
    plots: Path | None = typer.Option(None, "--plots", help="Also write the figures (PNG and SVG) to this folder."),
) -> None:
    """A report of one or more runs: per-model tables, a summary, plots (HTML), the environment."""
    from bench import report
    from bench.results import ResultsError

    if fmt not in ("md", "html", "csv"):
        raise ConvertError(f"unknown format {fmt!r} (choose from md, html, csv)")
    try:
        text = report.render(report.load_runs(results_files), fmt, out_file, plots)
    except ResultsError as e:
        raise ConvertError(str(e)) from None
    if out_file is None:
        typer.echo(text, nl=False)
        return
    report.write(text, out_file)
    err.print(f"report: {out_file}" + (f", figures: {plots}" if plots else ""), highlight=False)


@app.command("compare")
@user_errors
def compare_cmd(
    a: Path = typer.Argument(..., help="The baseline run (zoo results or cnn-benchmarks JSON)."),
    b: Path = typer.Argument(..., help="The run to judge against it."),
    threshold: float = typer.Option(5.0, help="Exit 1 when a case is significantly slower by more than PCT %."),
    noise_floor: float = typer.Option(2.0, help="Changes below PCT % (or the runs' own spread) are not significant."),
    ignore_env: bool = typer.Option(False, "--ignore-env", help="No warning when the environments differ."),
    any_runtime: bool = typer.Option(False, "--any-runtime",
                                     help="Match cases whatever their runtime (e.g. a Torch7 file against PyTorch)."),
) -> None:
    """Compare two runs case by case: ratio of medians B/A with a 95% interval, a verdict."""
    from bench import compare as cmp
    from bench.history import read_any
    from bench.report import fmt_ms
    from bench.results import ResultsError

    from . import tables

    if threshold < 0 or noise_floor < 0:
        raise ConvertError("--threshold and --noise-floor are percentages >= 0")
    try:
        doc_a, doc_b = read_any(a), read_any(b)
        c = cmp.compare(doc_a, doc_b, noise_floor / 100, names=(str(a), str(b)), any_runtime=any_runtime)
    except ResultsError as e:
        raise ConvertError(str(e)) from None
    warn = lambda msg: tell(err, "warning", "yellow", msg)
    if not ignore_env:
        for d in cmp.env_differences(doc_a["env"], doc_b["env"]):
            warn(f"environments differ: {d}")
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            warn(f"{len(keys)} case(s) only in {side}, not compared (e.g. {cmp.label(keys[0])})")
    for s in c.not_timed:
        warn(f"not compared: {s}")
    table = Table("model", "runtime", "device", "prec", "batch", "mode", "part", "A ms", "B ms",
                  "B/A [95% CI]", "floor", "verdict", title="times per call: median ± IQR")
    for ln in c.lines:
        style = {"slower": "red", "faster": "green"}.get(ln.verdict, "")
        case = (printable(str(x), 60) for x in ln.case)  # model names are the user's text
        ms = lambda m, q: fmt_ms({"median_ms": m, "iqr_ms": q})  # noqa: E731
        table.add_row(*case, ln.part, ln.side("A", ms), ln.side("B", ms), cmp.fmt_ratio(ln),
                      f"{ln.floor * 100:.1f}%", Text(ln.verdict, style=style))
    out.print(f"A: {a}\nB: {b}", highlight=False)
    out.print(tables.fit(table, out.width, lambda: tables.compact_compare(c.lines, cmp.fmt_ratio)))
    out.print(cmp.summary(c), highlight=False)
    bad = c.regressions(threshold)
    if bad:
        tell(err, "regression", "red", f"{len(bad)} timing(s) significantly slower by more than {threshold:g}%: "
             + "; ".join(f"{cmp.label(ln.case)} {ln.part} x{ln.ratio:.3f}" for ln in bad))
        raise typer.Exit(1)


def run() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    run()
