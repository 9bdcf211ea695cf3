"""Fully connected layer on the last axis."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape

BLOCK = 256  # output rows cast to float64 at a time: keeps the reference's memory small


@dataclass(frozen=True, slots=True)
class Linear(Op):
    """y[..., m] = sum_k x[..., k] * w[m, k] + b[m]   (weight (M, K), as nn.Linear)."""

    kind = "linear"
    bias: bool = True

    def roles(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    def macs(self, shapes: list[Shape], outs: list[Shape], w: dict[str, Shape]) -> int:
        return int(np.prod(outs[0])) * int(w["weight"][1])

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        ws = w["weight"]
        if len(ws) != 2:
            return f"weight of shape {list(ws)} (outputs x inputs expected)"
        if "bias" in w and tuple(w["bias"]) != (ws[0],):
            return f"bias of shape {list(w['bias'])} for {ws[0]} outputs"
        return None

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s, (m, k) = shapes[0], w["weight"]
        if len(s) < 2 or s[-1] != k:
            raise ShapeError(f"input {list(s)} does not end in {k} features")
        return [(*s[:-1], m)]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, wt = xs[0], w["weight"]
        y = np.empty((*x.shape[:-1], wt.shape[0]))
        for r in range(0, wt.shape[0], BLOCK):
            y[..., r:r + BLOCK] = x @ wt[r:r + BLOCK].astype(np.float64).T
        if self.bias:
            y += w["bias"].astype(np.float64)
        return [y]

    def torch_module(self, w: dict[str, Shape]) -> str:
        m, k = w["weight"]
        return f"nn.Linear({k}, {m}, bias={self.bias})"

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        if len(b.shape(ins[0])) == 2:
            b.op("Gemm", [ins[0], w["weight"]] + ([w["bias"]] if self.bias else []), outs, transB=1)
            return
        wt = b.op("Transpose", [w["weight"]], perm=[1, 0])
        if self.bias:
            y = b.op("MatMul", [ins[0], wt])
            b.op("Add", [y, w["bias"]], outs)
        else:
            b.op("MatMul", [ins[0], wt], outs)
