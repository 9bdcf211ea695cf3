"""Region-of-interest pooling (Fast/Faster R-CNN's ROIPooling, R-FCN's PSROIPooling).

rois are (R, 5) rows ``[batch_index, x1, y1, x2, y2]`` in image coordinates. Bin boundaries are
computed in float32 exactly as Caffe's layers compute them (the rounding is the semantics: a
different rounding moves a bin by a pixel), the pooled values in the backend's precision.

A batch index is truncated toward zero (C's float-to-int cast). Caffe aborts on one outside
[0, N); here such a roi reads no image and its output is 0 in every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from . import fmt, helper

F32 = np.float32


def caffe_round(v: np.ndarray) -> np.ndarray:
    """C's round(): halves away from zero (NumPy's round goes to even)."""
    return np.sign(v) * np.floor(np.abs(v) + F32(0.5))


def _check(shapes: list[Shape], what: str) -> tuple[Shape, Shape]:
    x, rois = shapes
    if len(x) != 4:
        raise ShapeError(f"{what} needs a 4-D feature map, got {list(x)}")
    if len(rois) < 2 or rois[1] != 5 or any(d != 1 for d in rois[2:]):
        raise ShapeError(f"{what} needs rois of shape (R, 5), got {list(rois)}")
    return x, rois


def batch_index(rois: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(index clamped into [0, n), whether it was in range) per roi."""
    b = np.trunc(rois[:, 0]).astype(np.int64)
    return np.clip(b, 0, n - 1), (b >= 0) & (b < n)


