"""ONNX Runtime on model.onnx, one registered name per execution provider: CPU (or CUDA with a GPU
device, inputs and outputs bound on the device) and TensorRT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .base import Runtime, cuda_index, register


def session_options(threads: int, **config: str) -> Any:
    """The session options zoo uses everywhere: all graph optimisations, ``threads`` intra-op threads
    (0: ONNX Runtime's default), one inter-op thread, sequential execution, quiet."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # idle intra-op threads sleep instead of spinning: spinning threads on a busy machine slow it
    # beyond its share (ResNet-18 on 2 busy cores: 101 ms spinning, 47 ms not; idle: no loss)
    for k, v in {"session.intra_op.allow_spinning": "0", **config}.items():
        so.add_session_config_entry(k, v)
    return so


@register
class OnnxRuntime(Runtime):
    """The CPU execution provider, or CUDA's with --gpu (IO binding)."""

    name = "onnxruntime"
    rewrites_fp16 = True  # fp16: the graph is rewritten to fp16 weights and compute before loading

    def providers(self, case: dict[str, Any]) -> list[Any]:
        idx = cuda_index(case["device"])
        if idx is None:
            return ["CPUExecutionProvider"]
        return [("CUDAExecutionProvider", {"device_id": idx}), "CPUExecutionProvider"]

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        import onnxruntime as ort

        if reason := super().skip_reason(case):
            return reason
        want = self.providers(case)[0]
        want = want[0] if isinstance(want, tuple) else want
        if want not in ort.get_available_providers():
            return f"{want} is not in this onnxruntime build ({', '.join(ort.get_available_providers())})"
        if case["precision"] == "bf16":
            return "ONNX Runtime has no bf16 convolution kernels"
        if case["precision"] == "fp16" and case["device"] == "cpu":
            return "ONNX Runtime's CPU provider has no fp16 convolution kernels on x86"
        if case["layout"] != "nchw":
            return "ONNX Runtime chooses its own layout"
        return None

    def load(self, case: dict[str, Any]) -> None:
        import onnx
        import onnxruntime as ort

        self.ort, self.case = ort, case
        self.so = session_options(case["threads"])
        path = str(Path(case["artifact"]) / "model.onnx")
        model: Any = path
        if case["precision"] == "fp16" and self.rewrites_fp16:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = convert_float_to_float16(onnx.load(path), keep_io_types=True).SerializeToString()
        self.sess = ort.InferenceSession(model, self.so, providers=self.providers(case))
        self.names = [o.name for o in self.sess.get_outputs()]
        self.gpu = cuda_index(case["device"])

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        self.inputs = inputs
        self.bindings = []
        if self.gpu is None:
            return
        for x in inputs:  # inputs live on the device; outputs are allocated there
            b = self.sess.io_binding()
            for k, v in x.items():
                b.bind_ortvalue_input(k, self.ort.OrtValue.ortvalue_from_numpy(v, "cuda", self.gpu))
            for n in self.names:
                b.bind_output(n, "cuda", self.gpu)
            self.bindings.append(b)

    def forward(self, i: int) -> None:
        if self.gpu is None:
            self.out = self.sess.run(self.names, self.inputs[i % len(self.inputs)])
            return
        self.binding = self.bindings[i % len(self.bindings)]
        self.sess.run_with_iobinding(self.binding)

    def sync(self) -> None:
        if self.gpu is not None and hasattr(self, "binding"):
            self.binding.synchronize_outputs()

    def outputs(self) -> list[np.ndarray]:
        if self.gpu is None:
            return [np.asarray(o, np.float32) for o in self.out]
        return [np.asarray(o, np.float32) for o in self.binding.copy_outputs_to_cpu()]

    def settings(self) -> dict[str, Any]:
        so = self.so
        return {"providers": self.sess.get_providers(), "intra_op_threads": so.intra_op_num_threads,
                "inter_op_threads": so.inter_op_num_threads, "execution_mode": so.execution_mode.name,
                "graph_optimization_level": so.graph_optimization_level.name,
                "allow_spinning": so.get_session_config_entry("session.intra_op.allow_spinning")}


@register
class OnnxRuntimeTrt(OnnxRuntime):
    """ONNX Runtime's TensorRT execution provider, where the installed build has it."""

    name = "onnxruntime-trt"
    rewrites_fp16 = False  # TensorRT builds fp16 engines itself from the fp32 graph (trt_fp16_enable)

    def providers(self, case: dict[str, Any]) -> list[Any]:
        idx = cuda_index(case["device"])
        opts = {"device_id": idx or 0, "trt_fp16_enable": case["precision"] == "fp16"}
        return [("TensorrtExecutionProvider", opts), ("CUDAExecutionProvider", {"device_id": idx or 0})]

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        if case["device"] == "cpu":
            return "TensorRT runs on NVIDIA GPUs only"
        if case["precision"] == "fp16":  # TensorRT builds fp16 engines itself from the fp32 model
            case = {**case, "precision": "fp32"}
        return super().skip_reason(case)

    def settings(self) -> dict[str, Any]:
        """Also whether TensorRT builds fp16 engines, as the session applied it (None: no TensorRT)."""
        opts = self.sess.get_provider_options().get("TensorrtExecutionProvider")
        return {**super().settings(), "trt_fp16_enable": None if opts is None else opts.get("trt_fp16_enable") == "1"}
