"""Caffe layers of Faster R-CNN / R-FCN (ROIPooling, PSROIPooling, Proposal in its C++ and Python
forms) and of common forks (Upsample, ShuffleChannel, ReLU6, Axpy, Intel's layout layers).

Imported at the end of ``layers.py``: the functions register themselves there.
"""

from __future__ import annotations

from ..ops.act import Clip
from ..ops.fork import Axpy, ShuffleChannel
from ..ops.roi import ROIPool
from ..ops.shape import Resize
from .frontend import Builder
from .layers import layer, lrn
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
