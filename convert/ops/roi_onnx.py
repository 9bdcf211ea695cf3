"""ONNX spelling of the Proposal op (standard ops only: TopK, NonMaxSuppression, Gather, Pad).

ONNX's NonMaxSuppression measures areas without py-faster-rcnn's +1; it is given boxes whose
x2 and y2 are moved by +1, which makes its intersection and areas exactly the +1 ones. The
proposals found (a data-dependent count) are padded with zero rows to the op's fixed row count.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _scalar(b: Any, shape: str, i: int) -> str:
    return b.op("Gather", [shape, b.const(i, "int64")], axis=0)


def _cols(b: Any, x: str, n: int = 4) -> list[str]:
    outs = [b.fresh("col") for _ in range(n)]
    b.op("Split", [x, b.const([1] * n, "int64")], outs, axis=1)
    return outs


def _anchors(b: Any, op: Any, scores: str) -> str:
    """Every anchor shifted to every cell: (H * W * A, 4), cells row-major, then anchors."""
    shape = b.op("Shape", [scores])
    stride = b.const(float(op.stride))
    xs, ys = (b.op("Mul", [b.op("Cast", [b.op("Range", [b.const(0, "int64"), _scalar(b, shape, i),
                                                        b.const(1, "int64")])], to=1), stride]) for i in (3, 2))
    row, col = b.op("Unsqueeze", [xs, b.const([0], "int64")]), b.op("Unsqueeze", [ys, b.const([1], "int64")])
    zero = b.op("Mul", [b.op("Add", [row, col]), b.const(0.0)])  # (H, W) zeros
    sx, sy = b.op("Add", [row, zero]), b.op("Add", [col, zero])
    parts = [b.op("Unsqueeze", [v, b.const([2], "int64")]) for v in (sx, sy, sx, sy)]
    shifts = b.op("Reshape", [b.op("Concat", parts, axis=2), b.const([-1, 1, 4], "int64")])
    anchors = b.op("Add", [shifts, b.const(np.array(op.anchors, np.float32))])
    return b.op("Reshape", [anchors, b.const([-1, 4], "int64")])


def _decode(b: Any, anchors: str, deltas: str) -> str:
    x1, y1, x2, y2 = _cols(b, anchors)
    dx, dy, dw, dh = _cols(b, deltas)
    one, half = b.const(1.0), b.const(0.5)
    bw, bh = b.op("Add", [b.op("Sub", [x2, x1]), one]), b.op("Add", [b.op("Sub", [y2, y1]), one])
    cx = b.op("Add", [b.op("Add", [x1, b.op("Mul", [half, bw])]), b.op("Mul", [dx, bw])])
    cy = b.op("Add", [b.op("Add", [y1, b.op("Mul", [half, bh])]), b.op("Mul", [dy, bh])])
    hw = b.op("Mul", [half, b.op("Mul", [b.op("Exp", [dw]), bw])])
    hh = b.op("Mul", [half, b.op("Mul", [b.op("Exp", [dh]), bh])])
    corners = [b.op("Sub", [cx, hw]), b.op("Sub", [cy, hh]), b.op("Add", [cx, hw]), b.op("Add", [cy, hh])]
    return b.op("Concat", corners, axis=1)


def proposal_onnx(op: Any, b: Any, ins: list[str], outs: list[str]) -> None:
    scores, deltas, info = ins
    a = len(op.anchors)
    fg = b.op("Slice", [scores, b.const([a], "int64"), b.const([2 * a], "int64"), b.const([1], "int64")])
    score = b.op("Reshape", [b.op("Transpose", [fg], perm=[0, 2, 3, 1]), b.const([-1], "int64")])
    d = b.op("Reshape", [deltas, b.const([a, 4, -1], "int64")])
    d = b.op("Reshape", [b.op("Transpose", [d], perm=[2, 0, 1]), b.const([-1, 4], "int64")])
    box = _decode(b, _anchors(b, op, scores), d)
    info = b.op("Reshape", [info, b.const([-1], "int64")])
    hi = b.op("Sub", [b.op("Gather", [info, b.const([1, 0, 1, 0], "int64")], axis=0), b.const(1.0)])
    box = b.op("Max", [b.op("Min", [box, hi]), b.const(0.0)])
    x1, y1, x2, y2 = _cols(b, box)
    least = b.op("Mul", [_scalar(b, info, 2), b.const(float(op.min_size))])
    one = b.const(1.0)
    wide = b.op("GreaterOrEqual", [b.op("Add", [b.op("Sub", [x2, x1]), one]), least])
    tall = b.op("GreaterOrEqual", [b.op("Add", [b.op("Sub", [y2, y1]), one]), least])
    ok = b.op("Reshape", [b.op("NonZero", [b.op("Reshape", [b.op("And", [wide, tall]), b.const([-1], "int64")])]),
                          b.const([-1], "int64")])
    fbox, fscore = b.op("Gather", [box, ok], axis=0), b.op("Gather", [score, ok], axis=0)
    k = b.op("Shape", [ok])
    if op.pre > 0:
        k = b.op("Min", [k, b.const([op.pre], "int64")])
    top, at = b.fresh("top"), b.fresh("at")
    b.op("TopK", [fscore, k], [top, at], axis=0, largest=1, sorted=1)  # ties: lower index first
    cand = b.op("Gather", [fbox, at], axis=0)
    n = b.const([op.post if op.post > 0 else op.pre], "int64") if op.post > 0 or op.pre > 0 \
        else b.op("Shape", [box], start=0, end=1)
    plus = b.op("Add", [cand, b.const([0.0, 0.0, 1.0, 1.0])])  # the +1 areas of py-faster-rcnn
    sel = b.op("NonMaxSuppression", [b.op("Unsqueeze", [plus, b.const([0], "int64")]),
                                     b.op("Reshape", [top, b.const([1, 1, -1], "int64")]), n,
                                     b.const([float(op.thresh)])])
    sel = b.op("Reshape", [b.op("Gather", [sel, b.const([2], "int64")], axis=1), b.const([-1], "int64")])
    missing = b.op("Sub", [n, b.op("Shape", [sel])])
    rois = b.op("Gather", [cand, sel], axis=0)
    b.op("Pad", [rois, b.op("Concat", [b.const([0, 1], "int64"), missing, b.const([0], "int64")], axis=0)], [outs[0]])
    if len(outs) > 1:
        sc = b.op("Unsqueeze", [b.op("Gather", [top, sel], axis=0), b.const([1], "int64")])
        b.op("Pad", [sc, b.op("Concat", [b.const([0, 0], "int64"), missing, b.const([0], "int64")], axis=0)],
             [outs[1]])


def _bin_masks(b: Any, op: Any, lo: str, hi: str, x_shape: str, axis: int) -> tuple[str, str]:
    """(R, G, n) float mask of each bin along one axis and its (R, G) length, R-FCN's rounding."""
    scale, g = b.const(float(op.scale)), op.group
    lo, hi = b.op("Mul", [lo, scale]), b.op("Mul", [b.op("Add", [hi, b.const(1.0)]), scale])
    step = b.op("Div", [b.op("Max", [b.op("Sub", [hi, lo]), b.const(0.1)]), b.const(float(g))])
    i = b.const(np.arange(g, dtype=np.float32).reshape(1, g))
    n = _scalar(b, x_shape, axis)
    nf = b.op("Cast", [n], to=1)
    s = b.op("Floor", [b.op("Add", [b.op("Mul", [i, step]), lo])])
    e = b.op("Ceil", [b.op("Add", [b.op("Mul", [b.op("Add", [i, b.const(1.0)]), step]), lo])])
    s, e = (b.op("Max", [b.op("Min", [v, nf]), b.const(0.0)]) for v in (s, e))
    at = b.op("Cast", [b.op("Range", [b.const(0, "int64"), n, b.const(1, "int64")])], to=1)
    s3, e3 = (b.op("Unsqueeze", [v, b.const([2], "int64")]) for v in (s, e))
    inside = b.op("And", [b.op("GreaterOrEqual", [at, s3]), b.op("Less", [at, e3])])
    return b.op("Cast", [inside], to=1), b.op("Max", [b.op("Sub", [e, s]), b.const(0.0)])


