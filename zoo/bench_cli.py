"""``zoo bench``: checks the request, builds the cases, runs the sweep with a progress bar, prints
the summary. (The command itself is declared in cli.py.)"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from bench import env as benv
from bench import interleave as interleaved
from bench import results, sweep
from bench.cases import BF16_CPU_RUNTIMES, PROTOCOLS, default_precisions, without_default_bf16
from convert.errors import ConvertError
from convert.naming import printable

from . import benchmark, tables

MODES = ("inference", "training", "both")
PRECISIONS = ("fp32", "fp16", "bf16")
LAYOUTS = ("nchw", "channels_last")


def check_request(*, gpu: int | None, runtimes: list[str], precisions: list[str], layouts: list[str],
                  batches: list[int], mode: str, protocol: str, threads: int | None) -> str:
    """Validate the options; returns the device string. Bad input -> ConvertError (exit 2)."""
    bad = [r for r in runtimes if r not in benchmark.BENCH_RUNTIMES]
    if bad:
        raise ConvertError(f"unknown runtime {bad[0]!r} (choose from {', '.join(benchmark.BENCH_RUNTIMES)})")
    for value, allowed, what in ((precisions, PRECISIONS, "precision"), (layouts, LAYOUTS, "layout")):
        wrong = [v for v in value if v not in allowed]
        if wrong:
            raise ConvertError(f"unknown {what} {wrong[0]!r} (choose from {', '.join(allowed)})")
    if mode and mode not in MODES:
        raise ConvertError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    if protocol not in PROTOCOLS:
        raise ConvertError(f"unknown protocol {protocol!r} (choose from {', '.join(PROTOCOLS)})")
    if any(b <= 0 for b in batches):
        raise ConvertError(f"--batch must be positive, got {min(batches)}")
    if threads is not None and threads <= 0:
        raise ConvertError(f"--threads must be positive, got {threads}")
    if gpu is None:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        fix = ("; for a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu128 "
               "(cu126, cu129...: the CUDA your driver supports)") if torch.version.cuda is None else ""
        raise ConvertError(f"--gpu {gpu}: CUDA is not available (torch {torch.__version__} is {build}){fix}")
    if not 0 <= gpu < torch.cuda.device_count():
        raise ConvertError(f"--gpu {gpu}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return f"cuda:{gpu}"


def run_bench(out: Console, err: Console, *, models: list[str], all_: bool, gpu: int | None,
              runtimes: list[str], precisions: list[str], layouts: list[str], batches: list[int],
              mode: str, protocol: str, layers: bool, out_file: Path | None, resume: bool,
              dry_run: bool, budget: float | None, quick: bool, threads: int | None, isolate: bool,
              timeout: float, seed: int, keep: bool = False, cluster: str | None = None,
              accelerators: list[str] | None = None, all_accelerators: bool = False, interleave: bool = True,
              baseline: str | None = None, rounds: int | None = None, input_data: Path | None = None,
              concurrency: int = 1) -> None:
    device = check_request(gpu=None if cluster else gpu, runtimes=runtimes, precisions=precisions, layouts=layouts,
                           batches=batches, mode=mode, protocol=protocol, threads=threads)
    if layers and protocol == "zoo":
        protocol = "convnet-benchmarks"  # the layer-wise set is that project's
    # what a protocol fixes is refused when asked for, rather than silently replaced
    what = "--layers" if layers else f"--protocol {protocol}"
    if batches and (layers or PROTOCOLS[protocol].batch):
        raise ConvertError(f"--batch does not apply with {what}: it fixes its own batch sizes")
    fixed_mode = PROTOCOLS[protocol].mode
    if mode and fixed_mode and mode != fixed_mode:
        raise ConvertError(f"--mode {mode} does not apply with {what}: it times {fixed_mode}")
    mode = mode or "inference"
    if cluster and input_data:
        raise ConvertError("--input-data is not available with --cluster (the nodes have their own files)")
    if cluster and (concurrency != 1 or rounds is not None or baseline is not None):
        given = [f for f, v in (("--concurrency", concurrency != 1), ("--rounds", rounds is not None),
                                ("--baseline", baseline is not None)) if v]
        raise ConvertError(f"{', '.join(given)} not available with --cluster (each case is timed alone in a "
                           "fresh process on its node, the --no-interleave method)")
    if cluster and not dry_run:  # CUDA and the threads (default: each node's cores) are the nodes' own
        from .parallel import bench_cluster

        device = "cpu" if gpu is None else f"cuda:{gpu}"
        kw = dict(models=models, all_=all_, protocol=protocol, layers=layers, device=device, mode=mode,
                  runtimes=runtimes or benchmark.default_runtimes(device, quick), seed=seed, quick=quick,
                  precisions=precisions or default_precisions(device, protocol, quick, here=False), layouts=layouts or ["nchw"],
                  batches=batches or [1])
        return bench_cluster(out, err, address=cluster, build_kw=kw, threads=threads, gpu=gpu, device=device,
                             accelerators=accelerators or [], all_accelerators=all_accelerators,
                             out_file=out_file, resume=resume, budget=budget, isolate=isolate, timeout=timeout,
                             one_line=_one_line, table=lambda rows: summary_table(rows, out.width))
    if (accelerators or all_accelerators) and not cluster:
        raise ConvertError("--accelerator and --all-accelerators apply with --cluster")
    threads = threads or benv.physical_cores()
    left_out = {} if runtimes or quick else benchmark.left_out(device)
    runtimes = runtimes or benchmark.default_runtimes(device, quick)
    rounds = _check_interleave(runtimes, baseline, rounds)
    if concurrency < 1:
        raise ConvertError(f"--concurrency must be at least 1, got {concurrency}")
    asked_rounds, rounds = rounds, rounds or (interleaved.QUICK_ROUNDS if quick else interleaved.ROUNDS)
    asked_precisions, precisions = precisions, precisions or default_precisions(device, protocol, quick)
    recorder = _resumed(out_file) if resume else None
    if not dry_run and not resume:
        _check_new(out_file)
    tty = out.is_terminal and err.is_terminal  # else a log (CI, nohup, a pipe): plain lines instead
    lines = _Lines(out)
    with Progress(_NAME, BarColumn(), _Count(), TimeElapsedColumn(), console=err, transient=True,
                  disable=not tty) as bar:
        task = bar.add_task("preparing models", total=None)

        def prep(i: int, n: int, name: str) -> None:
            bar.update(task, total=n, completed=i, description=printable(f"planning {name}", 100))
            if not tty:
                lines.say(f"planning {i + 1}/{n}: {name}")

        plan = benchmark.plan(models, all_=all_, protocol=protocol, layers=layers, device=device,
                              runtimes=runtimes, precisions=precisions, layouts=layouts or ["nchw"],
                              batches=batches or [1], mode=mode, threads=threads, seed=seed,
                              quick=quick, keep=keep, progress=prep, input_data=input_data)
    cases = [replace(c, concurrency=concurrency) for c in plan.cases] if concurrency > 1 else plan.cases
    per_runtime, no_bf16 = len(cases) // max(len(runtimes), 1), 0
    if not asked_precisions and "bf16" in precisions and device == "cpu":  # for the runtimes that compute it
        per_runtime //= len(precisions)  # the left-out runtimes' lines count one precision
        cases, no_bf16 = without_default_bf16(cases)
        if no_bf16:
            others = ", ".join(sorted(set(runtimes) - set(BF16_CPU_RUNTIMES)))
            left_out = {**left_out, "bf16": f"{others}: no bf16 kernels on a CPU (bf16 is timed where "
                                            "this CPU computes it: --precision bf16 plans them too)"}
    if budget:
        cases = sweep.fit_budget(cases, budget)
        rounds = asked_rounds or interleaved.fit_rounds(rounds, budget, cases)
    if dry_run:
        _dry_run(out, cases, device, threads, rounds if interleave and isolate else 0)
        _not_planned(out, left_out, per_runtime, no_bf16)
        return
    env = benv.capture(threads, gpu)
    path = out_file or benchmark.default_results_path(env)
    with _one_line():
        recorder = recorder or results.Recorder(path, env)
        peaks = _peaks(err, recorder, device, precisions, threads, isolate)
    for c in cases:
        c.gemm_peak_tflops = peaks.get(c.precision)
    with Progress(_NAME, BarColumn(), _Count(), TextColumn("ETA {task.fields[eta]}"), TimeElapsedColumn(),
                  console=err, disable=not tty) as bar:
        task = bar.add_task("timing", total=len(cases), eta="?")

        def ready(case: Any) -> Any:  # a log hears of each model before its conversion (minutes)
            if not tty:
                lines.starting(case)
            return plan.live(case)

        def progress(i: int, n: int, case: Any, row: Any, eta: float) -> None:
            bar.update(task, total=n, completed=i, description=printable(_label(case), 100),
                       eta="?" if math.isnan(eta) else f"{eta:.0f}s")
            if not tty and row is not None:
                lines.finished(i, n, case, row, eta)

        with _one_line():
            try:  # model by model: each converted before its first case, its files removed after the last
                if interleave and isolate:
                    rows = interleaved.run(cases, recorder, rounds=rounds,
                                           baseline=baseline, timeout_s=timeout, progress=progress,
                                           live=ready)
                else:
                    rows = sweep.run(cases, recorder, isolate=isolate, timeout_s=timeout, progress=progress,
                                     live=ready)
            finally:
                plan.release()
    out.print(summary_table(rows, out.width))
    for line in interleaved.describe(rows):
        out.print(printable(line, 400), highlight=False)
    _not_planned(out, left_out, per_runtime, no_bf16)
    out.print(f"results: {benchmark.relative(path)}", highlight=False)


def _check_interleave(runtimes: list[str], baseline: str | None, rounds: int | None) -> int | None:
    """The options checked (exit 2 on a bad one); --rounds rounded up (interleave.even_rounds)."""
    if baseline is not None and baseline not in runtimes:
        raise ConvertError(f"--baseline {baseline!r} is not one of the runtimes timed ({', '.join(runtimes)})")
    if rounds is not None and rounds < interleaved.MIN_ROUNDS:
        raise ConvertError(f"--rounds must be at least {interleaved.MIN_ROUNDS} (an interval over rounds "
                           f"needs them), got {rounds}")
    return None if rounds is None else interleaved.even_rounds(rounds)


def _not_planned(out: Console, left_out: dict[str, str], per_runtime: int, no_bf16: int = 0) -> None:
    """One line per default runtime left out here (every runtime would get the same cases), and one
    for the default bf16 cases of the runtimes without bf16 on a CPU."""
    for rt, why in left_out.items():
        n, what = (no_bf16, "") if rt == "bf16" else (per_runtime, f" {rt}")
        out.print(f"{why}: {n}{what} cases not planned", highlight=False)


_NAME = TextColumn("{task.description}", markup=False)  # model names are the user's text


class _Count(ProgressColumn):
    """'3/13', or nothing while the total is not known yet (not '0/None')."""

    def render(self, task: Task) -> Text:
        return Text("" if task.total is None else f"{task.completed:g}/{task.total:g}")


def _label(case: Any) -> str:
    return f"{case.model} {case.runtime} {case.device} {case.precision} b{case.batch} {case.mode}"


class _Lines:
    """Progress for a log (stdout not a terminal: CI, nohup, a pipe), where a live bar shows nothing:
    one plain line per finished case (and per model started), with the elapsed time and the estimate
    of what is left."""

    def __init__(self, out: Console) -> None:
        self.out, self.t0, self.model = out, time.perf_counter(), None

    def say(self, text: str, left: float = math.nan) -> None:
        tail = f"elapsed {_dur(time.perf_counter() - self.t0)}" + ("" if math.isnan(left) else
                                                                   f", about {_dur(left)} left")
        self.out.print(f"{printable(text, 300)} ({tail})", soft_wrap=True, highlight=False)
        self.out.file.flush()

    def starting(self, case: Any) -> None:
        """Before a case's model is made ready: its conversion may take minutes."""
        if case.model != self.model:
            self.model = case.model
            self.say(f"{case.model}: converting and verifying (unless done before)")

    def finished(self, i: int, n: int, case: Any, row: dict[str, Any], eta: float) -> None:
        if row["status"] == "ok":
            parts = [f"{p} {tables.short_ms(row[p]['median_ms'])}" for p in ("forward", "backward") if row.get(p)]
            outcome = ", ".join(parts) + " (median), ok"
        else:
            outcome = f"{row['status']}: {row.get('reason', '')}"
        self.say(f"[{i}/{n}] {_label(case)}: {printable(outcome, 160)}", eta)


