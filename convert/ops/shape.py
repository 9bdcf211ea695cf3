"""Data movement: concat, split, reshape, crop, transpose, pad, resize."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import fmt


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
    """y_i = x[..., offset_i : offset_i + sizes[i], ...] along ``axis`` (covering it whole).

    A size of -1 takes a share of the rest: the axis minus the fixed sizes, divided evenly among
    the -1 entries (Caffe's Slice: the part after the last slice point, or an even split)."""

    kind = "split"
    axis: int
    sizes: tuple[int, ...]

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis != 0

    def actual(self, n: int) -> list[int]:
        fixed, shares = sum(d for d in self.sizes if d > 0), self.sizes.count(-1)
        rest = n - fixed
        if shares and (rest <= 0 or rest % shares):
            raise ShapeError(f"axis of size {n} does not split into {list(self.sizes)}")
        return [d if d > 0 else rest // max(shares, 1) for d in self.sizes]

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s, a = shapes[0], self.axis
        _axis_ok(a, len(s))
        sizes = self.actual(s[a])
        if sum(sizes) != s[a] or min(sizes) <= 0 or any(d < -1 or d == 0 for d in self.sizes):
            raise ShapeError(f"cannot split axis {a} of {list(s)} into {list(self.sizes)}")
        return [(*s[:a], n, *s[a + 1:]) for n in sizes]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return np.split(xs[0], np.cumsum(self.actual(xs[0].shape[self.axis]))[:-1], axis=self.axis)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        x, a, shares = args[0], self.axis, self.sizes.count(-1)
        if len(self.sizes) == 1:
            return x
        if shares == len(self.sizes):
            return f"torch.chunk({x}, {shares}, {a})"
        fixed = sum(d for d in self.sizes if d > 0)
        rest = f"{x}.shape[{a}] - {fixed}" + (f") // {shares}" if shares > 1 else "")
        rest = f"({rest}" if shares > 1 else rest
        sizes = ", ".join(str(d) if d > 0 else rest for d in self.sizes)
        return f"torch.split({x}, [{sizes}], {a})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        shares = self.sizes.count(-1)
        if len(self.sizes) == 1:
            b.op("Identity", ins, outs)
            return
        if shares == len(self.sizes):  # no split input: equal parts
            b.op("Split", [ins[0]], outs, axis=self.axis)
            return
        if not shares:
            b.op("Split", [ins[0], b.const(list(self.sizes), "int64")], outs, axis=self.axis)
            return
        n = b.op("Shape", [ins[0]], start=self.axis, end=self.axis + 1)
        fixed = sum(d for d in self.sizes if d > 0)
        rest = b.op("Div", [b.op("Sub", [n, b.const([fixed], "int64")]), b.const([shares], "int64")])
        parts = [rest if d == -1 else b.const([d], "int64") for d in self.sizes]
        b.op("Split", [ins[0], b.op("Concat", parts, axis=0)], outs, axis=self.axis)


@dataclass(frozen=True, slots=True)
class Reshape(Op):
    """y = x with the same values in row-major order, shaped by Caffe's rule: dims ``axis`` to
    ``axis + num_axes`` (-1: to the end) of the input are replaced by ``shape``, where 0 copies
    the input dim at that position and one -1 is inferred from the count. A constant shape is
    ``axis`` 0 with no 0 or -1 entries."""

    kind = "reshape"
    shape: tuple[int, ...]
    axis: int = 0
    num_axes: int = -1

    def span(self, rank: int) -> tuple[int, int]:
        end = rank if self.num_axes == -1 else self.axis + self.num_axes
        if not 0 <= self.axis <= end <= rank or self.num_axes < -1:
            raise ShapeError(f"axis {self.axis} / num_axes {self.num_axes} do not fit a {rank}-D input")
        return self.axis, end

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.axis > 0 or (bool(self.shape) and self.shape[0] == 0 and bool(shapes[0]))

    def target(self, s: Shape) -> Shape:
        start, end = self.span(len(s))
        if any(d == 0 and start + i >= len(s) for i, d in enumerate(self.shape)):
            raise ShapeError(f"dim 0 (copy) of {list(self.shape)} refers past the axes of {list(s)}")
        dims = [s[start + i] if d == 0 else d for i, d in enumerate(self.shape)]
        full = [*s[:start], *dims, *s[end:]]
        if full.count(-1) > 1 or any(d < -1 for d in full):
            raise ShapeError(f"invalid shape {list(self.shape)}")
        total, known = int(np.prod(s)), int(np.prod([d for d in full if d != -1]))
        if -1 in full:
            if known <= 0 or total % known:
                raise ShapeError(f"cannot reshape {list(s)} to {list(self.shape)}")
            full[full.index(-1)] = total // known
        if int(np.prod(full)) != total:
            raise ShapeError(f"cannot reshape {list(s)} to {list(self.shape)}")
        return tuple(full)

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        return [self.target(shapes[0])]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        return [xs[0].reshape(self.target(xs[0].shape))]

    def flatten(self, rank: int) -> bool:
        return self.shape == (-1,) and self.axis == 1 and self.span(rank)[1] == rank

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        x, rank = args[0], len(shapes[0])
        if self.flatten(rank):
            return f"torch.flatten({x}, 1)"
        start, end = self.span(rank)
        dims = [f"{x}.shape[{i}]" for i in range(start)]
        dims += [f"{x}.shape[{start + i}]" if d == 0 else str(d) for i, d in enumerate(self.shape)]
        dims += [f"*{x}.shape[{end}:]"] if end < rank else []
        return f"{x}.reshape({', '.join(dims)})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        rank = len(b.shape(ins[0]))
        if self.flatten(rank):
            b.op("Flatten", ins, outs, axis=1)
            return
        start, end = self.span(rank)
        # ONNX's 0 copies the input dim at the same index: right for the head and the copies
        head = [0] * start + list(self.shape)
        if end == rank or len(self.shape) == end - start:
            target = b.const(head + [0] * (rank - end), "int64")
        else:
            target = b.op("Concat", [b.const(head, "int64"), b.op("Shape", ins, start=end)], axis=0)
        b.op("Reshape", [ins[0], target], outs)


@dataclass(frozen=True, slots=True)
class Crop(Op):
    """y = x[start_0 : start_0 + size_0, start_1 : ...] (one start and size per axis).

    A size of 0 keeps the input dim (from its start to the end); with a second input (a reference
    blob, as Caffe's Crop), the axes from ``ref_from`` on take the reference's sizes."""

    kind = "crop"
    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    ref_from: int = -1

    def batch_free(self, shapes: list[Shape]) -> bool:
        return self.starts[0] == 0 and self.sizes[0] == 0 and self.ref_from != 0

    def actual(self, shapes: list[Shape]) -> list[int]:
        s = shapes[0]
        return [shapes[1][i] if len(shapes) > 1 and 0 <= self.ref_from <= i else n if n else d - st
                for i, (st, n, d) in enumerate(zip(self.starts, self.sizes, s))]

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s = shapes[0]
        if len(self.starts) != len(s) or len(self.sizes) != len(s) or (
                len(shapes) > 1 and len(shapes[1]) != len(s)):
            raise ShapeError(f"crop of rank {len(self.starts)} for inputs {[list(x) for x in shapes]}")
        sizes = self.actual(shapes)
        if any(st < 0 or n <= 0 or st + n > d for st, n, d in zip(self.starts, sizes, s)):
            raise ShapeError(f"cannot take {sizes} at offsets {list(self.starts)} from {list(s)}")
        return [tuple(sizes)]

    def changed(self, shape: Shape) -> list[int]:
        """Axes the crop may cut (the others are kept whole)."""
        return [i for i, (st, n) in enumerate(zip(self.starts, self.sizes))
                if st != 0 or n != 0 or 0 <= self.ref_from <= i]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        sizes = self.actual([x.shape for x in xs])
        return [xs[0][tuple(slice(st, st + n) for st, n in zip(self.starts, sizes))]]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        ch = self.changed(shapes[0])
        if not ch:
            return args[0]

        def part(i: int) -> str:
            st, n = self.starts[i], self.sizes[i]
            if 0 <= self.ref_from <= i and len(args) > 1:
                return f"{st}:{st} + {args[1]}.shape[{i}]" if st else f":{args[1]}.shape[{i}]"
            return f"{st}:{st + n}" if n else f"{st}:"
        return f"{args[0]}[{', '.join(part(i) if i in ch else ':' for i in range(max(ch) + 1))}]"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        ch = self.changed(b.shape(ins[0]))
        if not ch:
            b.op("Identity", ins, outs)
            return
        starts = [self.starts[i] for i in ch]
        ends = [self.starts[i] + self.sizes[i] if self.sizes[i] else 2**62 for i in ch]
        end = b.const(ends, "int64")
        refs = [i for i in ch if 0 <= self.ref_from <= i and len(ins) > 1]
        if refs:  # the reference's dims (axes from ref_from on, the tail of ch), plus the starts
            fixed = b.const(ends[:len(ch) - len(refs)], "int64")
            ref = b.op("Shape", [ins[1]], start=refs[0])
            ref = b.op("Add", [ref, b.const([self.starts[i] for i in refs], "int64")])
            end = b.op("Concat", [fixed, ref], axis=0)
        b.op("Slice", [ins[0], b.const(starts, "int64"), end, b.const(ch, "int64")], outs)


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
        x = ins[0]
        crop = [i for i, (a, c) in enumerate(self.pads) if a < 0 or c < 0]
        if crop:  # ends counted from the end of each axis: right at any input size
            starts = [max(-self.pads[i][0], 0) for i in crop]
            ends = [self.pads[i][1] if self.pads[i][1] < 0 else 2**62 for i in crop]
            x = b.op("Slice", [x, b.const(starts, "int64"), b.const(ends, "int64"),
                               b.const(crop, "int64")])
        pos = [max(a, 0) for a, _ in self.pads] + [max(c, 0) for _, c in self.pads]
        b.op("Pad", [x, b.const(pos, "int64"), b.const(self.value)], outs, mode=self.mode)


@dataclass(frozen=True, slots=True)
class Resize(Op):
    """Spatial resize: nearest (source index floor(i * in / out)) or bilinear with aligned corners
    (source coordinate i * (in - 1) / (out - 1)), as Caffe's Interp layer.

    Output size per axis n: ``size`` when given (non-zero); with a second input, that input's
    size; else ((n - 1) // shrink * zoom + 1) * scale (Caffe's shrink/zoom factors; Torch7's
    nearest upsampling scale)."""

    kind = "resize"
    size: tuple[int, int] = (0, 0)
    mode: str = "nearest"
    scale: int = 1
    shrink: int = 1
    zoom: int = 1

    def out_hw(self, shapes: list[Shape]) -> tuple[int, ...]:
        if any(self.size):
            return tuple(self.size)
        if len(shapes) > 1:
            return tuple(shapes[1][2:4])
        return tuple(((n - 1) // self.shrink * self.zoom + 1) * self.scale for n in shapes[0][2:])

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4 or (len(shapes) > 1 and len(shapes[1]) != 4):
            raise ShapeError(f"resize needs 4-D inputs, got {[list(s) for s in shapes]}")
        if min(self.scale, self.shrink, self.zoom) < 1:
            raise ShapeError("resize factors must be at least 1")
        return [(*shapes[0][:2], *self.out_hw(shapes))]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        for axis, (n, m) in zip((2, 3), zip(x.shape[2:], self.out_hw([a.shape for a in xs]))):
            if self.mode == "nearest":
                x = np.take(x, (np.arange(m) * n) // m, axis=axis)
                continue
            src = np.arange(m) * ((n - 1) / (m - 1) if m > 1 else 0.0)
            lo = np.minimum(np.floor(src).astype(int), n - 1)
            hi = np.minimum(lo + 1, n - 1)
            t = (src - lo).reshape([-1 if a == axis else 1 for a in range(4)])
            x = np.take(x, lo, axis=axis) * (1 - t) + np.take(x, hi, axis=axis) * t
        return [x]

    def torch_size(self, args: list[str]) -> str:
        if any(self.size):
            return f"size={tuple(self.size)}"
        if len(args) > 1:
            return f"size={args[1]}.shape[2:]"
        if self.shrink == self.zoom == 1:
            return f"scale_factor={self.scale}"
        dims = []
        for i in (2, 3):
            d = f"({args[0]}.shape[{i}] - 1)" + (f" // {self.shrink}" if self.shrink > 1 else "")
            d = f"{d} * {self.zoom} + 1" if self.zoom > 1 else f"{d} + 1"
            dims.append(f"({d}) * {self.scale}" if self.scale > 1 else d)
        return f"size=({', '.join(dims)})"

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        how = "mode='nearest'" if self.mode == "nearest" else "mode='bilinear', align_corners=True"
        return f"F.interpolate({args[0]}, {self.torch_size(args)}, {how})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        if any(self.size):
            hw = b.const(list(self.size), "int64")
        elif len(ins) > 1:
            hw = b.op("Shape", [ins[1]], start=2, end=4)
        else:
            n = b.op("Sub", [b.op("Shape", [ins[0]], start=2), b.const([1, 1], "int64")])
            n = b.op("Mul", [b.op("Div", [n, b.const([self.shrink] * 2, "int64")]), b.const([self.zoom] * 2, "int64")])
            hw = b.op("Mul", [b.op("Add", [n, b.const([1, 1], "int64")]), b.const([self.scale] * 2, "int64")])
        sizes = b.op("Concat", [b.op("Shape", [ins[0]], end=2), hw], axis=0)
        if self.mode == "nearest":
            b.op("Resize", [ins[0], "", "", sizes], outs, mode="nearest",
                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            b.op("Resize", [ins[0], "", "", sizes], outs, mode="linear",
                 coordinate_transformation_mode="align_corners")
