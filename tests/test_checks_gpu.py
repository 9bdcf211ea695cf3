"""python -m zoo.checks gpu, as far as a CPU can check it: the zoo bench command lines it runs, the
time limit, and the one-line refusal without CUDA."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer

from zoo import checks_gpu as g
from zoo.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_every_step_is_a_valid_zoo_bench_command(tmp_path: Path) -> None:
    bench = typer.main.get_command(app).commands["bench"]
    for step in g.STEPS:
        args = g.bench_args(step, 0, tmp_path / f"{step.name}.json")
        ctx = bench.make_context("bench", args[1:])  # raises on an unknown option or a bad value
        assert ctx.params["gpu"] == 0 and ctx.params["out_file"] == tmp_path / f"{step.name}.json"


def test_steps_cover_the_issue() -> None:
    words = [w for s in g.STEPS for w in s.args]
    assert {"torch", "torch-compile", "onnxruntime", "onnxruntime-trt"} <= set(words)
    assert {"fp32", "fp16", "bf16", "inference", "training", "cnn-benchmarks"} <= set(words)
    assert [s.name for s in g.STEPS[:2]] == ["inference", "cnn-benchmarks"]  # most important first


def test_time_limit_skips_what_does_not_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(g, "ROOT", tmp_path)
    monkeypatch.setattr(g, "refuse_without_cuda", lambda gpu: None)
    monkeypatch.setattr(g, "_gpu_name", lambda gpu: "NVIDIA H200")
    now = [0.0]  # the check's clock: each step below "takes" 100 s
    monkeypatch.setattr(g, "time", SimpleNamespace(monotonic=lambda: now[0], strftime=time.strftime))
    calls: list[list[str]] = []

    def zoo(args: list[str], timeout_s: float) -> tuple[int, float]:
        calls.append(args)
        if args[0] == "bench":
            out = Path(args[args.index("--out") + 1])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("{}")
            now[0] += 100
        return 0, 1.0

    monkeypatch.setattr(g, "_zoo", zoo)
    assert g.run(0, minutes=2.5, dry_run=False) == 0  # 150 s - 30 s for reports: one step, then too late
    assert [c[0] for c in calls] == ["bench", "report"]
    assert "/outputs/results/h200/" in calls[0][calls[0].index("--out") + 1]
    assert calls[1][-1] == str(tmp_path / "outputs" / "reports" / "h200.md")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_refuses_without_cuda_in_one_line() -> None:
    before = set((ROOT / "outputs" / "results").rglob("*"))
    p = subprocess.run([sys.executable, "-m", "zoo.checks", "gpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "CUDA is not available" in p.stderr and "Traceback" not in p.stderr
    assert set((ROOT / "outputs" / "results").rglob("*")) == before
