"""2-D max / average / sum pooling that computes its output size from the input, by rule.

Frameworks differ in how they round the output size (Caffe and Torch7's ``:ceil()`` round up and
drop a last window that would start inside the padding) and in what the average divides by. The
op holds the rule (kernel, stride, pad, ceil, drop) and every backend applies it to the actual
input size: the end padding of round-up windows is computed at run time (in model.py and in the
ONNX graph), so no backend's own rounding (ceil_mode) is relied on where it differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import helper


def pooled_size(n: int, k: int, s: int, p: int, ceil: bool, drop: bool) -> int:
    """Round (n + 2p - k)/s up or down, plus one; with ``drop``, then drop a last window that
    would start inside the end padding. Caffe drops when the layer has any padding (on either
    axis); Torch7's and PyTorch's ceil modes always drop."""
    span = n + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if drop and (out - 1) * s >= n + p:
        out -= 1
    return out


@dataclass(frozen=True, slots=True)
class Pool(Op):
    """y = max | mean | sum over each window of the zero/-inf padded input.

    Output size per axis: ``pooled_size(n, k, s, p, ceil, drop)`` of the actual input size n.
    mode "avg" divides by the window clipped to the padded bounds (Caffe, and Torch7's
    count_include_pad=true) when ``count_pad``, else by the window clipped to the data. Windows
    that overhang past the end padding (ceil rounding) never count the overhang. mode "sum" is
    Torch7's legacy ``divide=false`` average. ``whole``: global pooling (the kernel is the input).
    """

    kind = "pool"
    mode: str
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    ceil: bool = False
    drop: bool = False
    count_pad: bool = True
    whole: bool = False

    def sizes(self, h: int, w: int) -> list[tuple[int, int]]:
        """(output size, end padding) per spatial axis for an h x w input."""
        if self.whole:
            return [(1, 0), (1, 0)]
        res = []
        for n, k, s, p in zip((h, w), self.kernel, self.stride, self.pad):
            out = pooled_size(n, k, s, p, self.ceil, self.drop)
            res.append((out, max(0, (out - 1) * s + k - n - p)))
        return res

    def static(self) -> bool:
        """Whether plain symmetric padding gives the right windows at every input size."""
        return not self.ceil or self.stride == (1, 1)

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4:
            raise ShapeError(f"pooling needs a 4-D input, got {list(shapes[0])}")
        n, c, h, wd = shapes[0]
        for p, k in zip(self.pad, self.kernel):
            if p >= k and not self.whole:
                raise ShapeError(f"pad {p} must be smaller than kernel {k}")
        for d, s, p, (o, _) in zip((h, wd), self.stride, self.pad, self.sizes(h, wd)):
            if self.whole:
                continue
            if o < 1:  # (a round-up window may be larger than the padded input: Caffe clips it)
                raise ShapeError(f"kernel {list(self.kernel)} does not fit input {h}x{wd}")
            if (o - 1) * s >= d + p:
                raise ShapeError(f"input {h}x{wd} puts a pooling window past the input")
        return [(n, c, *(o for o, _ in self.sizes(h, wd)))]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        h, wd = x.shape[2:]
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        if self.whole:
            (kh, kw), (sh, sw), (ph, pw) = (h, wd), (1, 1), (0, 0)
        (oh, eh), (ow, ew) = self.sizes(h, wd)
        fill = -np.inf if self.mode == "max" else 0.0
        xp = np.pad(x, ((0, 0), (0, 0), (ph, eh), (pw, ew)), constant_values=fill)
        counted = np.zeros((1, 1, *xp.shape[2:]))
        if self.count_pad:  # the padded bounds count, the overhang beyond them does not
            counted[:, :, :ph + h + min(eh, ph), :pw + wd + min(ew, pw)] = 1
        else:
            counted[:, :, ph:ph + h, pw:pw + wd] = 1
        acc, den = None, 0.0
        for i in range(kh):
            for j in range(kw):
                sl = (slice(None), slice(None), slice(i, i + sh * (oh - 1) + 1, sh),
                      slice(j, j + sw * (ow - 1) + 1, sw))
                v = xp[sl]
                if self.mode == "max":
                    acc = v.copy() if acc is None else np.maximum(acc, v)
                else:
                    acc = v.copy() if acc is None else acc + v
                    den = den + counted[sl]
        if self.mode == "avg":
            acc = acc / den
        return [acc]

    def torch_ceil(self) -> bool | None:
        """ceil_mode for which torch's own pooling computes exactly this op at every size, or None."""
        if any(p > k // 2 for p, k in zip(self.pad, self.kernel)):
            return None
        if self.static():
            return False
        if self.mode == "avg" and not self.count_pad:
            return None  # torch's ceil + exclude-pad divisor differs at the overhang
        # torch's ceil mode always drops a window starting in the end padding; without padding
        # Caffe's never-dropped window would start past the input, which infer refuses
        return True if self.drop or not any(self.pad) else None

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        x = args[0]
        if self.whole:
            return {"max": f"F.adaptive_max_pool2d({x}, 1)", "avg": f"{x}.mean((2, 3), keepdim=True)",
                    "sum": f"{x}.sum((2, 3), keepdim=True)"}[self.mode]
        k, s, p = self.kernel, self.stride, self.pad
        ceil = self.torch_ceil()
        if ceil is not None:
            sq = lambda v: v[0] if v[0] == v[1] else v  # noqa: E731
            opts = [str(sq(k)), str(sq(s))] + ([f"padding={sq(p)}"] if any(p) else [])
            opts += ["ceil_mode=True"] if ceil else []
            if self.mode == "max":
                return f"F.max_pool2d({x}, {', '.join(opts)})"
            opts += [] if self.count_pad or not any(p) else ["count_include_pad=False"]
            opts += ["divisor_override=1"] if self.mode == "sum" else []
            return f"F.avg_pool2d({x}, {', '.join(opts)})"
        return (f"pool2d({x}, {self.mode!r}, {k}, {s}, {p}, ceil={self.ceil}, drop={self.drop}, "
                f"count_pad={self.count_pad})")

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        x, k, s = ins[0], list(self.kernel), list(self.stride)
        if self.whole:
            if self.mode == "sum":
                b.op("ReduceSum", [x, b.const([2, 3], "int64")], outs, keepdims=1)
            else:
                b.op("GlobalMaxPool" if self.mode == "max" else "GlobalAveragePool", [x], outs)
            return
        if self.static():
            self._onnx_static(b, x, outs)
            return
        if not any(self.pad) and all(st <= kk for st, kk in zip(s, k)) and self.mode != "sum":
            # no padding and windows no further apart than they are wide: no window can start past
            # the input, so ONNX's own ceil_mode rounds exactly like this op at every size
            extra = {"count_include_pad": 0} if self.mode == "avg" else {}
            b.op("MaxPool" if self.mode == "max" else "AveragePool", [x], outs, kernel_shape=k, strides=s,
                 ceil_mode=int(self.ceil), **extra)
            return
        pads = b.op("Concat", [b.const([0, 0, *self.pad, 0, 0], "int64"), self._onnx_ends(b, x)], axis=0)
        if self.mode == "max":
            xp = b.op("Pad", [x, pads, b.const(-np.inf)])
            b.op("MaxPool", [xp], outs, kernel_shape=k, strides=s)
            return
        total = b.op("Mul", [b.op("AveragePool", [b.op("Pad", [x, pads])], kernel_shape=k, strides=s),
                             b.const(float(k[0] * k[1]))], outs if self.mode == "sum" else None)
        if self.mode == "avg":
            b.op("Div", [total, self._onnx_divisor(b, x, pads)], outs)

    def _onnx_static(self, b, x: str, outs: list[str]) -> None:  # type: ignore[no-untyped-def]
        k, s, (ph, pw) = list(self.kernel), list(self.stride), self.pad
        pads = [ph, pw, ph, pw]
        if self.mode == "max":
            b.op("MaxPool", [x], outs, kernel_shape=k, strides=s, pads=pads)
            return
        count = int(self.count_pad or self.mode == "sum")  # no window passes the padded bounds
        y = b.op("AveragePool", [x], None if self.mode == "sum" else outs, kernel_shape=k, strides=s,
                 pads=pads, count_include_pad=count)
        if self.mode == "sum":
            b.op("Mul", [y, b.const(float(k[0] * k[1]))], outs)

    def _onnx_ends(self, b, x: str) -> str:  # type: ignore[no-untyped-def]
        """In-graph end padding per spatial axis: int64 [end_h, end_w] (pooled_size, then overhang)."""
        k, s, p = (b.const(list(v), "int64") for v in (self.kernel, self.stride, self.pad))
        one = b.const([1, 1], "int64")
        hw = b.op("Shape", [x], start=2)
        span = b.op("Sub", [b.op("Add", [hw, b.op("Add", [p, p])]), k])
        if self.ceil:
            span = b.op("Add", [span, b.op("Sub", [s, one])])
        last = b.op("Div", [span, s])  # index of the last window (int64 division, span >= 0)
        if self.drop:
            late = b.op("GreaterOrEqual", [b.op("Mul", [last, s]), b.op("Add", [hw, p])])
            last = b.op("Sub", [last, b.op("Cast", [late], to=7)])  # 7: INT64
        end = b.op("Sub", [b.op("Add", [b.op("Mul", [last, s]), k]), b.op("Add", [hw, p])])
        return b.op("Max", [end, b.const([0, 0], "int64")])

    def _onnx_divisor(self, b, x: str, pads: str) -> str:  # type: ignore[no-untyped-def]
        """Window sizes of an average: pool a padded map of ones (padding counts, overhang not)."""
        k, s = list(self.kernel), list(self.stride)
        hw = b.op("Shape", [x], start=2)
        ones = b.op("Expand", [b.const(np.ones((1, 1, 1, 1))), b.op("Concat", [b.const([1, 1], "int64"), hw], axis=0)])
        if self.count_pad:
            ends = b.op("Slice", [pads, b.const([6], "int64"), b.const([8], "int64")])
            real = b.op("Min", [ends, b.const(list(self.pad), "int64")])
            first = b.op("Concat", [b.const([0, 0, *self.pad, 0, 0], "int64"), real], axis=0)
            ones = b.op("Pad", [ones, first, b.const(1.0)])
            rest = b.op("Concat", [b.const([0] * 6, "int64"), b.op("Sub", [ends, real])], axis=0)
            ones = b.op("Pad", [ones, rest])
        else:
            ones = b.op("Pad", [ones, pads])
        den = b.op("AveragePool", [ones], kernel_shape=k, strides=s)
        return b.op("Mul", [den, b.const(float(k[0] * k[1]))])


helper("pool2d", '''
def pool2d(x, mode, kernel, stride, pad, ceil, drop, count_pad=True):
    """Pooling whose output size rounds up when ``ceil`` (then, with ``drop``, loses a last window
    starting inside the end padding), with explicit padding computed from the input size; the
    overhang of round-up windows never counts in an average."""
    ends = []
    for n, k, s, p in zip(x.shape[2:], kernel, stride, pad):
        span = n + 2 * p - k
        out = (-(-span // s) if ceil else span // s) + 1
        if drop and (out - 1) * s >= n + p:
            out -= 1
        ends.append(max(0, (out - 1) * s + k - n - p))
    (t, l), (b, r) = pad, ends
    if mode == "max":
        return F.max_pool2d(F.pad(x, (l, r, t, b), value=-math.inf), kernel, stride)
    total = F.avg_pool2d(F.pad(x, (l, r, t, b)), kernel, stride, divisor_override=1)
    if mode == "sum":
        return total
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
    if count_pad:
        ones = F.pad(ones, (l, min(r, l), t, min(b, t)), value=1.0)
        ones = F.pad(ones, (0, r - min(r, l), 0, b - min(b, t)))
    else:
        ones = F.pad(ones, (l, r, t, b))
    return total / F.avg_pool2d(ones, kernel, stride, divisor_override=1)
''')
