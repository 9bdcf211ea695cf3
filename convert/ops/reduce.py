"""Caffe's Tile and Reduction layers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import fmt
from .shape import _axis_ok


@dataclass(frozen=True, slots=True)
class Tile(Op):
    """y = x repeated ``tiles`` times along ``axis`` (numpy.tile on that axis: copies follow each other)."""

    kind = "tile"
    axis: int
    tiles: int

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s = shapes[0]
        _axis_ok(self.axis, len(s))
        if self.tiles < 1:
            raise ShapeError(f"tiles must be at least 1, got {self.tiles}")
        return [(*s[:self.axis], s[self.axis] * self.tiles, *s[self.axis + 1:])]

    def reps(self, rank: int) -> list[int]:
        return [self.tiles if i == self.axis else 1 for i in range(rank)]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return [np.tile(xs[0], self.reps(xs[0].ndim))]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"{args[0]}.repeat({', '.join(map(str, self.reps(len(shapes[0]))))})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("Tile", [ins[0], b.const(self.reps(len(b.shape(ins[0]))), "int64")], outs)


REDUCTIONS = ("sum", "asum", "sumsq", "mean")


@dataclass(frozen=True, slots=True)
class Reduction(Op):
    """Caffe's Reduction: y = coeff * f(x over every axis from ``axis`` to the end), shape x.shape[:axis]
    (a 0-D scalar when ``axis`` is 0). f: sum of x, of |x|, of x², or their mean."""

    kind = "reduction"
    mode: str = "sum"
    axis: int = 0
    coeff: float = 1.0

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        _axis_ok(self.axis, len(shapes[0]))
        if self.mode not in REDUCTIONS:
            raise ShapeError(f"unknown reduction {self.mode!r}")
        return [shapes[0][:self.axis]]

    def dims(self, rank: int) -> tuple[int, ...]:
        return tuple(range(self.axis, rank))

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = {"asum": np.abs, "sumsq": np.square}.get(self.mode, lambda v: v)(xs[0])
        f = np.mean if self.mode == "mean" else np.sum
        return [np.asarray(f(x, axis=self.dims(x.ndim)) * self.coeff)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        x = {"asum": f"{args[0]}.abs()", "sumsq": f"{args[0]}.square()"}.get(self.mode, args[0])
        y = f"{x}.{'mean' if self.mode == 'mean' else 'sum'}({self.dims(len(shapes[0]))})"
        return y if self.coeff == 1 else f"{y} * {fmt(self.coeff)}"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        ax = list(self.dims(len(b.shape(ins[0]))))
        out = outs if self.coeff == 1 else None
        if self.mode == "sum":  # opset 13+: ReduceSum takes its axes as an input
            y = b.op("ReduceSum", [ins[0], b.const(ax, "int64")], out, keepdims=0)
        else:
            kind = {"asum": "ReduceL1", "sumsq": "ReduceSumSquare", "mean": "ReduceMean"}[self.mode]
            y = b.op(kind, [ins[0]], out, axes=ax, keepdims=0)
        if self.coeff != 1:
            b.op("Mul", [y, b.const(self.coeff)], outs)
