"""One benchmark case: load, time and verify a runtime of ``convert.runtimes``. Run in a fresh
process by default (``isolated``, through ``convert.isolate``) so that allocator state, cuDNN
autotuning and compiled graphs never leak between cases; a crash, a timeout or an out-of-memory
kill is an ``error`` row."""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

import numpy as np

from convert.isolate import IsolatedError, call_json, peak_rss_bytes
from convert.runtimes import RUNTIMES, TOLERANCE, CannotRun

from .cases import step_gflops
from .env import load_record, load_snapshot
from .inputs import load_batches
from .results import KEY
from .stats import summarize
from .timing import Policy, measure, runtime


def make_inputs(shapes: dict[str, list[int]], seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """The seeded inputs every runtime gets (rotated to avoid cache effects)."""
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(count)]


def make_grads(shapes: list[list[int]], seed: int, count: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed + 7919)
    return [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(count)]


def base_row(case: dict[str, Any]) -> dict[str, Any]:
    row = {k: case[k] for k in KEY}
    row.update(source_format=case.get("source_format"), threads={"count": case["threads"]},
               inputs=case.get("inputs") or f"random seed {case['seed']}",
               input_shapes=case["input_shapes"], forward=None, backward=None)
    if case.get("concurrency", 1) > 1:  # throughput mode: a sample times this many requests at once
        row["concurrency"] = case["concurrency"]
    return row


# OpenMP threads sleep when idle instead of spinning (libgomp spins ~3 ms by default): on a busy
# machine a spinning team waits for a descheduled member and steals the core it needs. Measured on
# the 2-core VM under load: torch ResNet-18 854 ms with the default vs 78 ms passive, LeNet p90 56 ms
# vs 4 ms (idle: no loss). libgomp reads it when torch loads: it is in each worker's environment.
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}

# malloc'd memory on transparent huge pages (glibc >= 2.35 madvises its arenas and large chunks;
# ignored by an older glibc, and where the kernel's THP mode is "never"). With 4 KiB pages two
# processes of the same runtime on the same model ran steadily apart: AlexNet on this VM, ONNX
# Runtime and OpenCV 1-2% slower in the process started first, OpenVINO up to 5% either way
# (page placement: TLB reach and cache-set conflicts on a 234 MB weight stream). With huge pages,
# within about 0.5%. Every runtime's worker gets it, so none is favoured.
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def set_threads(n: int) -> None:
    """The same thread count for every runtime: torch, and the env vars OpenMP/MKL read."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch

    torch.set_num_threads(n)
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 off unless asked (not offered yet)
    torch.backends.cudnn.allow_tf32 = False


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Load, verify and time one case in this process; returns its results row."""
    started = time.perf_counter()
    opened = open_case(case)
    if isinstance(opened, str):
        return {**base_row(case), "status": "skipped", "reason": opened}
    rt, phases, inputs, load_s = opened
    try:
        timing = measure(phases, rt.sync, Policy(**case["policy"]))
    except CannotRun as e:
        return {**base_row(case), "status": "skipped", "reason": str(e)}
    return finish_row(case, rt, inputs[0], timing, load_s, started)


def open_case(case: dict[str, Any]) -> tuple[Any, list[Any], list[dict[str, np.ndarray]], float] | str:
    """Set the threads, load the runtime and give it its inputs: (runtime, phases, inputs, load
    seconds), or the reason it cannot run (a skipped row)."""
    if case.get("plugin"):  # a module registering extra runtimes (tests use fake ones)
        importlib.import_module(case["plugin"])
    case["_load_start"] = load_snapshot()  # taken back by finish_row (this dict goes with the case)
    set_threads(case["threads"])
    rt = runtime(RUNTIMES[case["runtime"]], case.get("concurrency", 1))
    reason = rt.skip_reason(case)
    if reason:
        return reason
    t0 = time.perf_counter()
    try:
        rt.load(case)
        load_s = time.perf_counter() - t0
        n = case.get("n_inputs", 3)
        inputs = (load_batches(case["input_data"], next(iter(case["input_shapes"]))) if case.get("input_data")
                  else make_inputs(case["input_shapes"], case["seed"], n))
        grads = make_grads(case["output_shapes"], case["seed"], n) if case["mode"] == "training" else None
        rt.set_inputs(inputs, grads)
    except CannotRun as e:
        return str(e)
    return rt, [rt.forward] + ([rt.backward] if case["mode"] == "training" else []), inputs, load_s


def finish_row(case: dict[str, Any], rt: Any, x: dict[str, np.ndarray], timing: Any, load_s: float,
               started: float) -> dict[str, Any]:
    """The results row of a timed case: verification on ``x`` (after the timing: it replaces the
    runtime's inputs), the statistics and figures."""
    row = base_row(case)
    end = load_snapshot()
    load = load_record(case.pop("_load_start", None) or end, end, case["threads"])
    row.update(_verification(case, rt, x))
    row.update(_figures(case, timing, load_s, rt))
    row.update(threads=thread_settings(case["threads"], rt), load=load, quiet=load["quiet"])
    if not load["quiet"]:
        row["quiet_reason"] = "; ".join(load["reasons"])
    row["seconds"] = round(time.perf_counter() - started, 3)
    return row


