"""ONNX emission of the SSD ops (``detect.py``), computed in-graph from the input sizes.

DetectionOutput takes per (image, class) row the ``top_k`` best candidates (TopK: ties to the
lower prior index, as Caffe's stable sort), their pairwise Jaccard overlaps, and runs Caffe's
greedy NMS as a Loop over the candidates (NonMaxSuppression would differ: ONNX Runtime reorders
the corners of inverted boxes, which CORNER codes produce and Caffe never lets overlap, and it has
no adaptive threshold).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .bbox import decode

F32_MIN = -3.4028234663852886e38


class _V:
    """An ONNX value with arithmetic, so that ``bbox.decode`` writes its graph."""

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
    loc, conf, priors = ins
    c = op.num_classes
    if op.encoded:  # (1, 1 or 2, P*4[, 1]): the first P boxes
        pri = b.op("Reshape", [priors, b.const([-1, 1, 4], "int64")])
        prior = _V(b, b.op("Slice", [pri, b.const([0], "int64"), p, b.const([0], "int64")]))
        var = prior * 0.0 + 1.0
    else:
        pri = b.op("Reshape", [priors, b.const([2, -1, 1, 4], "int64")])
        prior = _V(b, b.op("Gather", [pri, b.const(0, "int64")], axis=0))
        var = _V(b, b.op("Gather", [pri, b.const(1, "int64")], axis=0))
    loc4 = _V(b, b.op("Reshape", [loc, b.const([0, -1, op.locs(), 4], "int64")]))
    boxes = decode(loc4, prior, var, op.code, _exp, _stack, 0.0 if op.normalized else 1.0).name  # (N, P, L, 4)
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
    thr = b.const(max(op.threshold, F32_MIN))
    above = b.op("Cast", [b.op("Greater", [scores, thr])], to=7)
    most = b.op("ReduceMax", [b.op("ReduceSum", [above, b.const([1], "int64")], keepdims=0)], keepdims=1)
    k = b.op("Min", [most, p if op.top_k < 0 else _int_min(b, p, op.top_k)])  # candidates per class
    vals, idx = b.fresh("topv"), b.fresh("topi")
    b.op("TopK", [scores, k], [vals, idx], axis=1, largest=1, sorted=1)
    cand = b.op("GatherND", [boxes, b.op("Unsqueeze", [idx, b.const([-1], "int64")])], batch_dims=1)
    keep = _greedy(op, b, _overlaps(b, cand, op.normalized), b.op("Greater", [vals, thr]), k)
    pair = b.op("Transpose", [b.op("NonZero", [keep])], perm=[1, 0])  # (S, 2): (image*C + class, candidate)
    pairs = b.op("Gather", [pair, b.const(0, "int64")], axis=1)
    label = b.op("Mod", [pairs, b.const(op.num_classes, "int64")])
    img = b.op("Div", [pairs, b.const(op.num_classes, "int64")])
    table = b.op("Concat", [b.op("Unsqueeze", [_float(b, label), b.const([1], "int64")]),
                            b.op("Unsqueeze", [b.op("GatherND", [vals, pair]), b.const([1], "int64")]),
                            b.op("GatherND", [cand, pair])], axis=1)  # (S, 6)
    _layout(op, b, n, p, img, table, outs)


def _overlaps(b: Any, cand: str, normalized: bool = True) -> str:
    """Caffe's Jaccard overlap of every pair of candidates (R, K, 4) -> (R, K, K): 0 unless the
    intersection has positive width and height (not ``normalized``: OpenCV's pixel boxes, sizes
    (w + 1) * (h + 1), the intersection's when w >= 0 and h >= 0)."""
    lo, hi = b.fresh("lo"), b.fresh("hi")
    b.op("Split", [cand, b.const([2, 2], "int64")], [lo, hi], axis=2)  # each (R, K, 2)
    wh = b.op("Sub", [hi, lo])  # (R, K, 2)
    if not normalized:
        wh = b.op("Add", [wh, b.const(1.0)])
    size = b.op("ReduceProd", [wh], axes=[2], keepdims=1)  # (R, K, 1)
    a_lo, a_hi = (b.op("Unsqueeze", [v, b.const([2], "int64")]) for v in (lo, hi))  # (R, K, 1, 2)
    o_lo, o_hi = (b.op("Unsqueeze", [v, b.const([1], "int64")]) for v in (lo, hi))  # (R, 1, K, 2)
    iwh = b.op("Sub", [b.op("Min", [a_hi, o_hi]), b.op("Max", [a_lo, o_lo])])  # (R, K, K, 2)
    pos = b.op("Cast", [b.op("Greater" if normalized else "GreaterOrEqual", [iwh, b.const(0.0)])], to=1)
    if not normalized:
        iwh = b.op("Add", [iwh, b.const(1.0)])
    inter = b.op("ReduceProd", [b.op("Mul", [iwh, pos])], axes=[3], keepdims=0)  # 0 unless both > 0
    union = b.op("Sub", [b.op("Add", [size, b.op("Transpose", [size], perm=[0, 2, 1])]), inter])
    some = b.op("Greater", [inter, b.const(0.0)])
    safe = b.op("Where", [some, union, b.const(1.0)])
    return b.op("Where", [some, b.op("Div", [inter, safe]), b.const(0.0)])


def _greedy(op: Any, b: Any, iou: str, valid: str, k: str) -> str:
    """Caffe's greedy NMS over the sorted candidates of each row, as a Loop of K steps: candidate i
    is kept when valid and its overlap with every kept one is <= t (t *= eta after a keep while
    t > 0.5). Returns keep (R, K)."""
    from onnx import TensorProto, helper

    cols = b.op("Unsqueeze", [b.op("Range", [b.const(0, "int64"), _scalar(b, k), b.const(1, "int64")]),
                              b.const([0], "int64")])  # (1, K)
    keep0 = b.op("Less", [b.op("Mul", [_float(b, valid), b.const(0.0)]), b.const(-1.0)])  # all false
    rows = b.op("ReduceMax", [_float(b, valid)], axes=[1], keepdims=0)
    t0 = b.op("Add", [b.op("Mul", [rows, b.const(0.0)]), b.const(float(op.nms_threshold))])  # (R,)
    names = [b.fresh(h) for h in ("i", "cond", "keep", "t")]
    outer, b.nodes = b.nodes, []
    i, cond, keep, t = names
    row = b.op("Gather", [iou, i], axis=1)  # (R, K): overlaps of candidate i
    ok = b.op("Or", [b.op("Not", [keep]), b.op("LessOrEqual", [row, b.op("Unsqueeze", [t, b.const([1], "int64")])])])
    fine = b.op("Greater", [b.op("ReduceMin", [_float(b, ok)], axes=[1], keepdims=0), b.const(0.5)])
    kept = b.op("And", [fine, b.op("Gather", [valid, i], axis=1)])  # (R,)
    here = b.op("And", [b.op("Equal", [cols, i]), b.op("Unsqueeze", [kept, b.const([1], "int64")])])
    outs = [b.op("Identity", [cond]), b.op("Or", [keep, here])]
    if op.eta < 1:
        shrink = b.op("And", [kept, b.op("Greater", [t, b.const(0.5)])])
        outs.append(b.op("Where", [shrink, b.op("Mul", [t, b.const(float(op.eta))]), t]))
    else:
        outs.append(b.op("Identity", [t]))
    body_nodes, b.nodes = b.nodes, outer
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        body_nodes, "greedy_nms",
        [vi(i, TensorProto.INT64, []), vi(cond, TensorProto.BOOL, []), vi(keep, TensorProto.BOOL, None),
         vi(t, TensorProto.FLOAT, None)],
        [vi(outs[0], TensorProto.BOOL, []), vi(outs[1], TensorProto.BOOL, None), vi(outs[2], TensorProto.FLOAT, None)])
    final_keep, final_t = b.fresh("keep"), b.fresh("t")
    b.op("Loop", [_scalar(b, k), "", keep0, t0], [final_keep, final_t], body=body)
    return final_keep


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
