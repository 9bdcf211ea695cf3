"""2-D max / average / sum pooling with an explicit output size.

Frameworks differ in how they round the output size (Caffe and Torch7's ``:ceil()`` round up and
drop a last window that would start inside the padding) and in what the average divides by. The
frontend computes the output size by its framework's rule; this op then pads and crops explicitly,
so no backend's own rounding (ceil_mode) is relied on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from . import helper


def pooled_size(n: int, k: int, s: int, p: int, ceil: bool, drop: bool) -> int:
    """Round (n + 2p - k)/s up or down, plus one; with ``drop``, then drop a last window that
    would start inside the end padding. Caffe drops when the layer has any padding (on either
    axis); Torch7's and PyTorch's ceil modes always drop."""
    span = n + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if drop and (out - 1) * s >= n + p:
        out -= 1
    return out


def plan(n: int, k: int, s: int, p: int, out: int) -> tuple[int, int, int]:
    """(input extent used, begin pad, end pad) so that a floor-mode window count gives ``out``."""
    used = min(n, (out - 1) * s + k - p)
    end = (out - 1) * s + k - used - p
    return used, p, end


@dataclass(frozen=True, slots=True)
class Pool(Op):
    """y = max | mean | sum over each window of the zero/-inf padded input.

    mode "avg" divides by the window clipped to the padded bounds (Caffe, and Torch7's
    count_include_pad=true) when ``count_pad``, else by the window clipped to the data. Windows
    that overhang past the end padding (ceil rounding) never count the overhang. mode "sum" is
    Torch7's legacy ``divide=false`` average. ``out`` is the output size (oh, ow).
    """

    kind = "pool"
    mode: str
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    out: tuple[int, int]
    count_pad: bool = True

    def plans(self, h: int, w: int) -> list[tuple[int, int, int]]:
        return [plan(n, k, s, p, o) for n, k, s, p, o in
                zip((h, w), self.kernel, self.stride, self.pad, self.out)]

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4:
            raise ShapeError(f"pooling needs a 4-D input, got {list(shapes[0])}")
        n, c, h, wd = shapes[0]
        for p, k in zip(self.pad, self.kernel):
            if p >= k:
                raise ShapeError(f"pad {p} must be smaller than kernel {k}")
        for (used, p, end), k, s, o in zip(self.plans(h, wd), self.kernel, self.stride, self.out):
            if used + p + end < k or end < 0 or o < 1:
                raise ShapeError(f"kernel {list(self.kernel)} does not fit input {h}x{wd}")
            if (o - 1) * s >= used + p:
                raise ShapeError(f"output size {list(self.out)} puts a window past the input")
        return [(n, c, *self.out)]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        (uh, ph, eh), (uw, pw, ew) = self.plans(*x.shape[2:])
        x = x[:, :, :uh, :uw]
        fill = -np.inf if self.mode == "max" else 0.0
        xp = np.pad(x, ((0, 0), (0, 0), (ph, eh), (pw, ew)), constant_values=fill)
        counted = np.zeros((1, 1, *xp.shape[2:]))
        if self.count_pad:  # the padded bounds count, the overhang beyond them does not
            counted[:, :, :ph + uh + min(eh, ph), :pw + uw + min(ew, pw)] = 1
        else:
            counted[:, :, ph:ph + uh, pw:pw + uw] = 1
        acc, den = None, 0.0
        (kh, kw), (sh, sw), (oh, ow) = self.kernel, self.stride, self.out
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

    def torch_native(self, h: int, w: int) -> bool | None:
        """ceil_mode for which torch's own pooling computes exactly this op, or None."""
        if any(p > k // 2 for p, k in zip(self.pad, self.kernel)):
            return None
        for ceil in (False, True):
            if all(pooled_size(n, k, s, p, ceil, ceil) == o for n, k, s, p, o in
                   zip((h, w), self.kernel, self.stride, self.pad, self.out)):
                if ceil and self.mode != "max" and not self.count_pad:
                    return None  # torch's ceil + exclude-pad divisor differs at the overhang
                return ceil
        return None


    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        h, w = shapes[0][2:]
        k, s, p = self.kernel, self.stride, self.pad
        ceil = self.torch_native(h, w)
        if ceil is not None:
            sq = lambda v: v[0] if v[0] == v[1] else v  # noqa: E731
            opts = [str(sq(k)), str(sq(s))] + ([f"padding={sq(p)}"] if any(p) else [])
            opts += ["ceil_mode=True"] if ceil else []
            if self.mode == "max":
                return f"F.max_pool2d({args[0]}, {', '.join(opts)})"
            opts += [] if self.count_pad or not any(p) else ["count_include_pad=False"]
            opts += ["divisor_override=1"] if self.mode == "sum" else []
            return f"F.avg_pool2d({args[0]}, {', '.join(opts)})"
        (uh, ph, eh), (uw, pw, ew) = self.plans(h, w)
        return (f"pool2d({args[0]}, {self.mode!r}, {k}, {s}, used={(uh, uw)}, "
                f"pads={(ph, pw, eh, ew)}, count_pad={self.count_pad})")

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        n, c, h, wd = b.shape(ins[0])
        (uh, ph, eh), (uw, pw, ew) = self.plans(h, wd)
        x = ins[0]
        if (uh, uw) != (h, wd):
            x = b.op("Slice", [x, b.const([0, 0], "int64"), b.const([uh, uw], "int64"),
                               b.const([2, 3], "int64")])
        k, s = list(self.kernel), list(self.stride)
        if self.mode == "max":
            b.op("MaxPool", [x], outs, kernel_shape=k, strides=s, pads=[ph, pw, eh, ew])
            return
        if self.mode == "sum":
            y = b.op("AveragePool", [x], kernel_shape=k, strides=s, pads=[ph, pw, eh, ew],
                     count_include_pad=1)
            b.op("Mul", [y, b.const(float(k[0] * k[1]))], outs)
            return
        if self.count_pad and (ph or pw):  # real padding counts: make it data, exclude overhang
            rh, rw = min(eh, ph), min(ew, pw)
            x = b.op("Pad", [x, b.const([0, 0, ph, pw, 0, 0, rh, rw], "int64")])
            ph, pw, eh, ew = 0, 0, eh - rh, ew - rw
        b.op("AveragePool", [x], outs, kernel_shape=k, strides=s, pads=[ph, pw, eh, ew],
             count_include_pad=0)


helper("pool2d", '''
def pool2d(x, mode, kernel, stride, used, pads, count_pad=True):
    """Pooling with explicit padding: pads = (top, left, bottom, right), where bottom/right
    include the overhang of round-up windows; the overhang never counts in an average."""
    x = x[:, :, :used[0], :used[1]]
    t, l, b, r = pads
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
