"""Machine load per case (load average, steal, busy processes, the quiet flag), the thread settings
and environment recorded with a run, p50/p90/p99, and the report's warnings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bench import env as benv
from bench import report
from bench.cases import Case
from bench.stats import summarize, tail
from bench.worker import case_env, gemm_next_to_case, run_case


def snap(loadavg: float = 0.1, busy: list[tuple[str, float]] = (), ticks: tuple[int, int] = (0, 0)) -> dict:
    return {"loadavg": [loadavg, loadavg, loadavg], "ticks": list(ticks), "time": 0.0,
            "busy": [{"pid": 100 + i, "name": n, "cpu_pct": c} for i, (n, c) in enumerate(busy)]}


def test_percentiles_match_numpy() -> None:
    x = np.arange(1, 201, dtype=float)
    s = summarize(x)
    assert s["p50_ms"] == s["median_ms"] == np.percentile(x, 50)
    assert (s["p90_ms"], s["p99_ms"]) == (np.percentile(x, 90), np.percentile(x, 99))
    assert tail(s) == "100/180/198" and tail({"median_ms": 1.0}) == ""  # older files: no tail


def test_quiet_machine() -> None:
    rec = benv.load_record(snap(0.2, [("sshd", 1.0)], (1000, 0)), snap(0.3, [], (2000, 10)), own_threads=2)
    assert rec["quiet"] and rec["reasons"] == [] and rec["steal_pct"] == 1.0
    assert "ticks" not in rec["start"] and rec["start"]["loadavg"] == [0.2] * 3


@pytest.mark.parametrize("start,end,words", [
    (snap(1.0 + 2 + 0.6 * os.cpu_count()), snap(0.1), "load average"),  # beyond our 2 threads
    (snap(0.1, [("hog", 85.0), ("x", 30.0)]), snap(0.1), "hog (pid 100) at 85% CPU and 1 more"),
    (snap(0.1, ticks=(0, 0)), snap(0.1, ticks=(1000, 80)), "CPU steal 8%"),
])
def test_not_quiet_says_why(start: dict, end: dict, words: str) -> None:
    rec = benv.load_record(start, end, own_threads=2)
    assert rec["quiet"] is False and any(words in r for r in rec["reasons"]), rec["reasons"]


def test_own_threads_do_not_count_as_load() -> None:
    cores = os.cpu_count() or 1
    assert benv.load_record(snap(cores), snap(cores), own_threads=cores)["quiet"]


def _orphan_spinner() -> int:
    """A busy loop that is not our descendant (its shell parent exits): another user's process."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_busy_processes_sees_others_but_not_ours() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    other = _orphan_spinner()
    try:
        time.sleep(0.2)
        seen = {b["pid"]: b for b in benv.busy_processes(0.5, top=10_000)}
    finally:
        child.kill()
        child.wait()
        os.kill(other, signal.SIGKILL)
    assert os.getpid() not in seen and child.pid not in seen
    assert seen[other]["cpu_pct"] > 1  # a busy loop gets some CPU even on a loaded machine


def test_capture_records_cpu_runtimes_and_load() -> None:
    e = benv.capture(2)
    c = e["cpu_details"]
    assert isinstance(c["isa_flags"], list) and c["torch_cpu_capability"] and c["governor"]
    ort = e["runtimes"]["onnxruntime"]
    assert ort["version"] and "CPUExecutionProvider" in ort["providers"]
    assert len(e["load_at_start"]["loadavg"]) == 3 and "gpu" not in e  # no GPU asked: none queried
    assert any(k == "load at start" for k, _ in report.env_items(e))


def test_worker_env_and_row_record_threads_and_load() -> None:
    c = Case(model="m", source_format="caffe", artifact="", runtime="test-sleep", device="cpu", precision="fp32",
             layout="nchw", batch=1, mode="inference", protocol="zoo", threads=1, input_shapes={"x": [1, 2]},
             output_shapes=[[1, 2]], policy={"min_iters": 3, "min_s": 0.05, "max_s": 0.2, "warmup_s": 0.0,
                                             "warmup_max_s": 0.1})
    d = {**c.to_dict(), "plugin": "fake_runtimes"}
    assert case_env(d)["OMP_WAIT_POLICY"] == "PASSIVE"
    row = run_case(d)
    assert row["threads"]["count"] == 1 and row["threads"]["torch_intra_op"] == 1
    assert row["load"]["start"]["loadavg"] and row["load"]["end"]["time"] >= row["load"]["start"]["time"]
    assert row["quiet"] == row["load"]["quiet"] and (row["quiet"] or row["quiet_reason"])
    assert row["forward"]["p99_ms"] >= row["forward"]["p90_ms"] >= row["forward"]["p50_ms"] > 0


def test_gemm_next_to_case_measures_this_process() -> None:
    tflops = gemm_next_to_case({"device": "cpu", "precision": "fp32"})
    assert tflops is not None and 1e-4 < tflops < 100


def test_report_warns_and_refuses_impossible_peak() -> None:
    stats = summarize([10.0, 11.0, 12.0])
    base = {"model": "m", "source_format": "caffe", "device": "cpu", "precision": "fp32", "layout": "nchw",
            "batch": 1, "mode": "inference", "protocol": "zoo", "status": "ok", "forward": stats, "backward": None,
            "images_per_s": 90.0, "achieved_tflops": 0.2}
    rows = [{**base, "runtime": "torch", "pct_of_peak": 292.0, "quiet": True},
            {**base, "runtime": "onnxruntime", "pct_of_peak": 40.0, "quiet": False,
             "quiet_reason": "load average 9 on 2 cores (ours: 2 threads)"}]
    text = report.markdown([report.Run("r.json", {"schema_version": 1, "env": {}, "rows": rows})])
    assert "| unreliable |" in text and "292" not in text.split("Warnings:")[0]
    assert "onnxruntime cpu fp32 nchw 1 inference: the machine was not quiet (load average 9" in text
    assert "torch cpu fp32 nchw 1 inference: 292% of the GEMM peak" in text
    assert "11/11.8/12" in text  # p50/p90/p99