def _verification(case: dict[str, Any], rt: Any, x: dict[str, np.ndarray]) -> dict[str, Any]:
    """This runtime+precision against the float64 reference on the first input."""
    ref_path = case.get("reference")
    if not ref_path:
        return {"status": "unverified", "reason": "no reference outputs for this case",
                "verification": None}
    outs = rt.infer(x)
    tol = TOLERANCE[case["precision"]]
    with np.load(ref_path) as z:
        refs = [z[f"o{i}"] for i in range(len(z.files))]
    errs = []
    for ref, out in zip(refs, outs):
        k = ref.shape[0]  # the reference covers the first k samples
        out = np.asarray(out, np.float64)[:k].reshape(ref.shape)
        errs.append(float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) or 1.0)))
    err = max(errs) if errs else float("inf")
    ok = bool(np.isfinite(err) and err <= tol)
    v = {"verification": {"max_rel": err if np.isfinite(err) else None, "tolerance": tol, "ok": ok}}
    if ok:
        return {"status": "ok", **v}
    return {"status": "unverified", "reason": f"output differs from the float64 reference by "
                                              f"{err:.2g} (tolerance {tol:g})", **v}


def _figures(case: dict[str, Any], t: Any, load_s: float, rt: Any) -> dict[str, Any]:
    fwd = summarize(t.samples_ms[0])
    bwd = summarize(t.samples_ms[1]) if len(t.samples_ms) > 1 else None
    total_ms = fwd["median_ms"] + (bwd["median_ms"] if bwd else 0.0)
    gflops = case.get("gflops_per_image")
    images = case["batch"] * case.get("concurrency", 1)  # per timed step: each request in flight a batch
    flops = step_gflops(gflops or 0, case.get("backward_gflops_per_image"), bwd is not None) * images
    achieved = flops / total_ms if gflops else None  # GFLOP per ms = TFLOP/s
    peak = near = case.get("gemm_peak_tflops")
    if achieved and peak:  # the peak again, next to the case, under the load the case saw
        near = gemm_next_to_case(case)
        peak = near or peak
    mem = {"host_peak_rss_bytes": peak_rss_bytes(), **rt.memory()}
    return {"forward": fwd, "backward": bwd,
            "one_time": {"load_s": round(load_s, 4), "first_iter_ms": [round(x, 3) for x in t.first_ms],
                         "warmup_iters": t.warmup_iters, "warmup_s": round(t.warmup_s, 3),
                         "steady": t.steady, "stable": t.stable},
            "images_per_s": images / total_ms * 1000.0,
            "gflops_per_image": gflops, "achieved_tflops": achieved,
            "pct_of_peak": 100.0 * achieved / peak if achieved and peak else None,
            "gemm_peak_tflops": {"run": case.get("gemm_peak_tflops"), "next_to_case": near} if peak else None,
            "memory": mem, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def thread_settings(n: int, rt: Any) -> dict[str, Any]:
    """What decides how this case's runtime used the CPU: the count asked for, the OpenMP/MKL
    environment the process started with, torch's pools, and the runtime's own settings."""
    import torch

    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                      "GLIBC_TUNABLES") if k in os.environ}
    return {"count": n, "env": env, "torch_intra_op": torch.get_num_threads(),
            "torch_inter_op": torch.get_num_interop_threads(), "runtime": rt.settings()}


def gemm_next_to_case(case: dict[str, Any]) -> float | None:
    """TFLOP/s of the run's GEMM measured again in this process right after the case (5 calls), so
    that "% of peak" compares two figures taken under the same load."""
    n = 1024 if case["device"] == "cpu" else 8192
    g = RUNTIMES["gemm-peak"]()
    try:
        g.load({**case, "gemm_n": n})
        t = measure([g.forward], g.sync, Policy(fixed=5, dry=1))
    except Exception:  # e.g. out of memory next to a large model: the run's peak stands
        return None
    return 2 * n**3 / 1e9 / float(np.median(t.samples_ms[0]))


def isolated(case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run a case in a fresh Python process; failures become error rows."""
    started = time.perf_counter()
    try:
        return call_json("bench.worker:run_case_row", timeout_s, case_env(case), kind="case", case=case)
    except IsolatedError as e:
        return _error(case, str(e), started)


def case_env(case: dict[str, Any]) -> dict[str, str]:
    """What a case's worker process gets added to its environment (isolated and interleaved alike)."""
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb=")]
    return {"OMP_NUM_THREADS": str(case["threads"]), "MKL_NUM_THREADS": str(case["threads"]), **PASSIVE,
            "GLIBC_TUNABLES": ":".join(tunables + [HUGE_PAGES["GLIBC_TUNABLES"]])}  # (the user's others kept)


def _error(case: dict[str, Any], reason: str, started: float) -> dict[str, Any]:
    return {**base_row(case), "status": "error", "reason": reason,
            "seconds": round(time.perf_counter() - started, 3)}


def run_case_row(case: dict[str, Any]) -> dict[str, Any]:
    """``run_case`` in a worker process: an exception is an error row with the line that says why."""
    try:
        return run_case(case)
    except Exception as e:
        return error_row(case, e)


def error_row(case: dict[str, Any], e: Exception) -> dict[str, Any]:
    """The row of a case that raised: the exception's type and last line."""
    msg = str(e).strip().splitlines()
    return {**base_row(case), "status": "error",
            "reason": f"{type(e).__name__}: {msg[-1][:300] if msg else ''}".strip()}
