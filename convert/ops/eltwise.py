"""Elementwise ops over several inputs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import fmt


@dataclass(frozen=True, slots=True)
class Eltwise(Op):
    """sum: y = sum_i coeff[i] * x_i (coeff default 1);  prod: y = prod_i x_i;  max: y = max_i x_i.
    All inputs have the same shape."""

    kind = "eltwise"
    mode: str = "sum"
    coeffs: tuple[float, ...] = ()

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if any(s != shapes[0] for s in shapes):
            raise ShapeError(f"inputs differ in shape: {[list(s) for s in shapes]}")
        if self.coeffs and len(self.coeffs) != len(shapes):
            raise ShapeError(f"{len(self.coeffs)} coefficients for {len(shapes)} inputs")
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        if self.mode == "prod":
            return [reduce(np.multiply, xs)]
        if self.mode == "max":
            return [reduce(np.maximum, xs)]
        cs = self.coeffs or (1.0,) * len(xs)
        return [sum(c * x for c, x in zip(cs, xs))]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        if self.mode == "prod":
            return " * ".join(args)
        if self.mode == "max":
            return reduce(lambda a, b: f"torch.maximum({a}, {b})", args)
        cs = self.coeffs or (1.0,) * len(args)
        terms = [a if c == 1 else f"{a} * {fmt(c)}" for c, a in zip(cs, args)]
        return " + ".join(terms)

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        if self.mode == "max":
            b.op("Max", ins, outs)
            return
        if self.mode == "prod":
            _chain(b, "Mul", ins, outs)
            return
        cs = self.coeffs or (1.0,) * len(ins)
        terms = [x if c == 1 else b.op("Mul", [x, b.const(c)]) for c, x in zip(cs, ins)]
        if len(terms) == 1:
            b.op("Identity", terms, outs)
        else:
            b.op("Sum", terms, outs)


def _chain(b, op_type: str, ins: list[str], outs: list[str]) -> None:  # type: ignore[no-untyped-def]
    if len(ins) == 1:
        b.op("Identity", ins, outs)
        return
    acc = ins[0]
    for i, x in enumerate(ins[1:]):
        acc = b.op(op_type, [acc, x], outs if i == len(ins) - 2 else None)


@dataclass(frozen=True, slots=True)
class Broadcast(Op):
    """y = x0 (*|+) x1 where x1's shape is x0.shape[axis:axis+k], broadcast over the other axes
    (the two-input forms of Caffe's Scale and Bias layers)."""

    kind = "broadcast"
    mode: str = "mul"
    axis: int = 1

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis > 0

    def view(self, s0: Shape, s1: Shape) -> tuple[int, ...]:
        return (1,) * self.axis + tuple(s1) + (1,) * (len(s0) - self.axis - len(s1))

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s0, s1 = shapes
        if tuple(s0[self.axis:self.axis + len(s1)]) != tuple(s1):
            raise ShapeError(f"second input {list(s1)} does not match {list(s0)} at axis {self.axis}")
        return [s0]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x1 = xs[1].reshape(self.view(xs[0].shape, xs[1].shape))
        return [xs[0] * x1 if self.mode == "mul" else xs[0] + x1]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        v = self.view(shapes[0], shapes[1])
        sym = "*" if self.mode == "mul" else "+"
        other = args[1] if tuple(v) == tuple(shapes[1]) else f"{args[1]}.view({v})"
        return f"{args[0]} {sym} {other}"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        v = self.view(b.shape(ins[0]), b.shape(ins[1]))
        x1 = b.op("Reshape", [ins[1], b.const(v, "int64")])
        b.op("Mul" if self.mode == "mul" else "Add", [ins[0], x1], outs)