def _dur(s: float) -> str:
    """'42s', '3m05s', '1h02m'."""
    s = round(s)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


@contextmanager
def _one_line() -> Iterator[None]:
    """A results file that cannot be read or saved: one line, exit 2."""
    try:
        yield
    except results.ResultsError as e:
        raise ConvertError(str(e)) from None


def _resumed(out_file: Path | None) -> results.Recorder:
    if out_file is None:
        raise ConvertError("--resume needs --out FILE (the results file to continue)")
    if not os.path.lexists(out_file):
        raise ConvertError(f"{out_file}: no such results file to continue (drop --resume to start one)")
    with _one_line():
        results.check_writable(out_file)
        return results.Recorder(out_file, {}, resume=True)


def _check_new(out_file: Path | None) -> None:
    """Before any work: an existing file is never taken over, and the folder must be writable."""
    if out_file is not None and os.path.lexists(out_file):
        raise ConvertError(f"{out_file} exists: continue it with --resume, or choose another --out file")
    with _one_line():
        results.check_writable(out_file or benchmark.RESULTS / "results.json")


def _peaks(err: Console, recorder: results.Recorder, device: str, precisions: list[str], threads: int,
           isolate: bool) -> dict[str, float | None]:
    have = recorder.doc["env"].get("gemm_peak", {}).get(device, {})
    for p in precisions:
        if p not in have:
            err.print(f"measuring the {device} GEMM peak ({p})", highlight=False)
            have[p] = sweep.gemm_peak(device, p, threads, isolate)
    recorder.set_env("gemm_peak", {**recorder.doc["env"].get("gemm_peak", {}), device: have})  # other devices kept
    return {p: v.get("tflops") for p, v in have.items()}


