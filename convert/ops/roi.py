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
from .codegen import fmt, helper

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


@dataclass(frozen=True, slots=True)
class PSROIPool(Op):
    """R-FCN's position-sensitive ROI pooling: y[r, k, i, j] = mean of x[b_r, (k * G + i) * G + j]
    over bin (i, j) of roi r (G = group size = pooled size); 0 for an empty bin.

    start = round(x1) * scale, end = (round(x2) + 1) * scale (C's round, float32); roi size
    max(end - start, 0.1); bin size = roi size / G; bin i spans [floor(i * bin + start),
    ceil((i + 1) * bin + start)), clipped to the map.
    """

    kind = "psroi_pool"
    dim: int
    group: int
    scale: float

    def batch_free(self, shapes: list[Shape]) -> bool:
        return False

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        x, rois = _check(shapes, "PS ROI pooling")
        if x[1] != self.dim * self.group ** 2:
            raise ShapeError(f"{x[1]} channels, output_dim x group_size² = {self.dim * self.group ** 2} expected")
        return [(rois[0], self.dim, self.group, self.group)]

    def bins(self, rois: np.ndarray, h: int, w: int) -> list[tuple[np.ndarray, np.ndarray]]:
        box = caffe_round(rois[:, 1:5].astype(F32))
        res = []
        for lo, hi, n in ((box[:, 1], box[:, 3], h), (box[:, 0], box[:, 2], w)):
            lo, hi = lo * F32(self.scale), (hi + F32(1)) * F32(self.scale)
            step = (np.maximum(hi - lo, F32(0.1)) / F32(self.group))[:, None]
            i = np.arange(self.group, dtype=F32)[None]
            s = np.clip(np.floor(i * step + lo[:, None]), 0, n)
            e = np.clip(np.ceil((i + 1) * step + lo[:, None]), 0, n)
            res.append((s.astype(np.int64), e.astype(np.int64)))
        return res

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, rois = xs[0], xs[1].reshape(-1, 5)
        g = self.group
        (hs, he), (ws, we) = self.bins(rois, *x.shape[2:])
        b, ok = batch_index(rois, x.shape[0])
        xg = x.reshape(x.shape[0], self.dim, g, g, *x.shape[2:])
        y = np.zeros((len(rois), self.dim, g, g))
        for r in np.flatnonzero(ok):
            for i in range(g):
                for j in range(g):
                    win = xg[b[r], :, i, j, hs[r, i]:he[r, i], ws[r, j]:we[r, j]]
                    if win.size:
                        y[r, :, i, j] = win.mean(axis=(1, 2))
        return [y]

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        return f"ps_roi_pool({args[0]}, {args[1]}, {self.dim}, {self.group}, {fmt(self.scale)})"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        from .roi_onnx import psroi_onnx

        psroi_onnx(self, b, ins, outs)


helper("ps_roi_pool", '''
def ps_roi_pool(x, rois, dim, group, scale):
    """R-FCN's PSROIPooling: the mean of each bin over its own channel group, 0 for an empty bin.
    Bin bounds in float32 as Caffe computes them; a roi whose batch index is outside [0, N) gives 0."""
    rois = rois.reshape(-1, 5).float()
    box = torch.sign(rois[:, 1:5]) * torch.floor(torch.abs(rois[:, 1:5]) + 0.5)  # C's round()

    def masks(lo, hi, n):
        lo, hi = lo * scale, (hi + 1) * scale
        step = (torch.clamp(hi - lo, min=0.1) / group)[:, None]
        i = torch.arange(group, dtype=torch.float32, device=x.device)[None]
        s = torch.clamp(torch.floor(i * step + lo[:, None]), 0, n)
        e = torch.clamp(torch.ceil((i + 1) * step + lo[:, None]), 0, n)
        at = torch.arange(n, device=x.device)
        return ((at >= s[..., None]) & (at < e[..., None])).to(x.dtype), torch.clamp(e - s, min=0)

    mh, nh = masks(box[:, 1], box[:, 3], x.shape[2])
    mw, nw = masks(box[:, 0], box[:, 2], x.shape[3])
    b = torch.trunc(rois[:, 0]).long()
    xs = x.reshape(x.shape[0], dim, group, group, *x.shape[2:])
    y = x.new_zeros(rois.shape[0], dim, group, group)
    for n in range(x.shape[0]):
        sel = b == n
        if bool(sel.any()):
            y[sel] = torch.einsum("kijhw,rih,rjw->rkij", xs[n], mh[sel], mw[sel])
    area = (nh[:, :, None] * nw[:, None, :]).to(x.dtype)
    return y / torch.clamp(area, min=1)[:, None]
''')


