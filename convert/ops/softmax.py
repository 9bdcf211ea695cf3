"""Softmax, arg-max and reductions along axes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape


@dataclass(frozen=True, slots=True)
class Softmax(Op):
    """y = exp(x) / sum_axis exp(x)   (log: y = x - log sum_axis exp(x))."""

    kind = "softmax"
    axis: int = 1
    log: bool = False

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if not 0 <= self.axis < len(shapes[0]):
            raise ShapeError(f"softmax axis {self.axis} out of range for {list(shapes[0])}")
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0] - xs[0].max(axis=self.axis, keepdims=True)
        lse = np.log(np.exp(x).sum(axis=self.axis, keepdims=True))
        return [x - lse if self.log else np.exp(x - lse)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"F.{'log_softmax' if self.log else 'softmax'}({args[0]}, {self.axis})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("LogSoftmax" if self.log else "Softmax", ins, outs, axis=self.axis)


@dataclass(frozen=True, slots=True)
class ArgMax(Op):
    """Caffe's ArgMax: the indices (as floats) of the ``top_k`` largest values along ``axis``,
    or, with axis -1, of each sample flattened, giving (N, 1, k) — (N, 2, k) with the values too
    when ``out_max_val``. With an axis and ``out_max_val`` it gives the values instead."""

    kind = "argmax"
    top_k: int = 1
    axis: int = -1
    out_max_val: bool = False

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s = shapes[0]
        if self.axis >= len(s):
            raise ShapeError(f"argmax axis {self.axis} out of range for {list(s)}")
        n = s[self.axis] if self.axis >= 0 else int(np.prod(s[1:]))
        if self.top_k > n:
            raise ShapeError(f"top_k {self.top_k} exceeds the {n} values")
        if self.axis < 0:
            return [(s[0], 2 if self.out_max_val else 1, self.top_k)]
        return [(*s[:self.axis], self.top_k, *s[self.axis + 1:])]

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0] if self.axis >= 0 else xs[0].reshape(xs[0].shape[0], -1)
        ax = self.axis if self.axis >= 0 else 1
        idx = np.flip(np.argsort(x, axis=ax, kind="stable"), axis=ax)
        idx = np.take(idx, np.arange(self.top_k), axis=ax)
        vals = np.take_along_axis(x, idx, axis=ax)
        if self.axis >= 0:
            return [vals if self.out_max_val else idx.astype(np.float64)]
        parts = [idx.astype(np.float64)] + ([vals] if self.out_max_val else [])
        return [np.stack(parts, axis=1)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        x, k = args[0], self.top_k
        if self.axis >= 0:
            pick = "values" if self.out_max_val else "indices.to(" + x + ".dtype)"
            return f"torch.topk({x}, {k}, {self.axis}).{pick}"
        flat = f"torch.flatten({x}, 1)"
        if self.out_max_val:
            return f"torch.stack([t.to({x}.dtype) for t in torch.topk({flat}, {k}, 1)[::-1]], 1)"
        return f"torch.topk({flat}, {k}, 1).indices.to({x}.dtype).unsqueeze(1)"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x, ax = ins[0], self.axis
        if ax < 0:
            x, ax = b.op("Flatten", [x], axis=1), 1
        k = b.const([self.top_k], "int64")
        vals, idx = b.fresh("values"), b.fresh("indices")
        b.op("TopK", [x, k], [vals, idx], axis=ax, largest=1, sorted=1)
        fidx = b.op("Cast", [idx], to=1)
        if self.axis >= 0:
            b.op("Identity", [vals if self.out_max_val else fidx], outs)
            return
        parts = [b.op("Unsqueeze", [t, b.const([1], "int64")])
                 for t in ([fidx, vals] if self.out_max_val else [fidx])]
        b.op("Concat", parts, outs, axis=1)


@dataclass(frozen=True, slots=True)
class Reduce(Op):
    """y = sum or mean of x over ``axes`` (kept as size 1 when ``keepdims``)."""

    kind = "reduce"
    mode: str
    axes: tuple[int, ...]
    keepdims: bool = False

    def batch_free(self, shapes: list[Shape]) -> bool:
        return 0 not in self.axes

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s = shapes[0]
        if any(not 0 <= a < len(s) for a in self.axes):
            raise ShapeError(f"reduction axes {list(self.axes)} out of range for {list(s)}")
        if self.keepdims:
            return [tuple(1 if i in self.axes else d for i, d in enumerate(s))]
        return [tuple(d for i, d in enumerate(s) if i not in self.axes)]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        f = np.sum if self.mode == "sum" else np.mean
        return [f(xs[0], axis=self.axes, keepdims=self.keepdims)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"{args[0]}.{self.mode}({self.axes}, keepdim={self.keepdims})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        keep = int(self.keepdims)
        if self.mode == "sum":
            b.op("ReduceSum", [ins[0], b.const(list(self.axes), "int64")], outs, keepdims=keep)
        else:
            b.op("ReduceMean", ins, outs, axes=list(self.axes), keepdims=keep)