def psroi_onnx(op: Any, b: Any, ins: list[str], outs: list[str]) -> None:
    """Two Einsums over bin masks; the batch index enters as a one-hot (R, N) matrix, so a roi of
    no image (index out of range) sums nothing and gives 0."""
    x, rois = ins
    g = op.group
    r = b.op("Reshape", [rois, b.const([-1, 5], "int64")])
    idx, box = b.fresh("index"), b.fresh("box")
    b.op("Split", [r, b.const([1, 4], "int64")], [idx, box], axis=1)
    t = b.op("Mul", [b.op("Sign", [idx]), b.op("Floor", [b.op("Abs", [idx])])])
    box = b.op("Mul", [b.op("Sign", [box]), b.op("Floor", [b.op("Add", [b.op("Abs", [box]), b.const(0.5)])])])
    x1, y1, x2, y2 = (b.op("Reshape", [c, b.const([-1, 1], "int64")]) for c in _cols(b, box))
    shape = b.op("Shape", [x])
    mh, nh = _bin_masks(b, op, y1, y2, shape, 2)
    mw, nw = _bin_masks(b, op, x1, x2, shape, 3)
    images = b.op("Cast", [b.op("Range", [b.const(0, "int64"), _scalar(b, shape, 0), b.const(1, "int64")])], to=1)
    onehot = b.op("Cast", [b.op("Equal", [t, b.op("Unsqueeze", [images, b.const([0], "int64")])])], to=1)
    view = b.op("Concat", [b.op("Slice", [shape, b.const([0], "int64"), b.const([1], "int64")]),
                           b.const([op.dim, g, g], "int64"),
                           b.op("Slice", [shape, b.const([2], "int64"), b.const([4], "int64")])], axis=0)
    xs = b.op("Reshape", [x, view])
    rows = b.op("Einsum", [xs, mw], equation="nkijhw,rjw->nrkijh")
    total = b.op("Einsum", [rows, mh, onehot], equation="nrkijh,rih,rn->rkij")
    area = b.op("Mul", [b.op("Unsqueeze", [nh, b.const([2], "int64")]), b.op("Unsqueeze", [nw, b.const([1], "int64")])])
    area = b.op("Unsqueeze", [b.op("Max", [area, b.const(1.0)]), b.const([1], "int64")])
    b.op("Div", [total, area], outs)