def generate_anchors(base: int, ratios: tuple[float, ...], scales: tuple[float, ...]) -> np.ndarray:
    """py-faster-rcnn's anchors (A, 4): per ratio (width rounded, height = round(width * ratio),
    area kept near base²), then per scale, all centred on the base box [0, 0, base - 1, base - 1]."""
    ctr = (base - 1) / 2
    res = []
    for r in ratios:
        w = np.round(np.sqrt(base * base / r))
        h = np.round(w * r)
        for s in scales:
            res.append([ctr - (w * s - 1) / 2, ctr - (h * s - 1) / 2, ctr + (w * s - 1) / 2, ctr + (h * s - 1) / 2])
    return np.array(res, np.float64)


def nms_keep(boxes: np.ndarray, thresh: float, limit: int) -> list[int]:
    """Greedy NMS over boxes sorted by score (py-faster-rcnn's: areas with +1, a box is dropped
    unless its overlap with a kept one is <= thresh, so a NaN overlap drops it); at most limit."""
    x1, y1, x2, y2 = boxes.T
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    removed = np.zeros(len(boxes), bool)
    keep: list[int] = []
    for i in range(len(boxes)):
        if removed[i]:
            continue
        keep.append(i)
        if len(keep) == limit:
            break
        w = np.maximum(0.0, np.minimum(x2[i], x2) - np.maximum(x1[i], x1) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2) - np.maximum(y1[i], y1) + 1)
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            removed |= ~(inter / (area[i] + area - inter) <= thresh)
    return keep


