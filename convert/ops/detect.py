"""SSD detection head (Wei Liu's Caffe fork): PriorBox and DetectionOutput.

Boxes are (xmin, ymin, xmax, ymax), normalized by the image size. Both ops follow the input size
at run time: PriorBox reads the feature map's and the image's sizes from its inputs.

DetectionOutput gives a fixed-size, padded list on every backend: ``rows`` rows per image (image i
owns rows [i*rows, (i+1)*rows)), its detections first in Caffe's order (label ascending, score
descending), then padding rows [i, -1, -1, -1, -1, -1, -1]. Caffe and OpenCV give only the
detections (Caffe: one row [i, -1, ...] for an image with none); rows whose label is -1 are not
detections (``convert.detections`` compares the lists after dropping them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .bbox import decode
from .codegen import fmt, helper
from .detect_onnx import detection_output_onnx, prior_box_onnx

CODES = ("corner", "center_size", "corner_size")


@dataclass(frozen=True, slots=True)
class PriorBox(Op):
    """Prior (anchor) boxes of a feature map x (N, C, H, W) for an image (N, C', IH, IW).

    For cell (h, w) the centre is cx = (w + offset) * step_w, cy = (h + offset) * step_h
    (step = image size / map size unless given); each prior k of ``sizes`` (width, height in
    pixels) gives ((cx - bw/2) / IW, (cy - bh/2) / IH, (cx + bw/2) / IW, (cy + bh/2) / IH),
    clipped to [0, 1] when ``clip``. y = (1, 2, H*W*K*4): the boxes (order h, w, k, coordinate),
    then the four ``variance`` values repeated per box. ``img`` (h, w), when not 0, replaces the
    image input's size; ``step`` (h, w), when not 0, the derived steps."""

    kind = "prior_box"
    sizes: tuple[tuple[float, float], ...]
    variance: tuple[float, ...] = (0.1, 0.1, 0.1, 0.1)
    img: tuple[int, int] = (0, 0)
    step: tuple[float, float] = (0.0, 0.0)
    offset: float = 0.5
    clip: bool = False

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4 or (not self.img[0] and len(shapes[1]) != 4):
            raise ShapeError(f"PriorBox needs 4-D inputs, got {[list(s) for s in shapes]}")
        return [(1, 2, shapes[0][2] * shapes[0][3] * len(self.sizes) * 4)]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        h, wd = xs[0].shape[2:]
        ih, iw = self.img if self.img[0] else xs[1].shape[2:]
        sh, sw = self.step[0] or ih / h, self.step[1] or iw / wd
        cy = ((np.arange(h) + self.offset) * sh)[:, None, None]
        cx = ((np.arange(wd) + self.offset) * sw)[None, :, None]
        half = np.array(self.sizes, dtype=np.float64) / 2
        parts = [(cx - half[:, 0]) / iw, (cy - half[:, 1]) / ih, (cx + half[:, 0]) / iw, (cy + half[:, 1]) / ih]
        boxes = np.stack(np.broadcast_arrays(*parts), -1).reshape(-1)
        if self.clip:
            boxes = np.clip(boxes, 0.0, 1.0)
        var = np.tile(np.array(self.variance, dtype=np.float64), boxes.size // 4)
        return [np.stack([boxes, var])[None]]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        sizes = tuple((fmt(a), fmt(b)) for a, b in self.sizes)
        s = "(" + ", ".join(f"({a}, {b})" for a, b in sizes) + ",)"
        var = "(" + ", ".join(fmt(v) for v in self.variance) + ")"
        return (f"prior_box({args[0]}, {args[1]}, {s}, {var}, {self.img}, "
                f"({fmt(self.step[0])}, {fmt(self.step[1])}), {fmt(self.offset)}, {self.clip})")

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        prior_box_onnx(self, b, ins, outs)


helper("prior_box", '''
def prior_box(x, image, sizes, variance, img, step, offset, clip):
    """SSD prior boxes of feature map x (sizes: prior (width, height) in pixels): (1, 2, H*W*K*4),
    the normalized boxes (xmin, ymin, xmax, ymax) then their variances."""
    h, w = x.shape[-2:]
    ih, iw = img if img[0] else image.shape[-2:]
    sh, sw = step[0] or ih / h, step[1] or iw / w
    f64 = dict(dtype=torch.float64, device=x.device)
    cy = ((torch.arange(h, **f64) + offset) * sh).view(h, 1, 1)
    cx = ((torch.arange(w, **f64) + offset) * sw).view(1, w, 1)
    half = torch.tensor(sizes, **f64) / 2
    parts = ((cx - half[:, 0]) / iw, (cy - half[:, 1]) / ih, (cx + half[:, 0]) / iw, (cy + half[:, 1]) / ih)
    boxes = torch.stack(torch.broadcast_tensors(*parts), -1).reshape(-1)
    if clip:
        boxes = boxes.clamp(0, 1)
    var = torch.tensor(variance, **f64).repeat(boxes.numel() // 4)
    return torch.stack([boxes, var]).unsqueeze(0).to(x.dtype)
''')


@dataclass(frozen=True, slots=True)
class DetectionOutput(Op):
    """SSD detections from loc (N, P*L*4), conf (N, P*C) (probabilities) and priors (1, 2, P*4)
    (boxes then variances; (1, 1, P*4[, 1]), the boxes only, when ``encoded``).

    Boxes are decoded per ``code`` (corner: prior + v*loc; corner_size: prior + v*loc*(pw, ph,
    pw, ph); center_size: centre + v01*loc01*(pw, ph), size * exp(v23*loc23)), v the prior's
    variances (1 when ``encoded``); L = 1 when ``share`` else C. Per image and class other than
    ``background``: scores > ``threshold``, sorted descending (ties by prior index), the first
    ``top_k``, greedy NMS (keep a box when its Jaccard overlap with every kept box is <= t,
    normalized boxes without +1, 0 unless the intersection has positive width and height; t
    starts at ``nms_threshold`` and is multiplied by ``eta`` after
    each kept box while t > 0.5). Then the ``keep_top_k`` best of all classes (ties by label then
    NMS order). y = (1, 1, N*rows, 7), rows [image, label, score, xmin, ymin, xmax, ymax], padded
    per image with [image, -1, ...] (see the module docstring).

    ``normalized`` false is OpenCV's ``normalized_bbox: false`` (boxes in pixels): center_size
    decodes with prior width xmax - xmin + 1 (height likewise) and centre xmin + width / 2, and the
    overlap counts sizes as (w + 1) * (h + 1), the intersection when w >= 0 and h >= 0."""

    kind = "detection_output"
    num_classes: int
    share: bool = True
    background: int = 0
    nms_threshold: float = 0.3
    top_k: int = -1
    eta: float = 1.0
    threshold: float = -math.inf
    keep_top_k: int = -1
    code: str = "corner"
    encoded: bool = False
    normalized: bool = True

    def rows(self, priors: int) -> int:
        """Rows per image: the most detections an image can have (at least 1)."""
        per_class = priors if self.top_k < 0 else min(self.top_k, priors)
        classes = self.num_classes - (0 <= self.background < self.num_classes)
        most = classes * per_class
        return max(1, most if self.keep_top_k < 0 else min(self.keep_top_k, most))

    def locs(self) -> int:
        return 1 if self.share else self.num_classes

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        loc, conf, pri = shapes
        ok = ((1, 2),) if not self.encoded else ((1, 1), (1, 2))
        if len(pri) not in (3, 4) or pri[3:] not in ((), (1,)) or pri[:2] not in ok or pri[2] % 4:
            want = "(1, 2, P*4)" if not self.encoded else "(1, 1 or 2, P*4[, 1])"
            raise ShapeError(f"priors must have shape {want}, got {list(pri)}")
        p = pri[2] // 4
        if not loc or not conf:
            raise ShapeError(f"loc {list(loc)} and conf {list(conf)} need a batch axis")
        if math.prod(loc[1:]) != p * self.locs() * 4 or loc[0] != conf[0]:
            raise ShapeError(f"loc {list(loc)} does not hold {p} priors x {self.locs()} x 4 values")
        if math.prod(conf[1:]) != p * self.num_classes:
            raise ShapeError(f"conf {list(conf)} does not hold {p} priors x {self.num_classes} classes")
        return [(1, 1, loc[0] * self.rows(p), 7)]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        loc, conf, pri = xs
        n, p = loc.shape[0], pri.shape[2] // 4
        flat = pri.reshape(-1)
        prior = flat[:p * 4].reshape(p, 1, 4)
        var = np.ones_like(prior) if self.encoded else flat[p * 4:].reshape(p, 1, 4)
        boxes = decode(loc.reshape(n, p, self.locs(), 4), prior, var, self.code, np.exp, np.stack,
                       0.0 if self.normalized else 1.0)
        scores = conf.reshape(n, p, self.num_classes)
        rows = self.rows(p)
        out = np.full((n, rows, 7), -1.0)
        out[:, :, 0] = np.arange(n)[:, None]
        for i in range(n):
            dets = self._image(boxes[i], scores[i])
            if dets:
                out[i, :len(dets), 1:] = dets
        return [out.reshape(1, 1, n * rows, 7)]

    def _image(self, boxes: np.ndarray, scores: np.ndarray) -> list[list[float]]:
        dets = []  # (label, prior, score) in label order, then NMS order
        for c in range(self.num_classes):
            if c != self.background:
                bx = boxes[:, 0 if self.share else c]
                dets += [(c, j, scores[j, c]) for j in self._nms(bx, scores[:, c])]
        if 0 <= self.keep_top_k < len(dets):
            best = sorted(range(len(dets)), key=lambda t: -dets[t][2])  # stable
            dets = [dets[t] for t in sorted(best[:self.keep_top_k])]
        return [[c, s, *boxes[j, 0 if self.share else c]] for c, j, s in dets]

    def _nms(self, boxes: np.ndarray, scores: np.ndarray) -> list[int]:
        cand = np.flatnonzero(scores > self.threshold)
        cand = cand[np.argsort(-scores[cand], kind="stable")]
        if self.top_k > -1:
            cand = cand[:self.top_k]
        kept: list[int] = []
        t = self.nms_threshold
        for j in cand:
            if not kept or bool(np.all(jaccard(boxes[j], boxes[kept], self.normalized) <= t)):
                kept.append(int(j))
                if self.eta < 1 and t > 0.5:
                    t *= self.eta
        return kept

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        cfg = (f"classes={self.num_classes}, share={self.share}, background={self.background}, "
               f"nms_threshold={fmt(self.nms_threshold)}, top_k={self.top_k}, eta={fmt(self.eta)}, "
               f"threshold={fmt(self.threshold)}, keep_top_k={self.keep_top_k}, code={self.code!r}, "
               f"encoded={self.encoded}" + ("" if self.normalized else ", normalized=False"))
        return f"detection_output({', '.join(args)}, {cfg})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        detection_output_onnx(self, b, ins, outs)


def jaccard(a: np.ndarray, others: np.ndarray, normalized: bool = True) -> np.ndarray:
    """Caffe's JaccardOverlap of normalized boxes (the CPU one, on NormalizedBBox): box a with each
    of ``others`` (K, 4); 0 unless the intersection has positive width and height, so inverted
    boxes (xmax < xmin) never overlap. Not ``normalized`` (OpenCV's pixel boxes): sizes are
    (w + 1) * (h + 1), the intersection's counted when w >= 0 and h >= 0."""
    one = 0.0 if normalized else 1.0
    iw = np.minimum(others[:, 2], a[2]) - np.maximum(others[:, 0], a[0])
    ih = np.minimum(others[:, 3], a[3]) - np.maximum(others[:, 1], a[1])
    pos = (iw > 0) & (ih > 0) if normalized else (iw >= 0) & (ih >= 0)
    inter = np.where(pos, (iw + one) * (ih + one), 0.0)
    sizes = (others[:, 2] - others[:, 0] + one) * (others[:, 3] - others[:, 1] + one)
    with np.errstate(invalid="ignore", divide="ignore"):  # inter > 0: both sizes are positive
        return np.where(inter > 0, inter / ((a[2] - a[0] + one) * (a[3] - a[1] + one) + sizes - inter), 0.0)


_DECODE = '''
def ssd_decode(loc, prior, var, code, plus=0.0):
    """Caffe's DecodeBBox: boxes from location offsets and priors (xmin, ymin, xmax, ymax); plus 1
    is OpenCV's unnormalized center_size (prior sizes + 1, centres xmin + size / 2)."""
    if code == "corner":
        return prior + var * loc
    pw, ph = prior[..., 2] - prior[..., 0], prior[..., 3] - prior[..., 1]
    if code == "corner_size":
        return prior + var * loc * torch.stack([pw, ph, pw, ph], -1)
    if plus:
        pw, ph = pw + plus, ph + plus
        pcx, pcy = prior[..., 0] + pw / 2, prior[..., 1] + ph / 2
    else:
        pcx, pcy = (prior[..., 0] + prior[..., 2]) / 2, (prior[..., 1] + prior[..., 3]) / 2
    cx = var[..., 0] * loc[..., 0] * pw + pcx
    cy = var[..., 1] * loc[..., 1] * ph + pcy
    bw, bh = torch.exp(var[..., 2] * loc[..., 2]) * pw, torch.exp(var[..., 3] * loc[..., 3]) * ph
    return torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1)
'''

_NMS = '''
def greedy_nms(boxes, scores, threshold, top_k, nms_threshold, eta, normalized=True):
    """Caffe's ApplyNMSFast: indices of the kept boxes, best first. Overlap is Jaccard on
    normalized boxes, 0 unless the intersection has positive width and height (not normalized:
    OpenCV's pixel boxes, sizes (w + 1) * (h + 1), the intersection's when w >= 0 and h >= 0)."""
    cand = torch.nonzero(scores > threshold).flatten()
    cand = cand[torch.sort(scores[cand], descending=True, stable=True).indices]
    cand = cand[:top_k] if top_k > -1 else cand
    b = boxes[cand]
    one = 0.0 if normalized else 1.0
    size = (b[:, 2] - b[:, 0] + one) * (b[:, 3] - b[:, 1] + one)
    wh = (torch.minimum(b[:, None, 2:], b[None, :, 2:]) - torch.maximum(b[:, None, :2], b[None, :, :2]))
    pos = (wh > 0).all(-1) if normalized else (wh >= 0).all(-1)
    inter = torch.where(pos, (wh + one).prod(-1), 0)
    iou = torch.where(inter > 0, inter / (size[:, None] + size[None, :] - inter), 0).tolist()
    kept, t = [], nms_threshold
    for i in range(len(iou)):
        if all(iou[i][k] <= t for k in kept):
            kept.append(i)
            if eta < 1 and t > 0.5:
                t *= eta
    return cand[kept]
'''

helper("detection_output", _DECODE + "\n" + _NMS + "\n" + '''
def detection_output(loc, conf, priors, *, classes, share, background, nms_threshold, top_k, eta, threshold,
                     keep_top_k, code, encoded, normalized=True):
    """SSD DetectionOutput: (1, 1, N*rows, 7) rows [image, label, score, xmin, ymin, xmax, ymax],
    each image's detections (label ascending, score descending) then rows [image, -1, ...]."""
    n, p = loc.shape[0], priors.shape[2] // 4
    flat = priors.reshape(-1)
    prior = flat[:p * 4].reshape(p, 1, 4)
    var = torch.ones_like(prior) if encoded else flat[p * 4:].reshape(p, 1, 4)
    boxes = ssd_decode(loc.reshape(n, p, -1, 4), prior, var, code, 0.0 if normalized else 1.0)
    scores = conf.reshape(n, p, classes)
    per_class = p if top_k < 0 else min(top_k, p)
    most = (classes - (0 <= background < classes)) * per_class
    rows = max(1, most if keep_top_k < 0 else min(keep_top_k, most))
    out = loc.new_full((n, rows, 7), -1.0)
    out[:, :, 0] = torch.arange(n, dtype=loc.dtype, device=loc.device).view(n, 1)
    for i in range(n):
        dets = []
        for c in range(classes):
            if c != background:
                bx = boxes[i, :, 0 if share else c]
                kept = greedy_nms(bx, scores[i, :, c], threshold, top_k, nms_threshold, eta, normalized)
                dets += [(c, scores[i, j, c], bx[j]) for j in kept.tolist()]
        if 0 <= keep_top_k < len(dets):
            best = sorted(range(len(dets)), key=lambda t: -float(dets[t][1]))
            dets = [dets[t] for t in sorted(best[:keep_top_k])]
        for r, (c, s, bx) in enumerate(dets):
            out[i, r, 1], out[i, r, 2], out[i, r, 3:] = c, s, bx
    return out.reshape(1, 1, n * rows, 7)
''')