@dataclass(frozen=True, slots=True)
class ROIPool(Op):
    """y[r, c, i, j] = max of x[b_r, c] over bin (i, j) of roi r; 0 for an empty bin (Caffe).

    start = round(x1 * scale), end = round(x2 * scale) (C's round, float32); roi size
    max(end - start + 1, 1); bin size = roi size / pooled (float32); bin i spans
    [floor(i * bin) + start, ceil((i + 1) * bin) + start), clipped to the map.
    """

    kind = "roi_pool"
    pooled: tuple[int, int]  # (h, w)
    scale: float

    def batch_free(self, shapes: list[Shape]) -> bool:
        return False  # the output's axis 0 is the rois', not the images'

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        x, rois = _check(shapes, "ROI pooling")
        return [(rois[0], x[1], *self.pooled)]

    def bins(self, rois: np.ndarray, h: int, w: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(starts, ends) along h, (starts, ends) along w], each (R, pooled) int64."""
        box = caffe_round(rois[:, 1:5].astype(F32) * F32(self.scale))
        res = []
        for lo, hi, p, n in ((box[:, 1], box[:, 3], self.pooled[0], h), (box[:, 0], box[:, 2], self.pooled[1], w)):
            size = np.maximum(hi - lo + 1, F32(1))
            step = (size / F32(p))[:, None]
            i = np.arange(p, dtype=F32)[None]
            s = np.clip(np.floor(i * step) + lo[:, None], 0, n)
            e = np.clip(np.ceil((i + 1) * step) + lo[:, None], 0, n)
            res.append((s.astype(np.int64), e.astype(np.int64)))
        return res

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, rois = xs[0], xs[1].reshape(-1, 5)
        (hs, he), (ws, we) = self.bins(rois, *x.shape[2:])
        b, ok = batch_index(rois, x.shape[0])
        y = np.zeros((len(rois), x.shape[1], *self.pooled))
        for r in np.flatnonzero(ok):
            for i in range(self.pooled[0]):
                for j in range(self.pooled[1]):
                    win = x[b[r], :, hs[r, i]:he[r, i], ws[r, j]:we[r, j]]
                    if win.size:
                        y[r, :, i, j] = win.max(axis=(1, 2))
        return [y]

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        return f"roi_max_pool({args[0]}, {args[1]}, {self.pooled}, {fmt(self.scale)})"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        # ONNX MaxRoiPool (ONNX Runtime's kernel) rounds and bins as Caffe does; the batch index
        # is made safe first (out of range: clamped, then its output zeroed).
        rois, keep = onnx_batch_index(b, ins[0], ins[1])
        y = b.op("MaxRoiPool", [ins[0], rois], pooled_shape=list(self.pooled), spatial_scale=float(self.scale))
        b.op("Mul", [y, keep], outs)


def onnx_batch_index(b, x: str, rois: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """rois with the batch index truncated and clamped into [0, N), and a (R, 1, 1, 1) float mask
    of the rois whose index was in range."""
    r = b.op("Reshape", [rois, b.const([-1, 5], "int64")])
    idx, box = b.fresh("index"), b.fresh("box")
    b.op("Split", [r, b.const([1, 4], "int64")], [idx, box], axis=1)
    t = b.op("Mul", [b.op("Sign", [idx]), b.op("Floor", [b.op("Abs", [idx])])])  # trunc
    n = b.op("Cast", [b.op("Shape", [x], start=0, end=1)], to=1)
    last = b.op("Sub", [n, b.const([1.0])])
    ok = b.op("And", [b.op("GreaterOrEqual", [t, b.const(0.0)]), b.op("LessOrEqual", [t, last])])
    clamped = b.op("Min", [b.op("Max", [t, b.const(0.0)]), last])
    keep = b.op("Reshape", [b.op("Cast", [ok], to=1), b.const([-1, 1, 1, 1], "int64")])
    return b.op("Concat", [clamped, box], axis=1), keep


helper("roi_max_pool", '''
def roi_max_pool(x, rois, pooled, scale):
    """Caffe's ROIPooling: max over each bin of each roi, 0 for an empty bin. Bin bounds in float32
    as Caffe computes them; a roi whose batch index is outside [0, N) gives 0."""
    rois = rois.reshape(-1, 5).float()
    box = rois[:, 1:5] * scale
    box = torch.sign(box) * torch.floor(torch.abs(box) + 0.5)  # C's round(), not torch.round

    def bounds(lo, hi, p, n):
        step = (torch.clamp(hi - lo + 1, min=1.0) / p)[:, None]
        i = torch.arange(p, dtype=torch.float32, device=x.device)[None]
        s, e = torch.floor(i * step) + lo[:, None], torch.ceil((i + 1) * step) + lo[:, None]
        return s.clamp(0, n).long(), e.clamp(0, n).long()

    hs, he = bounds(box[:, 1], box[:, 3], pooled[0], x.shape[2])
    ws, we = bounds(box[:, 0], box[:, 2], pooled[1], x.shape[3])
    b = torch.trunc(rois[:, 0]).long()
    ok, b = (b >= 0) & (b < x.shape[0]), b.clamp(0, x.shape[0] - 1)
    y = x.new_zeros(rois.shape[0], x.shape[1], *pooled)
    hh, ww = torch.arange(x.shape[2], device=x.device), torch.arange(x.shape[3], device=x.device)
    mh = (hh >= hs[..., None]) & (hh < he[..., None])  # (R, PH, H)
    mw = (ww >= ws[..., None]) & (ww < we[..., None])  # (R, PW, W)
    span = torch.stack([hs[:, 0], he[:, -1], ws[:, 0], we[:, -1]], 1).tolist()
    for r, (y0, y1, x0, x1) in enumerate(span):  # each roi's bins lie inside [y0, y1) x [x0, x1)
        if y1 > y0 and x1 > x0:
            f = x[b[r], :, y0:y1, x0:x1]
            t = torch.where(mw[r, None, None, :, x0:x1], f[:, :, None, :], -math.inf).amax(-1)
            y[r] = torch.where(mh[r, None, :, y0:y1, None], t[:, None], -math.inf).amax(2)
    empty = (he <= hs)[:, None, :, None] | (we <= ws)[:, None, None, :] | ~ok[:, None, None, None]
    return torch.where(empty, 0.0, y)
''')