def _dry_run(out: Console, cases: list[Any], device: str, threads: int, rounds: int = 0) -> None:
    """The cases and an estimate from this device's fp32 GEMM rate, measured now in this process
    (a second or two), or a rough guess where that fails."""
    rate, source = (0.05 if device == "cpu" else 50.0), "guessed"  # TFLOP/s
    if any(not c.status for c in cases):
        try:
            measured = sweep.gemm_peak(device, "fp32", threads, isolate=False).get("tflops")
        except RuntimeError:  # e.g. the GPU out of memory: the estimate falls back on the guess
            measured = None
        rate, source = (measured, "measured") if measured else (rate, source)
    table = Table("model", "runtime", "precision", "layout", "batch", "mode", "protocol", "est. s")
    skips = {id(c): _dry_skip(c) for c in cases}
    turns = interleaved.in_turns([c for c in cases if not skips[id(c)]]) if rounds else set()
    total = 0.0
    for c in cases:
        est = 0.0 if skips[id(c)] else sweep.estimate(c, rate, rounds if id(c) in turns else 0, interleaved.WINDOW_S)
        total += est
        table.add_row(printable(c.model, 60), c.runtime, c.precision, c.layout, str(c.batch), c.mode, c.protocol,
                      printable(f"{c.status or 'skipped'}: {skips[id(c)]}", 80) if skips[id(c)] else f"{est:.0f}")
    out.print(table)
    n = sum(not s for s in skips.values())
    out.print(f"{n} cases to time{f' ({len(cases) - n} more to be skipped)' if n < len(cases) else ''}"
              f"{f', {len(turns)} of them in turns ({rounds} rounds)' if turns else ''}, about {total / 60:.1f} "
              f"minutes (rough: {sweep.EFFICIENCY:.0%} of the {source} fp32 GEMM rate, {rate:.3g} TFLOP/s, plus "
              f"{sweep.STARTUP_S:.0f} s start-up per case and interleaved session)", highlight=False)


