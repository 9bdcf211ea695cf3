"""OpenVINO on model.onnx: its CPU plugin, one stream, latency hint, the case's thread count, and the
case's precision as its inference precision (its CPU default is bf16 where the CPU has AMX or
AVX512-BF16: an fp32 case must say f32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .base import Runtime, register

# case precision -> (OpenVINO's inference precision, the CPU capability it needs)
PRECISION = {"fp32": ("f32", "FP32"), "fp16": ("f16", "FP16"), "bf16": ("bf16", "BF16")}


@register
class OpenVINO(Runtime):
    name = "openvino"

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        try:
            import openvino as ov
        except ImportError:
            return "openvino is not installed (pip install openvino)"
        if reason := super().skip_reason(case):
            return reason
        if case["device"] != "cpu":  # its GPU plugin drives Intel GPUs (OpenCL), not CUDA devices
            return "OpenVINO's GPU plugin runs on Intel GPUs only"
        hint, capability = PRECISION[case["precision"]]
        if capability not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            return f"OpenVINO's CPU plugin has no {hint} inference on this CPU"
        if case["layout"] != "nchw":
            return "OpenVINO chooses its own layout"
        return None

    def load(self, case: dict[str, Any]) -> None:
        import openvino as ov

        self.core = ov.Core()
        # no pinning to cores: a pinned thread waits for its busy core (LeNet on 2 busy cores: 3.8 ms
        # pinned, 0.17 ms not)
        self.config = {"INFERENCE_NUM_THREADS": int(case["threads"]), "NUM_STREAMS": 1, "ENABLE_CPU_PINNING": False,
                       "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": PRECISION[case["precision"]][0]}
        self.model = self.core.read_model(str(Path(case["artifact"]) / "model.onnx"))
        self.compiled: Any = None
        self.shapes: dict[str, tuple[int, ...]] = {}
        if case.get("input_shapes"):
            self._compile({k: tuple(v) for k, v in case["input_shapes"].items()})

    def _compile(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Static shapes: OpenVINO plans memory and picks kernels once (a symbolic batch costs time)."""
        self.model.reshape({k: list(v) for k, v in shapes.items()})
        self.compiled = self.core.compile_model(self.model, "CPU", self.config)
        self.request = self.compiled.create_infer_request()
        self.shapes = shapes

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        shapes = {k: v.shape for k, v in inputs[0].items()}
        if shapes != self.shapes:
            self._compile(shapes)
        self.inputs = [{k: np.ascontiguousarray(v) for k, v in x.items()} for x in inputs]

    def forward(self, i: int) -> None:
        self.request.infer(self.inputs[i % len(self.inputs)])

    def outputs(self) -> list[np.ndarray]:
        return [np.array(self.request.get_output_tensor(j).data, np.float32)
                for j in range(len(self.compiled.outputs))]

    def settings(self) -> dict[str, Any]:
        import openvino as ov

        props = ("INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT",
                 "ENABLE_CPU_PINNING")
        got = {p.lower(): _text(self.compiled.get_property(p)) for p in props} if self.compiled else {}
        return {"device": "CPU", "version": ov.get_version(), **got}


def _text(value: Any) -> str:
    """A property as OpenVINO spells it in its config ("f32", "LATENCY")."""
    if hasattr(value, "to_string"):
        return str(value.to_string())
    return str(getattr(value, "name", value))
