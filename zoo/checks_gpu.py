"""GPU check: the zoo on one CUDA device in under 8 minutes, results and reports committed.

    python -m zoo.checks gpu [--gpu 0] [--minutes 8] [--dry-run]

Steps, most important first (each a `zoo bench` in its own process, its own results file
outputs/results/<gpu>/<stamp>-<step>.json; a step that no longer fits the time left is skipped and
said so, a step that overruns is stopped and keeps the rows it finished):

1. inference: PyTorch eager and ONNX Runtime's CUDA provider, fp32/fp16/bf16, batch 64, on AlexNet,
   GoogLeNet, VGG-16 and ResNet-50 (the converted models are kept for the later steps);
2. cnn-benchmarks: the seeds' protocol (batch 16, training, 11 passes) in PyTorch fp32 on the networks
   of the seeds' GPU tables (their ResNets are fb.resnet.torch's: the -lua models);
3. training: PyTorch eager, fp32/fp16/bf16, batch 64, ResNet-50 and VGG-16;
4. torch.compile: ResNet-50 bf16, inference and training (compile time in the first iteration);
5. TensorRT: ONNX Runtime's TensorRT provider, ResNet-50 fp16 (its engine build is minutes).

Then outputs/reports/<gpu>.md (every step) and <gpu>-cnn-benchmarks-vs-seeds.md (step 2 beside the
seeds' Titan Xp and GTX 1080 Ti files, when the corpus is there). A combination the machine cannot run
(no onnxruntime-gpu, no TensorRT) is a skipped row with the reason, as everywhere in zoo bench.
Without CUDA the check refuses in one line (exit 2).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .checks_common import CORPUS, ROOT

SEEDS = ("titan_xp_cudnn51", "1080Ti")  # the seeds' cnn-benchmarks GPU folders set beside ours
REPORT_S = 30.0  # kept for the reports at the end
MIN_STEP_S = 45.0  # a step with less time than this left is not started


@dataclass(frozen=True)
class Step:
    name: str
    args: tuple[str, ...]  # zoo bench arguments, without --gpu and --out
    budget_s: float  # zoo bench --budget: the timing part (conversion, compile, engine builds come on top)


def _each(option: str, values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(x for v in values for x in (option, v))


PRECISIONS = _each("--precision", ("fp32", "fp16", "bf16"))
STEPS = (
    Step("inference", ("alexnet", "googlenet", "vgg16", "resnet50", *_each("--runtime", ("torch", "onnxruntime")),
                       *PRECISIONS, "--batch", "64", "--mode", "inference"), 60),
    Step("cnn-benchmarks", ("alexnet", "googlenet", "vgg16", "resnet18-lua", "resnet50-lua", "resnet152-lua",
                            "--protocol", "cnn-benchmarks", "--runtime", "torch", "--precision", "fp32"), 60),
    Step("training", ("vgg16", "resnet50", "--runtime", "torch", *PRECISIONS, "--batch", "64", "--mode", "training"),
         40),
    Step("compile", ("resnet50", "--runtime", "torch-compile", "--precision", "bf16", "--batch", "64",
                     "--mode", "both"), 30),
    Step("tensorrt", ("resnet50", "--runtime", "onnxruntime-trt", "--precision", "fp16", "--batch", "64",
                      "--mode", "inference"), 20),
)


def bench_args(step: Step, gpu: int, out: Path) -> list[str]:
    """The full `zoo bench` command line of a step: one process per case, one after the other (a
    dedicated GPU machine needs no interleaving), converted models kept for the next steps."""
    return ["bench", *step.args, "--gpu", str(gpu), "--budget", f"{step.budget_s:g}", "--no-interleave", "--keep",
            "--out", str(out)]


def seeds_dir() -> Path | None:
    """The seeds' cnn-benchmarks files: the corpus beside the checkout, or a shared/ inside it."""
    for corpus in (CORPUS, ROOT / "shared" / "corpus"):
        d = corpus / "seeds" / "cnn-benchmarks" / "outputs"
        if d.is_dir():
            return d
    return None


def refuse_without_cuda(gpu: int) -> str | None:
    """Why this machine cannot run the check (one line), or None."""
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return f"gpu check: CUDA is not available (torch {torch.__version__} is {build}); run it on a GPU machine"
    if not 0 <= gpu < torch.cuda.device_count():
        return f"gpu check: --gpu {gpu}, but this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


def _zoo(args: list[str], timeout_s: float) -> tuple[int, float]:
    t0 = time.monotonic()
    print("$ zoo " + " ".join(args), flush=True)
    try:
        code = subprocess.run([sys.executable, "-m", "zoo.cli", *args], cwd=ROOT, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        code = 124
    return code, time.monotonic() - t0


def run(gpu: int, minutes: float, dry_run: bool) -> int:
    from bench.env import machine_name

    reason = None if dry_run else refuse_without_cuda(gpu)
    if reason:
        print(reason, file=sys.stderr)
        return 2
    machine = "h200" if dry_run else machine_name({"gpu": {"name": _gpu_name(gpu)}})
    results, reports = ROOT / "outputs" / "results" / machine, ROOT / "outputs" / "reports"
    stamp, deadline = time.strftime("%Y%m%d-%H%M%S"), time.monotonic() + 60 * minutes - REPORT_S
    done, notes = [], []
    for step in STEPS:
        out = results / f"{stamp}-{step.name}.json"
        args = bench_args(step, gpu, out)
        left = deadline - time.monotonic()
        if dry_run:
            print("$ zoo " + " ".join(args))
            continue
        if left < MIN_STEP_S:
            notes.append(f"{step.name}: not started ({left:.0f} s left)")
            continue
        code, secs = _zoo(args, left)
        stopped = " (stopped at the time limit)" if code == 124 else ""
        notes.append(f"{step.name}: exit {code} after {secs:.0f} s{stopped}")
        if out.exists():
            done.append((step, out))
    if dry_run:
        return 0
    _reports(machine, done, reports)
    print("\n".join(notes))
    return 0 if done else 1


def _gpu_name(gpu: int) -> str:
    import torch

    return torch.cuda.get_device_name(gpu)


def _reports(machine: str, done: list[tuple[Step, Path]], reports: Path) -> None:
    if not done:
        return
    _zoo(["report", *(str(p) for _, p in done), "--out", str(reports / f"{machine}.md")], REPORT_S)
    cnn = [p for s, p in done if s.name == "cnn-benchmarks"]
    seeds = seeds_dir()
    if cnn and seeds:
        _zoo(["report", *map(str, cnn), *(str(seeds / s) for s in SEEDS if (seeds / s).is_dir()),
              "--out", str(reports / f"{machine}-cnn-benchmarks-vs-seeds.md")], REPORT_S)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m zoo.checks gpu")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--dry-run", action="store_true", help="print the zoo bench commands only")
    a = p.parse_args(argv)
    sys.exit(run(a.gpu, a.minutes, a.dry_run))