def _dry_skip(case: Any) -> str | None:
    """Why a planned case will not be timed, decided as the sweep will; the original file OpenCV
    reads is known once the model is converted: a model has one unless its protocol strips it."""
    if not case.status and case.original is None and not PROTOCOLS[case.protocol].strip:
        case = replace(case, original={"framework": case.source_format})
    row = sweep.skip_row(case)
    return row["reason"] if row else None


def _ms(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "-"
    med, iqr = stats["median_ms"], stats["iqr_ms"]
    digits = max(0, min(3, -int(math.floor(math.log10(iqr))) + 1)) if iqr > 0 else 2
    return f"{med:.{digits}f} ± {iqr:.{digits}f}"


def summary_table(rows: list[dict[str, Any]], width: int | None = None) -> RenderableType:
    """The full table; with ``width``, a compact one where the full one would not fit (zoo/tables.py)."""
    table = Table("model", "runtime", "device", "prec", "batch", "mode", "status", "forward ms",
                  "backward ms", "img/s", "max rel err", title="median ± IQR")
    for r in rows:
        v = r.get("verification") or {}
        table.add_row(printable(r["model"], 60), r["runtime"], r["device"], r["precision"], str(r["batch"]), r["mode"],
                      r["status"] if r["status"] == "ok" else printable(f"{r['status']}: {r.get('reason', '')}", 60),
                      _ms(r.get("forward")), _ms(r.get("backward")),
                      f"{r['images_per_s']:.1f}" if r.get("images_per_s") else "-",
                      f"{v['max_rel']:.1e}" if v.get("max_rel") is not None else "-")
    return table if width is None else tables.fit(table, width, lambda: tables.compact_summary(rows))
