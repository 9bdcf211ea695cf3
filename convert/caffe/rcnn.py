"""Caffe layers of Faster R-CNN / R-FCN (ROIPooling, PSROIPooling, Proposal in its C++ and Python
forms) and of common forks (Upsample, ShuffleChannel, ReLU6, Axpy, Intel's layout layers).

The frontend imports this file: the functions register themselves in ``builder.LAYERS``.
"""

from __future__ import annotations

import ast
from typing import Any

from ..ops.act import Clip
from ..ops.fork import Axpy, ShuffleChannel
from ..ops.roi import Proposal, PSROIPool, ROIPool, generate_anchors
from ..ops.shape import Resize
from .builder import Builder, layer
from .layers import lrn
from .upgrade import Layer


def _need_4d(b: Builder, i: int = 0) -> None:
    if len(b.shape(i)) != 4:
        raise b.fail(f"needs a 4-D input, got {list(b.shape(i))}")


def _rois(b: Builder, i: int) -> None:
    s = b.shape(i)
    if len(s) < 2 or s[1] != 5 or any(d != 1 for d in s[2:]):
        raise b.fail(f"rois must be (R, 5) rows [batch, x1, y1, x2, y2], got {list(s)}")


# --- R-CNN -------------------------------------------------------------------------------------

@layer("ROIPooling", bottoms=(2, 2))
def roi_pooling(b: Builder, L: Layer) -> None:
    p = L.p.roi_pooling_param
    _need_4d(b)
    _rois(b, 1)
    if p.pooled_h <= 0 or p.pooled_w <= 0:
        raise b.fail(f"pooled_h {p.pooled_h} and pooled_w {p.pooled_w} must be positive")
    if not p.spatial_scale > 0:
        raise b.fail(f"spatial_scale must be positive, got {p.spatial_scale}")
    b.node(ROIPool((p.pooled_h, p.pooled_w), p.spatial_scale))


@layer("PSROIPooling", bottoms=(2, 2))
def psroi_pooling(b: Builder, L: Layer) -> None:
    p = L.p.psroi_pooling_param
    _need_4d(b)
    _rois(b, 1)
    if p.output_dim <= 0 or p.group_size <= 0:
        raise b.fail(f"output_dim {p.output_dim} and group_size {p.group_size} must be positive")
    if b.shape()[1] != p.output_dim * p.group_size ** 2:
        raise b.fail(f"{b.shape()[1]} input channels: output_dim x group_size² = "
                     f"{p.output_dim * p.group_size ** 2} expected")
    if not p.spatial_scale > 0:
        raise b.fail(f"spatial_scale must be positive, got {p.spatial_scale}")
    b.node(PSROIPool(p.output_dim, p.group_size, p.spatial_scale))


def _proposal(b: Builder, L: Layer, q: dict[str, Any]) -> None:
    _need_4d(b)
    _need_4d(b, 1)
    ratios, scales = tuple(float(r) for r in q["ratios"]), tuple(float(s) for s in q["scales"])
    if not ratios or not scales or min(ratios + scales) <= 0:
        raise b.fail(f"ratios {list(ratios)} and scales {list(scales)} must be positive and not empty")
    if q["feat_stride"] <= 0 or q["base_size"] <= 0:
        raise b.fail(f"feat_stride {q['feat_stride']} and base_size {q['base_size']} must be positive")
    anchors = tuple(tuple(float(v) for v in a) for a in generate_anchors(q["base_size"], ratios, scales))
    op = Proposal(anchors, float(q["feat_stride"]), float(q["min_size"]), int(q["pre_nms_topn"]),
                  int(q["post_nms_topn"]), float(q["nms_thresh"]), with_scores=len(L.tops) == 2)
    b.node(op)


@layer("Proposal", bottoms=(3, 3), tops=(1, 2))
def proposal(b: Builder, L: Layer) -> None:
    p = L.p.proposal_param
    q = {k: getattr(p, k) for k in ("feat_stride", "base_size", "min_size", "pre_nms_topn", "post_nms_topn",
                                    "nms_thresh")}
    q["ratios"] = list(p.ratio) or [0.5, 1.0, 2.0]
    q["scales"] = list(p.scale) or [8.0, 16.0, 32.0]
    _proposal(b, L, q)


