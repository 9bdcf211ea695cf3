"""Runtimes, one class each, registered by the name used on the command line.

A runtime loads an artifact directory (model.py / model.onnx / the original files), takes inputs
once (moved to the device, precision and layout of the case), and then runs ``forward(i)`` /
``backward(i)`` on the i-th rotated input; ``sync()`` waits for queued device work. ``skip_reason``
says why a combination cannot run (never a crash, never silently absent).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

RUNTIMES: dict[str, type[Runtime]] = {}


def register(cls: type[Runtime]) -> type[Runtime]:
    RUNTIMES[cls.name] = cls
    return cls


class CannotRun(Exception):
    """The runtime cannot load this model (e.g. OpenCV lacks one of its layers): a skipped row."""


class Runtime:
    name: ClassVar[str] = ""
    training: ClassVar[bool] = False  # can time forward + backward

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        if case["mode"] == "training" and not self.training:
            return f"{self.name} runs inference only"
        return None

    def load(self, case: dict[str, Any]) -> None:
        raise NotImplementedError

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        raise NotImplementedError

    def forward(self, i: int) -> None:
        raise NotImplementedError

    def backward(self, i: int) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def outputs(self) -> list[np.ndarray]:
        """Outputs of the last forward as float32 arrays."""
        raise NotImplementedError

    def infer(self, x: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Inference outputs for one input (verification; replaces the timed inputs)."""
        self.set_inputs([x], None)
        self.forward(0)
        self.sync()
        return self.outputs()

    def memory(self) -> dict[str, int]:
        return {}


def _cuda_index(device: str) -> int | None:
    return int(device.split(":")[1]) if device.startswith("cuda") else None


def import_model(path: Path) -> Any:
    name = f"zoo_bench_model_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@register
