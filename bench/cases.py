"""The case matrix and the protocols: what is timed, at which batch, input size and policy."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .timing import Policy


@dataclass(frozen=True)
class Protocol:
    """How one protocol times a model (the seeds' protocols are facts, see DESIGN.md)."""

    name: str
    policy: Policy
    mode: str | None = None  # forced mode
    batch: dict[str, int] = field(default_factory=dict)  # per model; "*" for all
    hw: dict[str, int] = field(default_factory=dict)  # input height = width per model; "*" for all
    n_inputs: int = 3  # distinct seeded inputs, rotated
    grad_input: bool = True  # training: gradient w.r.t. the data input too
    out_grad: str = "random"  # training: "random" gradients, or the model's own "output"
    retain_graph: bool = False  # backward repeated on one forward graph
    strip: tuple[str, ...] = ()  # IR ops left out (convnet-benchmarks: no dropout, no softmax)
    models: tuple[str, ...] = ()  # its default model set

    def batch_of(self, model: str, default: int) -> int:
        return self.batch.get(model, self.batch.get("*", default))

    def hw_of(self, model: str) -> int | None:
        return self.hw.get(model, self.hw.get("*"))


PROTOCOLS = {
    "zoo": Protocol("zoo", Policy()),
    # cnn-benchmarks: batch 16 at 224x224, training mode, 11 passes with the first discarded, each
    # pass a fresh random input and output gradient, forward and backward each timed with a sync
    # before and after, backward = input and weight gradients.
    "cnn-benchmarks": Protocol(
        "cnn-benchmarks", Policy(fixed=11, discard=1), mode="training", batch={"*": 16},
        hw={"*": 224}, n_inputs=11,
        models=("alexnet", "vgg16", "vgg19", "googlenet", "resnet18", "resnet34", "resnet50",
                "resnet101", "resnet152", "resnet200")),
    # convnet-benchmarks: 10 dry runs, then timed blocks of 10 calls (we time 5 blocks and report
    # their median; each block is the seeds' whole measurement), backward = gradients w.r.t. the
    # input of every layer and the weights but not the data, the output itself as gradient,
    # no dropout, no softmax.
    "convnet-benchmarks": Protocol(
        "convnet-benchmarks", Policy(fixed=5, dry=10, calls=10), mode="training",
        batch={"alexnet-owt": 128, "overfeat-fast": 128, "vgg-a": 64, "googlenet": 128},
        hw={"overfeat-fast": 231, "*": 224}, n_inputs=1, grad_input=False, out_grad="output",
        retain_graph=True, strip=("dropout", "softmax"),
        models=("alexnet-owt", "overfeat-fast", "vgg-a", "googlenet")),
}

# The convnet-benchmarks layer-wise set: (name, in channels, out channels, kernel, input size).
LAYER_BATCH = 128  # convnet-benchmarks times every layer at batch 128
LAYERS = [("L1", 3, 96, 11, 128), ("L2", 64, 128, 9, 64), ("L3", 128, 128, 9, 32),
          ("L4", 128, 128, 7, 16), ("L5", 384, 384, 3, 13)]


def step_gflops(forward: float, backward: float | None, training: bool) -> float:
    """GFLOP per image of one timed step: the forward, plus in training the backward, which is
    twice the forward (input and weight gradients) unless the case gives its own figure."""
    if not training:
        return forward
    return forward + (2 * forward if backward is None else backward)


@dataclass
class Case:
    """Everything a worker needs (serialized to JSON for the worker process)."""

    model: str
    source_format: str
    artifact: str
    runtime: str
    device: str
    precision: str
    layout: str
    batch: int
    mode: str
    protocol: str
    threads: int
    input_shapes: dict[str, list[int]]
    output_shapes: list[list[int]]
    policy: dict[str, Any]
    seed: int = 0
    n_inputs: int = 3
    grad_input: bool = True
    out_grad: str = "random"
    retain_graph: bool = False
    gflops_per_image: float | None = None  # forward
    backward_gflops_per_image: float | None = None  # None: twice the forward (input + weight grads)
    gemm_peak_tflops: float | None = None
    reference: str | None = None  # .npz of the float64 reference outputs on the first input
    original: dict[str, Any] | None = None  # the original files, for OpenCV
    gemm_n: int = 0
    concurrency: int = 1  # inference requests in flight at once (zoo bench --concurrency)
    input_data: str | None = None  # .npz of real input batches (zoo bench --input-data); else seeded random
    inputs: str = ""  # where the inputs come from, for the row ("" = random, seed given)
    status: str = ""  # set when the case must not run (e.g. failed conversion): its row says why
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The runtimes that compute bf16 on a CPU (ONNX Runtime's CPU provider has no bf16 convolution,
# OpenCV's CPU backend no bf16 at all): a default bf16 on a CPU is planned for these only.
BF16_CPU_RUNTIMES = ("torch", "torch-compile", "openvino")


def default_precisions(device: str, protocol: str = "zoo", quick: bool = False, here: bool = True) -> list[str]:
    """fp32, fp16 and bf16 on a GPU; on a CPU fp32, and bf16 too where this CPU computes it in
    hardware (zoo's protocol, not --quick: the seeds' protocols were fp32; ``here`` False: the
    cases run on other machines, whose CPUs are their own)."""
    from .env import native_bf16

    if device != "cpu":
        return ["fp32", "fp16", "bf16"]
    return ["fp32", "bf16"] if here and protocol == "zoo" and not quick and native_bf16() else ["fp32"]


def without_default_bf16(cases: list[Case]) -> tuple[list[Case], int]:
    """The CPU cases of a default bf16 left to the runtimes that compute it (BF16_CPU_RUNTIMES), and
    how many were left out."""
    kept = [c for c in cases if c.precision != "bf16" or c.device != "cpu" or c.runtime in BF16_CPU_RUNTIMES]
    return kept, len(cases) - len(kept)


def modes(mode: str) -> list[str]:
    return ["inference", "training"] if mode == "both" else [mode]
