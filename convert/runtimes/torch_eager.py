"""PyTorch eager mode on the generated model.py (and the one way to import a model.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .base import CannotRun, Runtime, register

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def import_model(path: Path) -> ModuleType:
    """Import a generated model.py under a unique module name."""
    name = f"zoo_model_{abs(hash(str(Path(path).resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader  # a .py path always has a source loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@register
class TorchEager(Runtime):
    """PyTorch eager mode on the generated model.py."""

    name = "torch"
    training = True

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
        self.dtype = getattr(torch, DTYPES[case["precision"]])
        self.cl = case["layout"] == "channels_last"
        net = import_model(Path(case["artifact"]) / "model.py").load()
        net = net.to(self.dev, self.dtype)
        if self.cl:
            net = net.to(memory_format=torch.channels_last)
        self.training_mode = case["mode"] == "training"
        net.train(self.training_mode)
        # training steps move BatchNorm's running statistics; verification restores the loaded ones
        self.module, self.buffers = net, {k: b.clone() for k, b in net.named_buffers()} if self.training_mode else {}
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
        try:
            if self.training_mode:
                out = self.net(*xs)
            else:
                with self.torch.inference_mode():
                    out = self.net(*xs)
        except NotImplementedError as e:  # a kernel this build lacks for the dtype (bf16 LRN on a CPU)
            raise CannotRun(f"PyTorch {self.dev.type} {self.case['precision']}: {str(e).splitlines()[0][:200]}") from None
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
        with self.torch.no_grad():
            for k, b in self.module.named_buffers():
                if k in self.buffers:
                    b.copy_(self.buffers[k])
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

    def settings(self) -> dict[str, Any]:
        return {"intra_op_threads": self.torch.get_num_threads()}
