"""One benchmark case, run in a fresh process by default (``python -m bench.worker CASE OUT``) so
that allocator state, cuDNN autotuning and compiled graphs never leak between cases. ``isolated``
turns a crash, a timeout or an out-of-memory kill into an ``error`` row."""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .cases import step_gflops
from .results import KEY
from .stats import summarize
from .timing import Policy, measure

PARENT_ENV = "ZOO_PARENT_PID"  # the pid a worker dies with (as convert.isolate's children)
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 8e-2}  # the converter's table (convert/verify.py)


def make_inputs(shapes: dict[str, list[int]], seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """The seeded inputs every runtime gets (rotated to avoid cache effects)."""
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(count)]


def make_grads(shapes: list[list[int]], seed: int, count: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed + 7919)
    return [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(count)]


def base_row(case: dict[str, Any]) -> dict[str, Any]:
    row = {k: case[k] for k in KEY}
    row.update(source_format=case.get("source_format"), threads=case["threads"],
               input_shapes=case["input_shapes"], forward=None, backward=None)
    return row


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (VmHWM: ru_maxrss would include a parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def die_with_parent() -> None:
    """First thing in a worker: be killed when the sweep's process dies (Linux's parent-death signal),
    and exit now if it died before that took effect. A killed sweep leaves no worker timing on."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


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
    from .runtimes import RUNTIMES, CannotRun

    if case.get("plugin"):  # a module registering extra runtimes (tests use fake ones)
        importlib.import_module(case["plugin"])
    started = time.perf_counter()
    row = base_row(case)
    set_threads(case["threads"])
    rt = RUNTIMES[case["runtime"]]()
    reason = rt.skip_reason(case)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    t0 = time.perf_counter()
    try:
        rt.load(case)
        load_s = time.perf_counter() - t0
        n = case.get("n_inputs", 3)
        inputs = make_inputs(case["input_shapes"], case["seed"], n)
        grads = make_grads(case["output_shapes"], case["seed"], n) if case["mode"] == "training" else None
        rt.set_inputs(inputs, grads)
        phases = [rt.forward] + ([rt.backward] if case["mode"] == "training" else [])
        timing = measure(phases, rt.sync, Policy(**case["policy"]))
    except CannotRun as e:
        return {**row, "status": "skipped", "reason": str(e)}
    row.update(_verification(case, rt, inputs[0]))
    row.update(_figures(case, timing, load_s, rt))
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
    flops = step_gflops(gflops or 0, case.get("backward_gflops_per_image"), bwd is not None) * case["batch"]
    achieved = flops / total_ms if gflops else None  # GFLOP per ms = TFLOP/s
    peak = case.get("gemm_peak_tflops")
    mem = {"host_peak_rss_bytes": peak_rss_bytes(), **rt.memory()}
    return {"forward": fwd, "backward": bwd,
            "one_time": {"load_s": round(load_s, 4), "first_iter_ms": [round(x, 3) for x in t.first_ms],
                         "warmup_iters": t.warmup_iters, "warmup_s": round(t.warmup_s, 3),
                         "steady": t.steady, "stable": t.stable},
            "images_per_s": case["batch"] / total_ms * 1000.0,
            "gflops_per_image": gflops, "achieved_tflops": achieved,
            "pct_of_peak": 100.0 * achieved / peak if achieved and peak else None,
            "memory": mem, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def isolated(case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run a case in a fresh Python process; failures become error rows."""
    started = time.perf_counter()
    # named like convert.isolate's temporaries (zoo-KIND-HOST-PID-), which a later run removes when
    # this process is gone (bench does not import convert: the same three parts, spelled here)
    host = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:10]
    with tempfile.TemporaryDirectory(prefix=f"zoo-case-{host}-{os.getpid()}-") as tmp:
        cin, cout = Path(tmp) / "case.json", Path(tmp) / "row.json"
        cin.write_text(json.dumps(case))
        env = {**os.environ, "OMP_NUM_THREADS": str(case["threads"]),
               "MKL_NUM_THREADS": str(case["threads"]), PARENT_ENV: str(os.getpid())}
        try:
            p = subprocess.run([sys.executable, "-m", "bench.worker", str(cin), str(cout)], env=env,
                               capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return _error(case, f"timed out after {timeout_s:.0f} s", started)
        if cout.exists():
            return json.loads(cout.read_text())
        return _error(case, _death(p.returncode, p.stderr), started)


def _death(code: int, stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    if code in (-9, 137):
        return "killed (out of memory?)"
    if "out of memory" in stderr.lower():
        return f"out of memory: {last[:200]}"
    if code < 0:
        return f"crashed (signal {-code}) {last[:200]}".strip()
    return f"failed (exit code {code}): {last[:300]}"


def _error(case: dict[str, Any], reason: str, started: float) -> dict[str, Any]:
    return {**base_row(case), "status": "error", "reason": reason,
            "seconds": round(time.perf_counter() - started, 3)}


def main(argv: list[str]) -> None:
    case = json.loads(Path(argv[0]).read_text())
    try:
        row = run_case(case)
    except Exception as e:  # an error row, with the one line that says what went wrong
        msg = str(e).strip().splitlines()
        row = {**base_row(case), "status": "error",
               "reason": f"{type(e).__name__}: {msg[-1][:300] if msg else ''}".strip()}
    Path(argv[1]).write_text(json.dumps(row, allow_nan=False))


if __name__ == "__main__":
    die_with_parent()
    main(sys.argv[1:])