class TorchEager(Runtime):
    """PyTorch eager mode on the generated model.py."""

    name = "torch"
    training = True
    DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        import torch

        if reason := super().skip_reason(case):
            return reason
        if case["device"].startswith("cuda"):
            if not torch.cuda.is_available():
                return f"CUDA is not available to this torch build ({torch.__version__})"
            if case["precision"] == "bf16" and not torch.cuda.is_bf16_supported():
                return "this GPU has no bf16 support"
        if case["layout"] == "channels_last" and any(len(s) != 4 for s in case["input_shapes"].values()):
            return "channels_last needs 4-D inputs"
        return None

    def load(self, case: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.case = case
        self.dev = torch.device(case["device"])
        self.dtype = getattr(torch, self.DTYPES[case["precision"]])
        self.cl = case["layout"] == "channels_last"
        net = import_model(Path(case["artifact"]) / "model.py").load()
        net = net.to(self.dev, self.dtype)
        if self.cl:
            net = net.to(memory_format=torch.channels_last)
        self.training_mode = case["mode"] == "training"
        net.train(self.training_mode)
        self.net = self.wrap(net)
        self.out: tuple[Any, ...] = ()

    def wrap(self, net: Any) -> Any:
        return net

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        t = self.torch
        fmt = t.channels_last if self.cl else t.contiguous_format
        need_grad = self.training_mode and self.case.get("grad_input", True)
        self.inputs = [[t.from_numpy(a).to(self.dev, self.dtype).contiguous(memory_format=fmt)
                        .requires_grad_(need_grad) for a in x.values()] for x in inputs]
        self.grads = [[t.from_numpy(g).to(self.dev, self.dtype) for g in gs] for gs in grads or []]

    def forward(self, i: int) -> None:
        xs = self.inputs[i % len(self.inputs)]
        if self.training_mode:
            out = self.net(*xs)
        else:
            with self.torch.inference_mode():
                out = self.net(*xs)
        self.out = out if isinstance(out, tuple) else (out,)

    def backward(self, i: int) -> None:
        self.net.zero_grad(set_to_none=True)
        if self.case.get("out_grad") == "output":  # convnet-benchmarks: the output as gradient
            grads = [o.detach() for o in self.out]
        else:
            grads = self.grads[i % len(self.grads)]
        self.torch.autograd.backward(self.out, grads, retain_graph=self.case.get("retain_graph", False))

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def outputs(self) -> list[np.ndarray]:
        return [o.detach().float().cpu().numpy() for o in self.out]

    def infer(self, x: dict[str, np.ndarray]) -> list[np.ndarray]:
        training, self.training_mode = self.training_mode, False
        self.net.eval()
        try:
            return super().infer(x)
        finally:
            self.training_mode = training
            self.net.train(training)

    def memory(self) -> dict[str, int]:
        if self.dev.type != "cuda":
            return {}
        c = self.torch.cuda
        return {"gpu_allocated_bytes": c.max_memory_allocated(self.dev),
                "gpu_reserved_bytes": c.max_memory_reserved(self.dev)}


@register
class TorchCompile(TorchEager):
    """torch.compile (Inductor) of the same module; compile time lands in the first iteration."""

    name = "torch-compile"

    def wrap(self, net: Any) -> Any:
        return self.torch.compile(net)


@register
class OnnxRuntime(Runtime):
    """ONNX Runtime on model.onnx: the CPU execution provider, or CUDA's with --gpu (IO binding)."""

    name = "onnxruntime"
    provider = ""

    def providers(self, case: dict[str, Any]) -> list[Any]:
        idx = _cuda_index(case["device"])
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
        so = ort.SessionOptions()
        so.intra_op_num_threads = case["threads"]
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        path = str(Path(case["artifact"]) / "model.onnx")
        model: Any = path
        if case["precision"] == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = convert_float_to_float16(onnx.load(path), keep_io_types=True).SerializeToString()
        self.sess = ort.InferenceSession(model, so, providers=self.providers(case))
        self.names = [o.name for o in self.sess.get_outputs()]
        self.gpu = _cuda_index(case["device"])

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


@register
class OnnxRuntimeTrt(OnnxRuntime):
    """ONNX Runtime's TensorRT execution provider, where the installed build has it."""

    name = "onnxruntime-trt"

    def providers(self, case: dict[str, Any]) -> list[Any]:
        idx = _cuda_index(case["device"])
        opts = {"device_id": idx or 0, "trt_fp16_enable": case["precision"] == "fp16"}
        return [("TensorrtExecutionProvider", opts), ("CUDAExecutionProvider", {"device_id": idx or 0})]

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        if case["device"] == "cpu":
            return "TensorRT runs on NVIDIA GPUs only"
        if case["precision"] == "fp16":  # TensorRT builds fp16 engines itself from the fp32 model
            case = {**case, "precision": "fp32"}
        return super().skip_reason(case)

    def load(self, case: dict[str, Any]) -> None:
        super().load({**case, "precision": "fp32"})


def _cannot(e: Exception) -> CannotRun:
    """OpenCV's importer lacks a layer or reads the file wrong: this combination cannot run."""
    lines = [ln for ln in str(e).splitlines() if "error:" in ln] or [str(e)]
    msg = re.sub(r"^\(-?\d+:[^)]*\)\s*", "", lines[-1].split("error: ")[-1].strip())
    return CannotRun(f"OpenCV cannot load this model: {msg[:200]}")


@register
class OpenCV(Runtime):
    """OpenCV DNN running the original Caffe/Torch7 file: the baseline a user would otherwise use."""

    name = "opencv"

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        try:
            import cv2
        except ImportError:
            return "opencv-python-headless is not installed (pip install 'zoo[reference]')"
        if reason := super().skip_reason(case):
            return reason
        if case["device"].startswith("cuda") and cv2.cuda.getCudaEnabledDeviceCount() == 0:
            return "this OpenCV build has no CUDA backend (the PyPI wheels have none)"
        if case["precision"] != "fp32":
            return "OpenCV's CPU target runs fp32 only"
        if case["layout"] != "nchw":
            return "OpenCV chooses its own layout"
        if not case.get("original"):
            return "no original model file to load"
        return None

    def load(self, case: dict[str, Any]) -> None:
        import cv2

        cv2.setNumThreads(case["threads"])
        o = case["original"]
        self.cv2 = cv2
        try:
            if o["framework"] == "caffe":
                self.net = cv2.dnn.readNetFromCaffe(o["source"], o["weights"])
            else:
                self.net = cv2.dnn.readNetFromTorch(o["weights"] or o["source"])
        except cv2.error as e:
            raise _cannot(e) from None
        self.net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        self.names = list(o.get("outputs", {}).values())
        self.named = o["framework"] == "caffe"  # a Torch7 net's input has no name in OpenCV

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        self.inputs = [{k: np.ascontiguousarray(v) for k, v in x.items()} for x in inputs]

    def forward(self, i: int) -> None:
        for k, v in self.inputs[i % len(self.inputs)].items():
            self.net.setInput(v, k) if self.named else self.net.setInput(v)
        try:
            self.out = self.net.forward(self.names) if self.names else [self.net.forward()]
        except self.cv2.error as e:  # layers are created at the first forward
            if "Can't create layer" in str(e):
                raise _cannot(e) from None
            raise

    def outputs(self) -> list[np.ndarray]:
        return [np.asarray(o, np.float32) for o in self.out]


@register
class GemmPeak(Runtime):
    """A square matrix multiply in PyTorch: the device's achievable peak, measured in the same run
    (FLOPs per "image" = 2 n^3)."""

    name = "gemm-peak"

    def load(self, case: dict[str, Any]) -> None:
        import torch

        self.torch, self.dev = torch, torch.device(case["device"])
        dtype = getattr(torch, TorchEager.DTYPES[case["precision"]])
        n = case["gemm_n"]
        self.a = torch.randn(n, n, device=self.dev).to(dtype)
        self.b = torch.randn(n, n, device=self.dev).to(dtype)

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        pass

    def forward(self, i: int) -> None:
        self.out = self.torch.matmul(self.a, self.b)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def outputs(self) -> list[np.ndarray]:
        return []
