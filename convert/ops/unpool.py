"""Max unpooling driven by a max pooling's argmax (Torch7's SpatialMaxUnpooling and its partner).

The op takes the pooled values to scatter and the *input of the partner pooling*: the argmax
positions are recomputed from that input with the pooling's window, so no index tensor travels
through the IR (and every backend uses its own, equivalent, indices).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .pool import Pool, pooled_size


@dataclass(frozen=True, slots=True)
class MaxUnpool(Op):
    """y = zeros like src; y[n, c, argmax window(i, j) of src] = x[n, c, i, j].

    Windows of ``kernel``, ``stride``, ``pad`` over ``src`` (inputs: x, src), counted by the THNN /
    PyTorch rule (``ceil``: round up, then drop a last window starting in the end padding). The
    argmax is the first maximum in row-major window order (THNN and PyTorch keep a value only when
    it is strictly greater). Kernel equals stride, so windows never overlap and each position of
    y is written at most once.
    """

    kind = "max_unpool"
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int] = (0, 0)
    ceil: bool = False

    def pooled(self, h: int, w: int) -> tuple[int, int]:
        return tuple(pooled_size(n, k, s, p, self.ceil, True)  # type: ignore[return-value]
                     for n, k, s, p in zip((h, w), self.kernel, self.stride, self.pad))

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        x, src = shapes
        if len(x) != 4 or len(src) != 4:
            raise ShapeError(f"max unpooling needs 4-D inputs, got {list(x)} and {list(src)}")
        if self.kernel != self.stride or any(2 * p > k for p, k in zip(self.pad, self.kernel)):
            raise ShapeError(f"kernel {list(self.kernel)} must equal stride {list(self.stride)} and "
                             f"pad {list(self.pad)} be at most half the kernel")
        want = (*src[:2], *self.pooled(*src[2:]))
        if tuple(x) != want:
            raise ShapeError(f"input {list(x)} is not the shape {list(want)} its pooling gave")
        return [tuple(src)]

    def argmax(self, src: np.ndarray) -> np.ndarray:
        """Flat H*W index of each window's first maximum: (N, C, oh, ow)."""
        n, c, h, w = src.shape
        (oh, ow), (kh, kw), (sh, sw), (ph, pw) = self.pooled(h, w), self.kernel, self.stride, self.pad
        xp = np.pad(src, ((0, 0), (0, 0), (ph, kh), (pw, kw)), constant_values=-np.inf)
        best = np.full((n, c, oh, ow), -np.inf)
        idx = np.full((n, c, oh, ow), -1, dtype=np.int64)
        rows, cols = np.arange(oh) * sh - ph, np.arange(ow) * sw - pw
        for i in range(kh):
            for j in range(kw):
                v = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                better = (v > best) | np.isnan(v)  # THNN: a NaN always wins
                best = np.where(better, v, best)
                at = (rows[:, None] + i) * w + cols[None, :] + j
                idx = np.where(better, at, idx)
        return idx

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, src = xs
        n, c, h, wd = src.shape
        y = np.zeros((n, c, h * wd))
        np.put_along_axis(y, self.argmax(src).reshape(n, c, -1), x.reshape(n, c, -1), axis=2)
        return [y.reshape(src.shape)]

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        k, s, p = self.kernel, self.stride, self.pad
        idx = f"F.max_pool2d({args[1]}, {k}, {s}, {p}, ceil_mode={self.ceil}, return_indices=True)[1]"
        return f"F.max_unpool2d({args[0]}, {idx}, {k}, {s}, {p}, output_size={args[1]}.shape[2:])"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        k, s, src = list(self.kernel), list(self.stride), ins[1]
        if self.ceil:  # round-up windows: -inf end padding sized in the graph, cropped off at the end
            ends = Pool("max", self.kernel, self.stride, self.pad, True, True)._onnx_ends(b, src)
            src = b.op("Pad", [src, b.op("Concat", [b.const([0] * 6, "int64"), ends], axis=0),
                               b.const(-np.inf)])
        pads = [*self.pad, *(self.pad if not self.ceil else (0, 0))]
        vals, idx = b.fresh("pooled"), b.fresh("indices")
        b.op("MaxPool", [src], [vals, idx], kernel_shape=k, strides=s, pads=pads)
        y = b.op("MaxUnpool", [ins[0], idx, b.op("Shape", [src])], None if self.ceil else outs,
                 kernel_shape=k, strides=s, pads=pads)
        if self.ceil:
            hw = b.op("Shape", [ins[1]], start=2)
            b.op("Slice", [y, b.const([0, 0], "int64"), hw, b.const([2, 3], "int64")], outs)