@dataclass(frozen=True, slots=True)
class Proposal(Op):
    """Faster R-CNN's region proposals (py-faster-rcnn's ProposalLayer; Caffe's C++ Proposal).

    Inputs: scores (1, 2A, H, W) (the last A channels are the objectness), deltas (1, 4A, H, W),
    im_info (1, 3+) = [height, width, scale]. Anchor a at cell (y, x) is anchors[a] shifted by
    stride * (x, y, x, y); decoded with the +1 widths (ctr = x1 + w/2; w' = exp(dw) w; box =
    ctr' ± w'/2), clipped to [0, width - 1] x [0, height - 1], kept when both sides (+1) are at
    least min_size * scale, sorted by score (descending, ties by position: y, x, a), the first
    ``pre`` taken, greedy NMS (+1 areas) at ``thresh``, the first ``post`` kept.

    Output: a fixed (rows, 5) block [0, x1, y1, x2, y2] (and scores (rows, 1)), rows = post (or
    pre, or H * W * A when those are <= 0); rows past the proposals found are 0, as OpenCV gives
    them (py-faster-rcnn returns only the rows found).
    """

    kind = "proposal"
    anchors: tuple[tuple[float, float, float, float], ...]
    stride: float
    min_size: float
    pre: int
    post: int
    thresh: float
    with_scores: bool = False

    def batch_free(self, shapes: list[Shape]) -> bool:
        return False  # one image (py-faster-rcnn: "only single item batches are supported")

    def rows(self, h: int, w: int) -> int:
        return next(n for n in (self.post, self.pre, h * w * len(self.anchors)) if n > 0)

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s, d, info = shapes
        a = len(self.anchors)
        if len(s) != 4 or s[0] != 1 or s[1] != 2 * a:
            raise ShapeError(f"scores must be (1, {2 * a}, H, W) for {a} anchors, got {list(s)}")
        if tuple(d) != (1, 4 * a, *s[2:]):
            raise ShapeError(f"deltas must be (1, {4 * a}, {s[2]}, {s[3]}), got {list(d)}")
        if len(info) < 2 or info[0] != 1 or info[1] < 3 or any(n != 1 for n in info[2:]):
            raise ShapeError(f"im_info must be (1, 3): height, width, scale; got {list(info)}")
        n = self.rows(*s[2:])
        return [(n, 5), (n, 1)] if self.with_scores else [(n, 5)]

    def decoded(self, scores: np.ndarray, deltas: np.ndarray, info: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every anchor's clipped box (K * A, 4) and objectness (K * A,), in (y, x, a) order."""
        a = len(self.anchors)
        h, w = scores.shape[2:]
        sx, sy = np.meshgrid(np.arange(w) * self.stride, np.arange(h) * self.stride)
        shifts = np.stack([sx, sy, sx, sy], -1).reshape(-1, 1, 4)
        anchors = (np.array(self.anchors) + shifts).reshape(-1, 4)
        dl = deltas[0].reshape(a, 4, h, w).transpose(2, 3, 0, 1).reshape(-1, 4)
        score = scores[0, a:].transpose(1, 2, 0).reshape(-1)
        bw, bh = anchors[:, 2] - anchors[:, 0] + 1, anchors[:, 3] - anchors[:, 1] + 1
        cx, cy = anchors[:, 0] + 0.5 * bw + dl[:, 0] * bw, anchors[:, 1] + 0.5 * bh + dl[:, 1] * bh
        with np.errstate(over="ignore"):
            pw, ph = np.exp(dl[:, 2]) * bw, np.exp(dl[:, 3]) * bh
        box = np.stack([cx - 0.5 * pw, cy - 0.5 * ph, cx + 0.5 * pw, cy + 0.5 * ph], 1)
        hi = np.array([info[1] - 1, info[0] - 1, info[1] - 1, info[0] - 1])
        return np.maximum(np.minimum(box, hi), 0), score

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        info = xs[2].reshape(-1)
        box, score = self.decoded(xs[0], xs[1], info)
        least = self.min_size * info[2]
        ok = np.flatnonzero((box[:, 2] - box[:, 0] + 1 >= least) & (box[:, 3] - box[:, 1] + 1 >= least))
        order = ok[np.argsort(-score[ok], kind="stable")]
        order = order[:self.pre] if self.pre > 0 else order
        n = self.rows(*xs[0].shape[2:])
        keep = order[nms_keep(box[order], self.thresh, n)]
        rois, scores = np.zeros((n, 5)), np.zeros((n, 1))
        rois[:len(keep), 1:] = box[keep]
        scores[:len(keep), 0] = score[keep]
        return [rois, scores] if self.with_scores else [rois]

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        anchors = [list(map(fmt, a)) for a in self.anchors]
        call = (f"proposal({', '.join(args)}, torch.tensor([{', '.join('[' + ', '.join(a) + ']' for a in anchors)}]), "
                f"{fmt(self.stride)}, {fmt(self.min_size)}, {self.pre}, {self.post}, {fmt(self.thresh)})")
        return call if self.with_scores else f"{call}[0]"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        from .roi_onnx import proposal_onnx

        proposal_onnx(self, b, ins, outs)


helper("proposal", '''
def proposal(scores, deltas, im_info, anchors, stride, min_size, pre, post, thresh):
    """Faster R-CNN proposals (py-faster-rcnn): (rows, 5) [0, x1, y1, x2, y2] and (rows, 1) scores,
    rows past the proposals found are 0."""
    a, (h, w) = anchors.shape[0], scores.shape[2:]
    dev, info = scores.device, im_info.reshape(-1).float()
    ys, xs = torch.meshgrid(torch.arange(h, device=dev) * stride, torch.arange(w, device=dev) * stride, indexing="ij")
    shifts = torch.stack([xs, ys, xs, ys], -1).reshape(-1, 1, 4).float()
    anc = (anchors.to(dev) + shifts).reshape(-1, 4)
    d = deltas[0].reshape(a, 4, h, w).permute(2, 3, 0, 1).reshape(-1, 4)
    score = scores[0, a:].permute(1, 2, 0).reshape(-1)
    bw, bh = anc[:, 2] - anc[:, 0] + 1, anc[:, 3] - anc[:, 1] + 1
    cx, cy = anc[:, 0] + 0.5 * bw + d[:, 0] * bw, anc[:, 1] + 0.5 * bh + d[:, 1] * bh
    pw, ph = torch.exp(d[:, 2]) * bw, torch.exp(d[:, 3]) * bh
    box = torch.stack([cx - 0.5 * pw, cy - 0.5 * ph, cx + 0.5 * pw, cy + 0.5 * ph], 1)
    hi = torch.stack([info[1] - 1, info[0] - 1, info[1] - 1, info[0] - 1])
    box = torch.clamp(torch.minimum(box, hi), min=0)
    least = min_size * info[2]
    ok = torch.nonzero((box[:, 2] - box[:, 0] + 1 >= least) & (box[:, 3] - box[:, 1] + 1 >= least))[:, 0]
    order = ok[torch.sort(-score[ok], stable=True)[1]]
    order = order[:pre] if pre > 0 else order
    n = post if post > 0 else pre if pre > 0 else h * w * a
    cand = box[order]
    x1, y1, x2, y2 = cand.unbind(1)
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    removed = torch.zeros(len(order), dtype=torch.bool, device=dev)
    keep = []
    for i in range(len(order)):
        if removed[i]:
            continue
        keep.append(i)
        if len(keep) == n:
            break
        iw = torch.clamp(torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1) + 1, min=0)
        ih = torch.clamp(torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1) + 1, min=0)
        inter = iw * ih
        removed |= ~(inter / (area[i] + area - inter) <= thresh)
    keep = order[torch.tensor(keep, dtype=torch.long, device=dev)]
    rois, out = scores.new_zeros(n, 5), scores.new_zeros(n, 1)
    rois[:len(keep), 1:] = box[keep]
    out[:len(keep), 0] = score[keep]
    return rois, out
''')
