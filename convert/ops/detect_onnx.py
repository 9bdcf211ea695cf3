"""ONNX emission of the SSD ops (``detect.py``), computed in-graph from the input sizes.

DetectionOutput uses NonMaxSuppression per (image, class) pair, on the ``top_k`` best candidates
(TopK, ties to the lower prior index, as Caffe's stable sort). It differs from Caffe's greedy NMS
only on inverted boxes (xmax < xmin or ymax < ymin, possible with CORNER codes), which ONNX
Runtime reorders instead of giving size 0, and cannot express an adaptive threshold (eta < 1:
the Caffe frontend refuses it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

F32_MIN = -3.4028234663852886e38


class _V:
    """An ONNX value with arithmetic, so that ``detect.decode`` writes its graph."""

    def __init__(self, b: Any, name: str) -> None:
        self.b, self.name = b, name

    def _bin(self, op: str, other: Any, rev: bool = False) -> _V:
        o = other.name if isinstance(other, _V) else self.b.const(float(other))
        return _V(self.b, self.b.op(op, [o, self.name] if rev else [self.name, o]))

    def __add__(self, o: Any) -> _V:
        return self._bin("Add", o)

    def __sub__(self, o: Any) -> _V:
        return self._bin("Sub", o)

    def __mul__(self, o: Any) -> _V:
        return self._bin("Mul", o)

    def __truediv__(self, o: Any) -> _V:
        return self._bin("Div", o)

    def __getitem__(self, key: Any) -> _V:  # x[..., k]
        return _V(self.b, self.b.op("Gather", [self.name, self.b.const(key[1], "int64")], axis=-1))


def _exp(v: _V) -> _V:
    return _V(v.b, v.b.op("Exp", [v.name]))


def _stack(vs: list[_V], axis: int) -> _V:
    b = vs[0].b
    parts = [b.op("Unsqueeze", [v.name, b.const([axis], "int64")]) for v in vs]
    return _V(b, b.op("Concat", parts, axis=axis))


def _dim(b: Any, x: str, axis: int) -> str:
    """Dim ``axis`` of x as a 1-element int64 tensor."""
    return b.op("Shape", [x], start=axis, end=axis + 1)


def _scalar(b: Any, v: str) -> str:
    return b.op("Squeeze", [v, b.const([0], "int64")])


def _float(b: Any, v: str) -> str:
    return b.op("Cast", [v], to=1)


def prior_box_onnx(op: Any, b: Any, ins: list[str], outs: list[str]) -> None:
    h, w = _scalar(b, _dim(b, ins[0], 2)), _scalar(b, _dim(b, ins[0], 3))
    if op.img[0]:
        ih, iw = b.const(float(op.img[0])), b.const(float(op.img[1]))
    else:
        ih, iw = (_float(b, _scalar(b, _dim(b, ins[1], a))) for a in (2, 3))
    sh = b.const(float(op.step[0])) if op.step[0] else b.op("Div", [ih, _float(b, h)])
    sw = b.const(float(op.step[1])) if op.step[1] else b.op("Div", [iw, _float(b, w)])

    def centres(n: str, step: str, axes: list[int]) -> str:
        r = _float(b, b.op("Range", [b.const(0, "int64"), n, b.const(1, "int64")]))
        c = b.op("Mul", [b.op("Add", [r, b.const(float(op.offset))]), step])
        return b.op("Unsqueeze", [c, b.const(axes, "int64")])

    cy, cx = centres(h, sh, [1, 2]), centres(w, sw, [0, 2])
    half = np.array(op.sizes, dtype=np.float64) / 2
    hw, hh = b.const(half[:, 0]), b.const(half[:, 1])
    zero = b.op("Add", [b.op("Mul", [cy, b.const(0.0)]), b.op("Mul", [cx, b.const(0.0)])])  # (H, W, 1)
    parts = []
    for c, hs, den, sign in ((cx, hw, iw, "Sub"), (cy, hh, ih, "Sub"), (cx, hw, iw, "Add"), (cy, hh, ih, "Add")):
        v = b.op("Add", [b.op("Div", [b.op(sign, [c, hs]), den]), zero])
        parts.append(b.op("Unsqueeze", [v, b.const([3], "int64")]))
    boxes = b.op("Concat", parts, axis=3)
    if op.clip:
        boxes = b.op("Clip", [boxes, b.const(0.0), b.const(1.0)])
    var = b.op("Add", [b.op("Mul", [boxes, b.const(0.0)]), b.const(list(op.variance))])
    flat = b.const([1, 1, -1], "int64")
    b.op("Concat", [b.op("Reshape", [boxes, flat]), b.op("Reshape", [var, flat])], outs, axis=1)


def _candidates(op: Any, b: Any, ins: list[str], p: str) -> tuple[str, str]:
    """Decoded boxes (N*C, P, 4) and scores (N*C, P) per (image, class); background scores -inf."""
    from .detect import decode

    loc, conf, priors = ins
    c = op.num_classes
    pri = b.op("Reshape", [priors, b.const([2, -1, 1, 4], "int64")])
    prior = _V(b, b.op("Gather", [pri, b.const(0, "int64")], axis=0))
    var = _V(b, b.op("Gather", [pri, b.const(1, "int64")], axis=0))
    if op.encoded:
        var = prior * 0.0 + 1.0
    loc4 = _V(b, b.op("Reshape", [loc, b.const([0, -1, op.locs(), 4], "int64")]))
    boxes = decode(loc4, prior, var, op.code, _exp, _stack).name  # (N, P, L, 4)
    boxes = b.op("Transpose", [boxes], perm=[0, 2, 1, 3])
    if op.share:
        boxes = b.op("Expand", [boxes, b.const([1, c, 1, 1], "int64")])
    boxes = b.op("Reshape", [boxes, b.op("Concat", [b.const([-1], "int64"), p, b.const([4], "int64")], axis=0)])
    scores = b.op("Transpose", [b.op("Reshape", [conf, b.const([0, -1, c], "int64")])], perm=[0, 2, 1])
    mask = np.zeros((c, 1), dtype=np.float32)
    if 0 <= op.background < c:
        mask[op.background] = -np.inf
    scores = b.op("Flatten", [b.op("Add", [scores, b.const(mask)])], axis=2)
    return boxes, scores


def _int_min(b: Any, a: str, n: int) -> str:
    return b.op("Min", [a, b.const([n], "int64")])


def detection_output_onnx(op: Any, b: Any, ins: list[str], outs: list[str]) -> None:
    n = _dim(b, ins[0], 0)
    p = b.op("Div", [_dim(b, ins[2], 2), b.const([4], "int64")])
    boxes, scores = _candidates(op, b, ins, p)
    k = p if op.top_k < 0 else _int_min(b, p, op.top_k)
    vals, idx = b.fresh("topv"), b.fresh("topi")
    b.op("TopK", [scores, k], [vals, idx], axis=1, largest=1, sorted=1)
    cand = b.op("GatherND", [boxes, b.op("Unsqueeze", [idx, b.const([-1], "int64")])], batch_dims=1)
    sel = b.op("NonMaxSuppression", [cand, b.op("Unsqueeze", [vals, b.const([1], "int64")]), k,
                                     b.const([op.nms_threshold]), b.const([max(op.threshold, F32_MIN)])])
    pair = b.op("Gather", [sel, b.const([0, 2], "int64")], axis=1)  # (S, 2): (image*C + class, candidate)
    pairs = b.op("Gather", [sel, b.const(0, "int64")], axis=1)
    label = b.op("Mod", [pairs, b.const(op.num_classes, "int64")])
    img = b.op("Div", [pairs, b.const(op.num_classes, "int64")])
    table = b.op("Concat", [b.op("Unsqueeze", [_float(b, label), b.const([1], "int64")]),
                            b.op("Unsqueeze", [b.op("GatherND", [vals, pair]), b.const([1], "int64")]),
                            b.op("GatherND", [cand, pair])], axis=1)  # (S, 6)
    _layout(op, b, n, p, img, table, outs)


def _rows(op: Any, b: Any, p: str) -> str:
    per_class = p if op.top_k < 0 else _int_min(b, p, op.top_k)
    classes = op.num_classes - (0 <= op.background < op.num_classes)
    most = b.op("Mul", [per_class, b.const([classes], "int64")])
    rows = most if op.keep_top_k < 0 else _int_min(b, most, op.keep_top_k)
    return b.op("Max", [rows, b.const([1], "int64")])


def _layout(op: Any, b: Any, n: str, p: str, img: str, table: str, outs: list[str]) -> None:
    """Per image, its ``keep_top_k`` best rows of ``table`` in table order, padded to ``rows``."""
    s = _dim(b, table, 0)
    images = b.op("Unsqueeze", [b.op("Range", [b.const(0, "int64"), _scalar(b, n), b.const(1, "int64")]),
                                b.const([1], "int64")])  # (N, 1)
    member = b.op("Equal", [b.op("Unsqueeze", [img, b.const([0], "int64")]), images])  # (N, S)
    score = b.op("Unsqueeze", [b.op("Gather", [table, b.const(1, "int64")], axis=1), b.const([0], "int64")])
    dense = b.op("Where", [member, score, b.const(-math.inf)])
    rows = _rows(op, b, p)
    k1 = b.op("Min", [s, rows])
    best, pos = b.fresh("best"), b.fresh("pos")
    b.op("TopK", [dense, k1], [best, pos], axis=1, largest=1, sorted=1)
    valid = b.op("Equal", [b.op("Gather", [img, pos]), images])
    key = b.op("Where", [valid, pos, b.op("Add", [pos, s])])
    keys, order = b.fresh("key"), b.fresh("order")
    b.op("TopK", [key, k1], [keys, order], axis=1, largest=0, sorted=1)
    ok = b.op("Less", [keys, s])
    picked = b.op("Gather", [table, b.op("Where", [ok, keys, b.op("Sub", [keys, s])])])  # (N, k1, 6)
    picked = b.op("Where", [b.op("Unsqueeze", [ok, b.const([-1], "int64")]), picked, b.const(-1.0)])
    pads = b.op("Concat", [b.const([0, 0, 0, 0], "int64"), b.op("Sub", [rows, k1]), b.const([0], "int64")], axis=0)
    picked = b.op("Pad", [picked, pads, b.const(-1.0)])
    ids = b.op("Unsqueeze", [_float(b, images), b.const([2], "int64")])  # (N, 1, 1)
    ids = b.op("Expand", [ids, b.op("Concat", [b.const([1], "int64"), rows, b.const([1], "int64")], axis=0)])
    b.op("Reshape", [b.op("Concat", [ids, picked], axis=2), b.const([1, 1, -1, 7], "int64")], outs)