PY_DEFAULTS = {"feat_stride": 16, "base_size": 16, "min_size": 16, "pre_nms_topn": 6000, "post_nms_topn": 300,
               "nms_thresh": 0.7, "ratios": [0.5, 1, 2], "scales": [8, 16, 32]}


def _numbers(v: Any, listed: bool) -> bool:
    """Finite numbers within 2^31 (what the proto's own fields could hold)."""
    ok = lambda x: isinstance(x, int | float) and not isinstance(x, bool) and abs(x) < 2**31  # noqa: E731
    return isinstance(v, list | tuple) and all(map(ok, v)) if listed else ok(v)


@layer("Python.ProposalLayer", bottoms=(3, 3), tops=(1, 2))
def python_proposal(b: Builder, L: Layer) -> None:
    """py-faster-rcnn's rpn.proposal_layer: param_str is a Python dict literal ("'feat_stride': 16"),
    read with ast.literal_eval (never evaluated); the NMS settings are its cfg.TEST defaults."""
    text = ", ".join(line.strip() for line in L.p.python_param.param_str.splitlines() if line.strip())
    try:  # py-faster-rcnn reads it as YAML; its one-line form is a dict literal without braces
        given = ast.literal_eval(text if text.startswith("{") else "{" + text + "}")
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise b.fail(f"param_str {text[:80]!r} is not a Python dict literal") from None
    if not isinstance(given, dict) or any(k not in PY_DEFAULTS for k in given):
        raise b.fail(f"param_str {text[:80]!r}: expected keys among {', '.join(PY_DEFAULTS)}")
    q = PY_DEFAULTS | given
    if not all(_numbers(v, k in ("ratios", "scales")) for k, v in q.items()):
        raise b.fail(f"param_str {text[:80]!r}: numbers (lists of numbers for ratios, scales) expected")
    _proposal(b, L, q)


# --- fork layers -------------------------------------------------------------------------------

@layer("Upsample", bottoms=(1, 2))
def upsample(b: Builder, L: Layer) -> None:
    up = L.p.upsample_param
    if len(L.bottoms) == 2:
        raise b.fail("SegNet's max-unpooling Upsample (a second bottom of pooling indices) is not supported")
    _need_4d(b)
    if up.has("upsample_h") or up.has("upsample_w"):
        raise b.fail("upsample_h/upsample_w belong to the max-unpooling form, not supported")
    sh, sw = (up.scale_h, up.scale_w) if up.has("scale_h") or up.has("scale_w") else (up.scale, up.scale)
    if sh != sw or sh < 1:
        raise b.fail(f"scales {sh} x {sw}: only one positive integer scale for both axes is supported")
    b.node(Resize(mode="nearest", scale=sh))


@layer("ShuffleChannel")
def shuffle_channel(b: Builder, L: Layer) -> None:
    g, c = L.p.shuffle_channel_param.group, b.shape()[1] if len(b.shape()) > 1 else 0
    _need_4d(b)
    if g < 1 or c % g:
        raise b.fail(f"group {g} does not divide the {c} channels")
    b.node(ShuffleChannel(g))


@layer("ReLU6")
def relu6(b: Builder, L: Layer) -> None:
    b.node(Clip(0.0, 6.0))


@layer("Axpy", bottoms=(3, 3))
def axpy(b: Builder, L: Layer) -> None:
    a, x, y = b.shape(0), b.shape(1), b.shape(2)
    if x != y:
        raise b.fail(f"x {list(x)} and y {list(y)} differ in shape")
    if len(x) < 2 or tuple(a[:2]) != tuple(x[:2]) or any(d != 1 for d in a[2:]):
        raise b.fail(f"the scale {list(a)} must be (N, C, 1, 1) for x {list(x)}")
    b.node(Axpy())


@layer("IntelPack", "IntelUnpack")
def intel_layout(b: Builder, L: Layer) -> None:
    """Intel's Caffe preview converts between its packed memory layout and the plain one: the
    values are the same."""
    b.alias(0, b.x())


layer("IntelLRN")(lrn)  # Intel's LRN: Caffe's LRN (lrn_param), another kernel
