"""A sweep: run cases one by one (each in a fresh worker process by default), append each row to
the results file, report progress. Also the GEMM peak and the dry-run duration estimate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .cases import Case, step_gflops
from .results import Recorder, key
from .timing import Policy, runtime
from .worker import base_row, isolated, run_case

Progress = Callable[[int, int, Case, dict[str, Any] | None, float], None]
STARTUP_S = 4.0  # a worker's interpreter, torch import and model load, roughly


def run(cases: list[Case], recorder: Recorder, isolate: bool = True, timeout_s: float = 900.0,
        progress: Progress | None = None, live: Callable[[Case], Case] | None = None) -> list[dict[str, Any]]:
    """Run every case not already in the results file; returns the new rows. ``live`` turns a planned
    case into one ready to run (its model converted) just before it runs."""
    todo = [c for c in cases if key(c.to_dict()) not in recorder.done]
    rows, started = [], time.perf_counter()
    for i, case in enumerate(todo):
        if progress:
            progress(i, len(todo), case, None, _eta(started, i, len(todo)))
        case = live(case) if live else case
        row = run_one(case, isolate, timeout_s)
        recorder.add(row)
        rows.append(row)
        if progress:
            progress(i + 1, len(todo), case, row, _eta(started, i + 1, len(todo)))
    return rows


def run_one(case: Case, isolate: bool = True, timeout_s: float = 900.0) -> dict[str, Any]:
    """The row of one case (also what a cluster node runs for each case, bench/cluster.py)."""
    row = skip_row(case)
    if row:  # decided here: no process to start for a combination that cannot run
        return row
    return isolated(case.to_dict(), timeout_s) if isolate else run_case(case.to_dict())


def skip_row(case: Case) -> dict[str, Any] | None:
    """The row of a case that cannot run (failed conversion, runtime unable), or None."""
    reason = case.reason if case.status else _skip(case)
    return {**base_row(case.to_dict()), "status": case.status or "skipped", "reason": reason} if reason else None


def _skip(case: Case) -> str | None:
    from convert.runtimes import RUNTIMES

    rt = RUNTIMES.get(case.runtime)
    return runtime(rt, case.concurrency).skip_reason(case.to_dict()) if rt else None


def _eta(started: float, done: int, total: int) -> float:
    if done == 0:
        return float("nan")
    return (time.perf_counter() - started) / done * (total - done)


def gemm_peak(device: str, precision: str, threads: int, isolate: bool = True) -> dict[str, Any]:
    """Achieved TFLOP/s of a square matrix multiply on the device, timed by the same loop."""
    n = 1024 if device == "cpu" else 8192
    case = Case(model=f"gemm-{n}", source_format="", artifact="", runtime="gemm-peak", device=device,
                precision=precision, layout="nchw", batch=1, mode="inference", protocol="zoo",
                threads=threads, input_shapes={}, output_shapes=[], gemm_n=n, n_inputs=1,
                policy=Policy(min_s=0.5, max_s=5.0, warmup_max_s=5.0).__dict__,
                gflops_per_image=2 * n**3 / 1e9)
    row = isolated(case.to_dict(), 600) if isolate else run_case(case.to_dict())
    if row.get("forward"):
        return {"n": n, "tflops": row["achieved_tflops"], "median_ms": row["forward"]["median_ms"]}
    return {"n": n, "tflops": None, "reason": row.get("reason")}


SESSIONS = 4  # interleaved on a CPU: each entrant's workers opened this many times (bench/interleave.py)
def sessions(cpu: bool, rounds: int) -> int:
    """Interleaved sessions of a group: SESSIONS on a CPU when each gets an even count of rounds,
    else one (a GPU worker's CUDA context and engines are not opened four times)."""
    return SESSIONS if cpu and rounds % (2 * SESSIONS) == 0 else 1


EFFICIENCY = 0.5  # of the GEMM rate, for estimates: the CPU runs measured 20-130% (batch 1 to 128)


def estimate(case: Case, device_tflops: float, rounds: int = 0, window_s: float = 0.0) -> float:
    """Seconds a case will take, roughly: startup plus warm-up and measurement at half the GEMM rate
    (interleaved, ``rounds``: per round one untimed call and a window of at least one call)."""
    p = Policy(**case.policy)
    gflops = step_gflops(case.gflops_per_image or 1.0, case.backward_gflops_per_image, case.mode == "training")
    per_iter = gflops * case.batch / max(device_tflops * 1e3 * EFFICIENCY, 1e-3)
    if p.fixed:  # the first call, the dry runs, then the samples of p.calls calls each
        return STARTUP_S + (1 + p.dry + p.fixed * p.calls) * per_iter
    warm = max(p.warmup_s, p.warmup_iters * per_iter)
    meas = min(max(p.min_s, p.min_iters * per_iter), p.max_s)
    starts = 1
    if rounds:
        meas = rounds * (max(window_s, per_iter) + per_iter)
        starts = sessions(case.device == "cpu", rounds)  # fresh workers each
    return starts * (STARTUP_S + warm) + meas + 2 * per_iter


def fit_budget(cases: list[Case], budget_s: float) -> list[Case]:
    """Scale every case's policy so that the sweep fits ``budget_s`` seconds."""
    active = [c for c in cases if not c.status]
    per_case = max(budget_s / max(len(active), 1) - STARTUP_S, 0.2)
    return [c if c.status else replace(c, policy=Policy(**c.policy).scaled(per_case).__dict__)
            for c in cases]
