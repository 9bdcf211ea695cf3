"""Ops of fork layers that no standard op spells: ShuffleNet's channel shuffle, SENet-style Axpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape


@dataclass(frozen=True, slots=True)
class ShuffleChannel(Op):
    """y[:, j * g + i] = x[:, i * (C / g) + j]: channels viewed as (g, C/g), transposed, flattened."""

    kind = "shuffle_channel"
    group: int

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        x = shapes[0]
        if len(x) < 2 or self.group < 1 or x[1] % self.group:
            raise ShapeError(f"group {self.group} does not divide the channels of {list(x)}")
        return [x]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        n, c = x.shape[:2]
        y = x.reshape(n, self.group, c // self.group, *x.shape[2:]).swapaxes(1, 2)
        return [y.reshape(x.shape)]

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        x, g = args[0], self.group
        return f"{x}.unflatten(1, ({g}, -1)).transpose(1, 2).flatten(1, 2)"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        rank = len(b.shape(ins[0]))
        shape = b.op("Shape", [ins[0]])
        nc, rest = b.fresh("nc"), b.fresh("rest")
        b.op("Split", [shape, b.const([2, rank - 2], "int64")], [nc, rest], axis=0)
        n = b.op("Slice", [shape, b.const([0], "int64"), b.const([1], "int64")])
        view = b.op("Concat", [n, b.const([self.group, -1], "int64"), rest], axis=0)
        y = b.op("Reshape", [ins[0], view])
        perm = [0, 2, 1, *range(3, rank + 1)]
        b.op("Reshape", [b.op("Transpose", [y], perm=perm), shape], outs)


@dataclass(frozen=True, slots=True)
class Axpy(Op):
    """y = a * x + b (inputs a, x, b): a is (N, C) or (N, C, 1, 1), one factor per channel of x
    (the Axpy layer of SENet-style forks)."""

    kind = "axpy"

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        a, x, y = shapes
        if x != y:
            raise ShapeError(f"x {list(x)} and b {list(y)} differ in shape")
        if len(x) < 2 or tuple(a[:2]) != tuple(x[:2]) or any(d != 1 for d in a[2:]):
            raise ShapeError(f"a {list(a)} is not one factor per channel of x {list(x)}")
        return [x]

    def view(self, a: Shape, x: Shape) -> tuple[int, ...]:
        return (*a[:2], *([1] * (len(x) - 2)))

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        a, x, y = xs
        return [a.reshape(self.view(a.shape, x.shape)) * x + y]

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        a, x, y = args
        lead = "".join(f", {a}.shape[{i}]" for i in (0, 1))
        return f"{a}.reshape({lead[2:]}{', 1' * (len(shapes[1]) - 2)}) * {x} + {y}"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        a, x, y = ins
        extra = len(b.shape(x)) - len(b.shape(a))
        if extra:
            a = b.op("Unsqueeze", [a, b.const(list(range(len(b.shape(a)), len(b.shape(x)))), "int64")])
        b.op("Add", [b.op("Mul", [a, x]), y], outs)
