"""Data movement: concat, split, reshape, crop, transpose, pad, resize."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from . import fmt


def _axis_ok(axis: int, rank: int) -> None:
    if not 0 <= axis < rank:
        raise ShapeError(f"axis {axis} out of range for a {rank}-D input")


@dataclass(frozen=True, slots=True)
class Concat(Op):
    """y = the inputs joined along ``axis`` (other axes equal)."""

    kind = "concat"
    axis: int = 1

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        a = self.axis
        _axis_ok(a, len(shapes[0]))
        for s in shapes:
            if len(s) != len(shapes[0]) or s[:a] + s[a + 1:] != shapes[0][:a] + shapes[0][a + 1:]:
                raise ShapeError(f"cannot concatenate {[list(s) for s in shapes]} on axis {a}")
        return [(*shapes[0][:a], sum(s[a] for s in shapes), *shapes[0][a + 1:])]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return [np.concatenate(xs, axis=self.axis)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"torch.cat([{', '.join(args)}], {self.axis})" if len(args) > 1 else args[0]

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("Concat", ins, outs, axis=self.axis)


@dataclass(frozen=True, slots=True)
class Split(Op):
    """y_i = x[..., offset_i : offset_i + sizes[i], ...] along ``axis`` (covering it whole)."""

    kind = "split"
    axis: int
    sizes: tuple[int, ...]

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s, a = shapes[0], self.axis
        _axis_ok(a, len(s))
        if sum(self.sizes) != s[a] or min(self.sizes) <= 0:
            raise ShapeError(f"cannot split axis {a} of {list(s)} into {list(self.sizes)}")
        return [(*s[:a], n, *s[a + 1:]) for n in self.sizes]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return np.split(xs[0], np.cumsum(self.sizes)[:-1], axis=self.axis)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        if len(self.sizes) == 1:
            return args[0]
        return f"torch.split({args[0]}, {list(self.sizes)}, {self.axis})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        if len(self.sizes) == 1:
            b.op("Identity", ins, outs)
            return
        b.op("Split", [ins[0], b.const(list(self.sizes), "int64")], outs, axis=self.axis)


@dataclass(frozen=True, slots=True)
class Reshape(Op):
    """y = x with the same values in row-major order and shape ``shape``."""

    kind = "reshape"
    shape: tuple[int, ...]

    def batch_free(self, shapes: list[Shape]) -> bool:
        return bool(self.shape) and bool(shapes[0]) and self.shape[0] == shapes[0][0]

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if int(np.prod(shapes[0])) != int(np.prod(self.shape)):
            raise ShapeError(f"cannot reshape {list(shapes[0])} to {list(self.shape)}")
        return [self.shape]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return [xs[0].reshape(self.shape)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        x = args[0]
        if not self.batch_free(shapes):
            return f"{x}.reshape({tuple(self.shape)})"
        if len(self.shape) == 2:
            return f"torch.flatten({x}, 1)"
        return f"{x}.reshape({', '.join([f'{x}.shape[0]'] + [str(d) for d in self.shape[1:]])})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        if self.batch_free([b.shape(ins[0])]):
            if len(self.shape) == 2:
                b.op("Flatten", ins, outs, axis=1)
                return
            target = [0, *self.shape[1:]]
        else:
            target = list(self.shape)
        b.op("Reshape", [ins[0], b.const(target, "int64")], outs)


@dataclass(frozen=True, slots=True)
class Crop(Op):
    """y = x[start_0 : start_0 + size_0, start_1 : ...] (one start and size per axis)."""

    kind = "crop"
    starts: tuple[int, ...]
    sizes: tuple[int, ...]

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.starts[0] == 0 and self.sizes[0] == shapes[0][0]

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s = shapes[0]
        if len(self.starts) != len(s) or any(
                st < 0 or n <= 0 or st + n > d for st, n, d in zip(self.starts, self.sizes, s)):
            raise ShapeError(f"cannot take {list(self.sizes)} at offsets {list(self.starts)} "
                             f"from {list(s)}")
        return [self.sizes]

    def changed(self, shape: Shape) -> list[int]:
        return [i for i, (st, n, d) in enumerate(zip(self.starts, self.sizes, shape))
                if st != 0 or n != d]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return [xs[0][tuple(slice(st, st + n) for st, n in zip(self.starts, self.sizes))]]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        ch = self.changed(shapes[0])
        if not ch:
            return args[0]
        idx = [f"{self.starts[i]}:{self.starts[i] + self.sizes[i]}" if i in ch else ":"
               for i in range(max(ch) + 1)]
        return f"{args[0]}[{', '.join(idx)}]"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        ch = self.changed(b.shape(ins[0]))
        if not ch:
            b.op("Identity", ins, outs)
            return
        starts = [self.starts[i] for i in ch]
        ends = [self.starts[i] + self.sizes[i] for i in ch]
        b.op("Slice", [ins[0], b.const(starts, "int64"), b.const(ends, "int64"),
                       b.const(ch, "int64")], outs)


@dataclass(frozen=True, slots=True)
class Transpose(Op):
    """y = x with its axes permuted: y.shape[i] = x.shape[perm[i]]."""

    kind = "transpose"
    perm: tuple[int, ...]

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.perm[0] == 0

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if sorted(self.perm) != list(range(len(shapes[0]))):
            raise ShapeError(f"order {list(self.perm)} is not a permutation of a "
                             f"{len(shapes[0])}-D input's axes")
        return [tuple(shapes[0][p] for p in self.perm)]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return [xs[0].transpose(self.perm)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"{args[0]}.permute{tuple(self.perm)}"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("Transpose", ins, outs, perm=list(self.perm))


@dataclass(frozen=True, slots=True)
class Pad(Op):
    """y = x padded by (before, after) per axis; mode constant (``value``), reflect (mirror
    without the edge) or edge (replicate). Negative amounts crop."""

    kind = "pad"
    pads: tuple[tuple[int, int], ...]
    mode: str = "constant"
    value: float = 0.0

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.pads[0] == (0, 0)

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s = shapes[0]
        if len(self.pads) != len(s):
            raise ShapeError(f"{len(self.pads)} pad pairs for a {len(s)}-D input")
        if self.mode == "reflect" and any(max(p) >= d for p, d in zip(self.pads, s)):
            raise ShapeError(f"reflection pad {list(self.pads)} too large for {list(s)}")
        return [tuple(d + a + b for d, (a, b) in zip(s, self.pads))]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        x = x[tuple(slice(max(-a, 0), d - max(-b, 0)) for d, (a, b) in zip(x.shape, self.pads))]
        pos = [(max(a, 0), max(b, 0)) for a, b in self.pads]
        if self.mode == "constant":
            return [np.pad(x, pos, constant_values=self.value)]
        return [np.pad(x, pos, mode={"reflect": "reflect", "edge": "edge"}[self.mode])]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        first = next((i for i, p in enumerate(self.pads) if p != (0, 0)), len(self.pads))
        if first == len(self.pads):
            return args[0]
        flat = [v for a, b in reversed(self.pads[first:]) for v in (a, b)]
        if self.mode == "constant":
            v = f", value={fmt(self.value)}" if self.value else ""
            return f"F.pad({args[0]}, {tuple(flat)}{v})"
        return f"F.pad({args[0]}, {tuple(flat)}, mode={ {'reflect': 'reflect', 'edge': 'replicate'}[self.mode]!r})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x, shape = ins[0], b.shape(ins[0])
        crop = [i for i, (a, c) in enumerate(self.pads) if a < 0 or c < 0]
        if crop:
            starts = [max(-self.pads[i][0], 0) for i in crop]
            ends = [shape[i] - max(-self.pads[i][1], 0) for i in crop]
            x = b.op("Slice", [x, b.const(starts, "int64"), b.const(ends, "int64"),
                               b.const(crop, "int64")])
        pos = [max(a, 0) for a, _ in self.pads] + [max(c, 0) for _, c in self.pads]
        b.op("Pad", [x, b.const(pos, "int64"), b.const(self.value)], outs, mode=self.mode)


@dataclass(frozen=True, slots=True)
class Resize(Op):
    """Spatial resize to ``size``: nearest (source index floor(i * in / out)) or bilinear with
    aligned corners (source coordinate i * (in - 1) / (out - 1)), as Caffe's Interp layer."""

    kind = "resize"
    size: tuple[int, int]
    mode: str = "nearest"

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4:
            raise ShapeError(f"resize needs a 4-D input, got {list(shapes[0])}")
        return [(*shapes[0][:2], *self.size)]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        for axis, (n, m) in zip((2, 3), zip(x.shape[2:], self.size)):
            if self.mode == "nearest":
                x = np.take(x, (np.arange(m) * n) // m, axis=axis)
                continue
            src = np.arange(m) * ((n - 1) / (m - 1) if m > 1 else 0.0)
            lo = np.minimum(np.floor(src).astype(int), n - 1)
            hi = np.minimum(lo + 1, n - 1)
            t = (src - lo).reshape([-1 if a == axis else 1 for a in range(4)])
            x = np.take(x, lo, axis=axis) * (1 - t) + np.take(x, hi, axis=axis) * t
        return [x]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        if self.mode == "nearest":
            return f"F.interpolate({args[0]}, size={self.size}, mode='nearest')"
        return f"F.interpolate({args[0]}, size={self.size}, mode='bilinear', align_corners=True)"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        shape = b.op("Shape", ins, end=2)
        sizes = b.op("Concat", [shape, b.const(list(self.size), "int64")], axis=0)
        if self.mode == "nearest":
            b.op("Resize", [ins[0], "", "", sizes], outs, mode="nearest",
                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            b.op("Resize", [ins[0], "", "", sizes], outs, mode="linear",
                 coordinate_transformation_mode="align_corners")
