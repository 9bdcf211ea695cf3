"""Harness check: ratios measured interleaved hold on a noisy machine.

    python -m zoo.checks harness

Absolute times on a shared machine do not repeat (the same hand loop moved by up to 48% between
fresh processes here); ratios between runtimes timed in turns should. Two checks, on this CPU at
batch 1 with zoo's thread count, results in outputs/checks/harness.json:

* A/A: one runtime (ONNX Runtime) entered twice in one interleaved group, on AlexNet and on
  ResNet-18: the ratio of the two must be 1 within its 95% interval, and the interval narrower
  than +-5%. Both entrants must be timed (else FAIL, with both rows' status and reason).
* repeat: two separate ``zoo bench`` invocations (fresh processes, the second after the first)
  time AlexNet on ONNX Runtime, OpenCV and PyTorch interleaved; each runtime's ratio to OpenCV must
  agree between the two within 5%.

Both run at the rounds ``zoo bench`` uses by default (bench.interleave.ROUNDS; the sweeps are
plain ``zoo bench`` invocations without --rounds), so the check certifies what users get.

The machine's load average is recorded before and after; a busy machine widens the intervals (it
is the condition this mode is for), the final numbers belong to a quiet one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .checks_common import save as _save

AA_MODELS = ("alexnet", "resnet18")
REPEAT_MODEL = "alexnet"
REPEAT_RUNTIMES = ("onnxruntime", "opencv", "torch")
TOLERANCE = 0.05  # the A/A interval within 1 +- 5%; the repeated ratios within 5% of each other


def aa_check(model: str, rounds: int, window_s: float, threads: int) -> dict[str, Any]:
    """One runtime twice in one group: the ratio must be 1 within a tight interval."""
    from bench.interleave import run_group

    from . import benchmark

    (case,) = benchmark.build([model], runtimes=["onnxruntime"], precisions=["fp32"], layouts=["nchw"],
                              batches=[1], threads=threads)
    a, b = run_group([case.to_dict()] * 2, labels=["onnxruntime#1", "onnxruntime#2"], rounds=rounds,
                     window_s=window_s)
    failed = aa_failure(a, b, "onnxruntime#1")
    if failed:
        return {"model": model, "runtime": "onnxruntime", "batch": 1, "rounds": rounds, "window_s": window_s,
                "passed": False, "failure": failed}
    i = b["interleave"]
    lo, hi = i["ratio_ci"]
    return {"model": model, "runtime": "onnxruntime", "batch": 1, "rounds": rounds, "window_s": window_s,
            "median_ms": [a["forward"]["median_ms"], b["forward"]["median_ms"]], "ratio": i["ratio"],
            "ratio_ci": [lo, hi], "round_ratios": i["round_ratios"], "contains_1": lo <= 1.0 <= hi,
            "within_5pct": 1 - TOLERANCE < lo and hi < 1 + TOLERANCE,
            "passed": lo <= 1.0 <= hi and 1 - TOLERANCE < lo and hi < 1 + TOLERANCE}


def aa_failure(a: dict[str, Any], b: dict[str, Any], first: str) -> str | None:
    """Why an A/A pair cannot be judged (None when it can): both rows must be timed in turns, the
    second against the first."""
    ok = all(r.get("status") in ("ok", "unverified") and r.get("interleave") for r in (a, b))
    if ok and (b.get("interleave") or {}).get("baseline") == first:
        return None
    return "; ".join(f"entrant {k}: {r.get('status')}: {r.get('reason', '')}"
                     + ("" if r.get("interleave") else " (no interleaved timing)")
                     for k, r in ((1, a), (2, b)))


def sweep_ratios(out: Path) -> dict[str, Any]:
    """One ``zoo bench`` invocation (a fresh process, the default rounds): each runtime's interleaved
    ratio to OpenCV."""
    args = [sys.executable, "-m", "zoo.cli", "bench", REPEAT_MODEL, "--precision", "fp32", "--keep", "--out", str(out)]
    for rt in REPEAT_RUNTIMES:
        args += ["--runtime", rt]
    p = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"zoo bench failed (exit {p.returncode}): {p.stderr.strip()[-500:]}")
    rows = json.loads(out.read_text())["rows"]
    got = {r["runtime"]: {"ratio": r["interleave"]["ratio"], "ratio_ci": r["interleave"]["ratio_ci"],
                          "median_ms": r["forward"]["median_ms"], "status": r["status"]}
           for r in rows if r.get("interleave")}
    if set(got) != set(REPEAT_RUNTIMES):
        raise SystemExit(f"zoo bench timed {sorted(got)} interleaved, not {list(REPEAT_RUNTIMES)}: "
                         + "; ".join(f"{r['runtime']}: {r['status']} {r.get('reason', '')}" for r in rows))
    return got


def repeat_check(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zoo-harness-") as tmp:
        runs = [sweep_ratios(Path(tmp) / f"run{k}.json") for k in (1, 2)]
    moves = {rt: runs[1][rt]["ratio"] / runs[0][rt]["ratio"] - 1 for rt in REPEAT_RUNTIMES}
    # the absolute medians of the same runtime across the two runs, for contrast
    drift = {rt: runs[1][rt]["median_ms"] / runs[0][rt]["median_ms"] - 1 for rt in REPEAT_RUNTIMES}
    from bench.interleave import WINDOW_S

    return {"model": REPEAT_MODEL, "batch": 1, "rounds": rounds, "window_s": WINDOW_S, "baseline": "opencv",
            "runs": runs, "ratio_change": moves, "median_change": drift,
            "passed": all(abs(m) <= TOLERANCE for m in moves.values())}


def harness(window_s: float | None = None) -> dict[str, Any]:
    from bench.env import physical_cores
    from bench.interleave import ROUNDS, WINDOW_S

    rounds, window_s = ROUNDS, window_s or WINDOW_S  # what `zoo bench` uses by default

    threads, started, load0 = physical_cores(), time.perf_counter(), os.getloadavg()
    aa = []
    for m in AA_MODELS:
        aa.append(aa_check(m, rounds, window_s, threads))
        r = aa[-1]
        if r.get("failure"):
            print(f"A/A {m:9s} onnxruntime twice: not timed ({r['failure']}) -> FAIL", flush=True)
            continue
        print(f"A/A {m:9s} onnxruntime twice: ratio {r['ratio']:.4f} [{r['ratio_ci'][0]:.4f}, "
              f"{r['ratio_ci'][1]:.4f}] -> {'pass' if r['passed'] else 'FAIL'}", flush=True)
    rep = repeat_check(rounds)
    for rt in REPEAT_RUNTIMES:
        a, b = (run[rt] for run in rep["runs"])
        print(f"repeat {REPEAT_MODEL} {rt:12s} ratio to opencv {a['ratio']:.4f} then {b['ratio']:.4f} "
              f"({rep['ratio_change'][rt]:+.1%}); its median {a['median_ms']:.2f} then {b['median_ms']:.2f} ms "
              f"({rep['median_change'][rt]:+.1%})", flush=True)
    print(f"repeat: ratios within {TOLERANCE:.0%} -> {'pass' if rep['passed'] else 'FAIL'}")
    result = {"threads": threads, "rounds": rounds, "window_s": window_s, "tolerance": TOLERANCE,
              "load_average_before": load0, "load_average_after": os.getloadavg(), "cores": os.cpu_count(),
              "seconds": round(time.perf_counter() - started), "aa": aa, "repeat": rep,
              "passed": all(r["passed"] for r in aa) and rep["passed"]}
    print(f"harness: {'pass' if result['passed'] else 'FAIL'} (load average {load0[0]:.1f} before, "
          f"{result['load_average_after'][0]:.1f} after, {os.cpu_count()} cores)")
    _save("harness", result)
    return result
