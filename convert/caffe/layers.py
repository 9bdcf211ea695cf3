"""One small function per Caffe layer type: read the layer's parameters and blobs, emit IR nodes.

Register with ``@layer("Type", ...)`` (``builder.py``); the function receives the Builder ``b`` and the layer
``L`` (``L.p`` is its V2 LayerParameter).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Shape
from ..ops.act import Clip, Dropout, Elu, Exp, Log, Power, PRelu, Relu, Simple, Step
from ..ops.conv import Conv, Deconv
from ..ops.eltwise import Broadcast, Eltwise
from ..ops.linear import Linear
from ..ops.norm import LRN, MVN, Affine, BatchNorm, LpNormalize
from ..ops.pool import Pool
from ..ops.shape import Concat, Crop, Pad, Reshape, Resize, Split, Transpose
from ..ops.softmax import ArgMax, Softmax
from .builder import Builder, layer
from .upgrade import Layer


def _axis(b: Builder, axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise b.fail(f"axis {axis} out of range for a {rank}-D input")
    return a


def _hw(b: Builder, p: Any, name: str, default: int | None) -> tuple[int, int]:
    """Caffe's per-axis spelling: name_h/name_w, else the (repeated or single) field."""
    if p.has(f"{name}_h") or p.has(f"{name}_w"):
        return int(getattr(p, f"{name}_h")), int(getattr(p, f"{name}_w"))
    field = "kernel_size" if name == "kernel" else name
    if not p.has(field) or getattr(p, field) == []:
        if default is None:
            raise b.fail(f"{field} is not given")
        return default, default
    v = getattr(p, field)
    vals = v if isinstance(v, list) else [v]
    if len(vals) == 1:
        return int(vals[0]), int(vals[0])
    if len(vals) == 2:
        return int(vals[0]), int(vals[1])
    raise b.fail(f"{len(vals)} values for {field}: only 2-D layers are supported")


def _need_4d(b: Builder) -> None:
    if len(b.shape()) != 4:
        raise b.fail(f"needs a 4-D input, got {list(b.shape())}")


# --- convolution, fully connected ------------------------------------------------------------

def _conv_geometry(b: Builder, cp: Any) -> dict[str, tuple[int, int]]:
    if cp.axis != 1 or cp.force_nd_im2col:
        raise b.fail("N-D convolution (axis != 1 or force_nd_im2col) is not supported")
    k, s = _hw(b, cp, "kernel", None), _hw(b, cp, "stride", 1)
    p, d = _hw(b, cp, "pad", 0), _hw(b, cp, "dilation", 1)
    if min(k) <= 0 or min(s) <= 0 or min(d) <= 0:
        raise b.fail(f"kernel {list(k)}, stride {list(s)} and dilation {list(d)} must be positive")
    return {"kernel": k, "stride": s, "pad": p, "dilation": d}


@layer("Convolution", "ConvolutionDepthwise")
def convolution(b: Builder, L: Layer) -> None:
    _need_4d(b)
    cp, c = L.p.convolution_param, b.shape()[1]
    geo = _conv_geometry(b, cp)
    group = c if L.type == "ConvolutionDepthwise" else cp.group
    if not cp.has("num_output") or cp.num_output <= 0:
        raise b.fail("num_output is not given")
    if group <= 0:
        raise b.fail(f"group must be positive, got {group}")
    if c % group or cp.num_output % group:
        raise b.fail(f"group {group} does not divide {c} input and {cp.num_output} output channels")
    shape = (cp.num_output, c // group, *geo["kernel"])
    specs = [("weight", shape, c // group * geo["kernel"][0] * geo["kernel"][1])]
    specs += [("bias", (cp.num_output,), 0)] if cp.bias_term else []
    blobs = b.blobs(specs)
    w = {"weight": blobs[0]} | ({"bias": blobs[1]} if cp.bias_term else {})
    b.node(Conv(group=group, bias=cp.bias_term, **geo), weights=w)


@layer("Deconvolution")
def deconvolution(b: Builder, L: Layer) -> None:
    _need_4d(b)
    cp, c = L.p.convolution_param, b.shape()[1]
    geo = _conv_geometry(b, cp)
    g, n = cp.group, cp.num_output
    if n <= 0:
        raise b.fail("num_output is not given")
    if g <= 0:
        raise b.fail(f"group must be positive, got {g}")
    if c % g or n % g:
        raise b.fail(f"group {g} does not divide {c} input and {n} output channels")
    kh, kw = geo["kernel"]
    fan = c // g * kh * kw / (geo["stride"][0] * geo["stride"][1])
    specs = [("weight", (c, n // g, kh, kw), fan)] + ([("bias", (n,), 0)] if cp.bias_term else [])
    blobs = b.blobs(specs)
    w = {"weight": blobs[0]} | ({"bias": blobs[1]} if cp.bias_term else {})
    b.node(Deconv(group=g, bias=cp.bias_term, **geo), weights=w)


@layer("InnerProduct")
def inner_product(b: Builder, L: Layer) -> None:
    ip, shape = L.p.inner_product_param, b.shape()
    axis = _axis(b, ip.axis, len(shape))
    k, n = int(np.prod(shape[axis:])), ip.num_output
    if n <= 0:
        raise b.fail("num_output is not given")
    specs = [("weight", (k, n) if ip.transpose else (n, k), k)]
    specs += [("bias", (n,), 0)] if ip.bias_term else []
    blobs = b.blobs(specs)
    weight = np.ascontiguousarray(blobs[0].T) if ip.transpose else blobs[0]
    x = b.x()
    if len(shape) != axis + 1:
        x = b.node(Reshape((-1,), axis), [x], [b.tmp("flat")]).outputs[0]
    w = {"weight": weight} | ({"bias": blobs[1]} if ip.bias_term else {})
    b.node(Linear(bias=ip.bias_term), [x], weights=w)


# --- pooling and normalization ----------------------------------------------------------------

@layer("Pooling")
def pooling(b: Builder, L: Layer) -> None:
    _need_4d(b)
    pp, (h, w) = L.p.pooling_param, b.shape()[2:]
    if pp.pool == "STOCHASTIC":
        raise b.fail("STOCHASTIC pooling is not supported")
    if pp.global_pooling:
        k, s, p = (h, w), (1, 1), (0, 0)
        if pp.has("pad") or pp.has("pad_h") or (pp.has("stride") and pp.stride != 1):
            raise b.fail("global pooling needs pad 0 and stride 1")
    else:
        k, s, p = _hw(b, pp, "kernel", None), _hw(b, pp, "stride", 1), _hw(b, pp, "pad", 0)
        if min(k) <= 0 or min(s) <= 0:
            raise b.fail(f"kernel {list(k)} and stride {list(s)} must be positive")
        if k[0] > 2 * h + 1 or k[1] > 2 * w + 1:  # beyond that a window only adds padding
            raise b.fail(f"kernel {list(k)} is more than twice the {h}x{w} input: not supported")
    ceil = pp.round_mode == "CEIL"
    drop = any(p)  # Caffe drops a window starting in the padding only when the layer pads
    b.node(Pool("max" if pp.pool == "MAX" else "avg", k, s, p, ceil, drop, count_pad=True,
                whole=bool(pp.global_pooling)))


@layer("LRN")
def lrn(b: Builder, L: Layer) -> None:
    lp = L.p.lrn_param
    if lp.local_size % 2 == 0:
        raise b.fail(f"local_size must be odd (Caffe), got {lp.local_size}")
    region = "across" if lp.norm_region == "ACROSS_CHANNELS" else "within"
    _need_4d(b)
    extent = b.shape()[1] if region == "across" else max(b.shape()[2:])
    if lp.local_size > max(2 * extent + 1, 15):  # beyond 2 * extent + 1 a window only adds padding
        raise b.fail(f"local_size {lp.local_size} is more than twice the input's {extent} "
                     f"{'channels' if region == 'across' else 'pixels'}: not supported")
    b.node(LRN(lp.local_size, lp.alpha, lp.beta, lp.k, region))


@layer("BatchNorm")
def batch_norm(b: Builder, L: Layer) -> None:
    if len(b.shape()) < 2:
        raise b.fail(f"needs an input with channels, got {list(b.shape())}")
    bp, c = L.p.batch_norm_param, b.shape()[1]
    batch = bp.has("use_global_stats") and not bp.use_global_stats
    if bp.eps < 0 or (batch and bp.eps == 0):  # PyTorch needs eps > 0 for batch statistics
        raise b.fail(f"eps must be positive{'' if batch else ' or 0'}, got {bp.eps}")
    mean, var, factor = b.blobs([("mean", (c,), 0), ("var", (c,), 0), ("factor", (1,), 0)])
    f = float(factor.reshape(-1)[0])
    with np.errstate(over="ignore", invalid="ignore"):  # a tiny factor: refused below, quietly
        inv = np.float32(0 if f == 0 else 1 / np.float32(f))  # Caffe: stored sums / factor (0 -> 0)
        w = {"running_mean": (mean * inv).astype(np.float32), "running_var": (var * inv).astype(np.float32)}
    if not batch and not (np.isfinite(w["running_mean"]).all() and np.isfinite(w["running_var"]).all()
                          and (w["running_var"] + np.float32(bp.eps) >= 0).all()):
        raise b.fail(f"mean and variance (stored sums over the scale factor {f:g}) must be finite, "
                     "and variance + eps must not be negative")
    # Caffe's running statistics keep moving_average_fraction of themselves per step: PyTorch's momentum is
    # the rest (its shortest float32 spelling first: 0.999 -> 0.001, not 0.0009999871)
    momentum = float(f"{1 - float(str(np.float32(bp.moving_average_fraction))):.9g}")
    node = b.node(BatchNorm(eps=bp.eps, batch_stats=batch, rank=len(b.shape()), momentum=momentum), weights=w)
    b.bn_blobs[node.attr] = (mean, var, f)


def _param_shape(b: Builder, shape: Shape, axis: int, num_axes: int) -> Shape:
    axis = _axis(b, axis, len(shape))
    end = len(shape) if num_axes == -1 else axis + num_axes
    if num_axes < -1 or end > len(shape):
        raise b.fail(f"num_axes {num_axes} from axis {axis} exceeds the {len(shape)}-D input")
    return tuple(shape[axis:end])


@layer("Scale", bottoms=(1, 2))
def scale(b: Builder, L: Layer) -> None:
    sp, shape = L.p.scale_param, b.shape()
    if len(L.bottoms) == 2:
        axis = _axis(b, sp.axis, len(shape))
        pshape = b.shape(1)
        if not sp.bias_term:
            b.node(Broadcast("mul", axis), [b.x(), b.x(1)])
            return
        (bias,) = b.blobs([("beta", pshape, 0)])
        y = b.node(Broadcast("mul", axis), [b.x(), b.x(1)], [b.tmp("scaled")]).outputs[0]
        b.node(Affine(axis, scale=False, bias=True), [y], weights={"bias": bias})
        return
    pshape = _param_shape(b, shape, sp.axis, sp.num_axes)
    specs = [("gamma", pshape, 0)] + ([("beta", pshape, 0)] if sp.bias_term else [])
    blobs = b.blobs(specs)
    w = {"weight": blobs[0]} | ({"bias": blobs[1]} if sp.bias_term else {})
    b.node(Affine(_axis(b, sp.axis, len(shape)), scale=True, bias=sp.bias_term), [b.x()], weights=w)


@layer("Bias", bottoms=(1, 2))
def bias(b: Builder, L: Layer) -> None:
    bp, shape = L.p.bias_param, b.shape()
    if len(L.bottoms) == 2:
        b.node(Broadcast("add", _axis(b, bp.axis, len(shape))), [b.x(), b.x(1)])
        return
    (blob,) = b.blobs([("beta", _param_shape(b, shape, bp.axis, bp.num_axes), 0)])
    b.node(Affine(_axis(b, bp.axis, len(shape)), scale=False, bias=True), [b.x()],
           weights={"bias": blob})


@layer("MVN")
def mvn(b: Builder, L: Layer) -> None:
    mp = L.p.mvn_param
    op = MVN(mp.normalize_variance, mp.across_channels, mp.eps)
    if not op.axes(len(b.shape())):
        raise b.fail(f"no axes to normalize over in an input of shape {list(b.shape())}")
    b.node(op)


@layer("Normalize")
def normalize(b: Builder, L: Layer) -> None:
    np_, shape = L.p.norm_param, b.shape()
    if len(shape) != 4:
        raise b.fail(f"needs a 4-D input, got {list(shape)}")
    (s,) = b.blobs([("scale", (1,) if np_.channel_shared else (shape[1],), 0)])
    axes = (1, 2, 3) if np_.across_spatial else (1,)
    b.node(LpNormalize(axes, 2.0, np_.eps, scaled=True), weights={"weight": s})


# --- activations -----------------------------------------------------------------------------

@layer("ReLU")
def relu(b: Builder, L: Layer) -> None:
    b.node(Relu(L.p.relu_param.negative_slope))


@layer("PReLU")
def prelu(b: Builder, L: Layer) -> None:
    shared = L.p.prelu_param.channel_shared
    if not shared and len(b.shape()) < 2:
        raise b.fail(f"per-channel PReLU needs channels, got input {list(b.shape())}")
    (a,) = b.blobs([("slope", (1,) if shared else (b.shape()[1],), 0)])
    b.node(PRelu(), weights={"weight": a.reshape(-1)})


@layer("ELU")
def elu(b: Builder, L: Layer) -> None:
    b.node(Elu(L.p.elu_param.alpha))


SIMPLE = {"Sigmoid": "sigmoid", "TanH": "tanh", "AbsVal": "abs", "BNLL": "softplus"}


@layer(*SIMPLE)
def simple(b: Builder, L: Layer) -> None:
    b.node(Simple(SIMPLE[L.type]))


@layer("Power")
def power(b: Builder, L: Layer) -> None:
    p = L.p.power_param
    b.node(Power(p.power, p.scale, p.shift))


@layer("Exp")
def exp(b: Builder, L: Layer) -> None:
    p = L.p.exp_param
    if p.base != -1 and p.base <= 0:
        raise b.fail(f"base must be positive or -1 (e), got {p.base}")
    b.node(Exp(p.base, p.scale, p.shift))


@layer("Log")
def log(b: Builder, L: Layer) -> None:
    p = L.p.log_param
    if p.base != -1 and (p.base <= 0 or p.base == 1):
        raise b.fail(f"base must be positive and not 1, or -1 (e), got {p.base}")
    b.node(Log(p.base, p.scale, p.shift))


@layer("Threshold")
def threshold(b: Builder, L: Layer) -> None:
    b.node(Step(L.p.threshold_param.threshold))


@layer("Clip")
def clip(b: Builder, L: Layer) -> None:
    cp = L.p.clip_param
    if not (cp.has("min") and cp.has("max")):
        raise b.fail("clip_param needs min and max")
    b.node(Clip(cp.min, cp.max))


@layer("Dropout")
def dropout(b: Builder, L: Layer) -> None:
    ratio = L.p.dropout_param.dropout_ratio
    if not 0 <= ratio <= 1:
        raise b.fail(f"dropout_ratio must be between 0 and 1, got {ratio}")
    if not L.p.dropout_param.scale_train:  # Fast R-CNN's fork: no scaling at training, 1 - ratio at test
        b.node(Dropout(ratio, 1.0 - ratio))
        return
    b.node(Dropout(ratio))  # Caffe scales at training: identity here


# --- structure -------------------------------------------------------------------------------

@layer("Eltwise", bottoms=(2, None))
def eltwise(b: Builder, L: Layer) -> None:
    ep = L.p.eltwise_param
    if ep.coeff and ep.operation != "SUM":
        raise b.fail("coeff is only allowed with operation SUM")
    b.node(Eltwise(ep.operation.lower(), tuple(float(c) for c in ep.coeff)))


@layer("Concat", bottoms=(1, None))
def concat(b: Builder, L: Layer) -> None:
    cp = L.p.concat_param
    axis = cp.concat_dim if cp.has("concat_dim") and not cp.has("axis") else cp.axis
    b.node(Concat(_axis(b, axis, len(b.shape()))))


@layer("Slice", tops=(1, None))
def slice_(b: Builder, L: Layer) -> None:
    sp, shape = L.p.slice_param, b.shape()
    axis = _axis(b, sp.slice_dim if sp.has("slice_dim") and not sp.has("axis") else sp.axis,
                 len(shape))
    n, points = shape[axis], [int(p) for p in sp.slice_point]
    if points:
        if len(points) != len(L.tops) - 1 or points != sorted(points) or points[-1] >= n:
            raise b.fail(f"slice points {points} do not cut axis {axis} (size {n}) into "
                         f"{len(L.tops)} parts")
        sizes = [e - s for s, e in zip([0] + points, points)] + [-1]  # the last: the rest
    else:
        if n % len(L.tops):
            raise b.fail(f"axis {axis} (size {n}) does not split evenly into {len(L.tops)} parts")
        sizes = [-1] * len(L.tops)  # even parts of whatever size the axis has
    b.node(Split(axis, tuple(sizes)))


@layer("Split", tops=(1, None))
def split(b: Builder, L: Layer) -> None:
    for i in range(len(L.tops)):  # every top is the bottom itself: no computation
        b.alias(i, b.x())


@layer("Flatten")
def flatten(b: Builder, L: Layer) -> None:
    fp, shape = L.p.flatten_param, b.shape()
    a, e = _axis(b, fp.axis, len(shape)), _axis(b, fp.end_axis, len(shape))
    if e < a:
        raise b.fail(f"end_axis {fp.end_axis} comes before axis {fp.axis}")
    b.node(Reshape((-1,), a, e + 1 - a))


@layer("Reshape")
def reshape(b: Builder, L: Layer) -> None:
    rp, shape = L.p.reshape_param, b.shape()
    rank = len(shape)
    start = rp.axis + rank + 1 if rp.axis < 0 else rp.axis
    end = rank if rp.num_axes == -1 else start + rp.num_axes
    if not 0 <= start <= end <= rank:
        raise b.fail(f"axis {rp.axis} / num_axes {rp.num_axes} do not fit a {rank}-D input")
    dims = [int(d) for d in rp.shape.dim]
    b.node(Reshape(tuple(dims), start, end - start))


@layer("Crop", bottoms=(2, 2))
def crop(b: Builder, L: Layer) -> None:
    cp, s0, s1 = L.p.crop_param, b.shape(0), b.shape(1)
    axis = _axis(b, cp.axis, len(s0))
    n = len(s0) - axis
    offs = [int(o) for o in cp.offset]
    if len(offs) not in (0, 1, n):
        raise b.fail(f"{len(offs)} offsets for {n} cropped axes")
    offs = [0] * n if not offs else offs * n if len(offs) == 1 else offs
    if len(s1) != len(s0):
        raise b.fail(f"the reference {list(s1)} and the input {list(s0)} differ in rank")
    b.node(Crop((0,) * axis + tuple(offs), (0,) * len(s0), axis), [b.x(0), b.x(1)])


@layer("Permute")
def permute(b: Builder, L: Layer) -> None:
    order, rank = [int(o) for o in L.p.permute_param.order], len(b.shape())
    order += [a for a in range(rank) if a not in order]
    b.node(Transpose(tuple(order)))


@layer("Interp", bottoms=(1, 2))
def interp(b: Builder, L: Layer) -> None:
    _need_4d(b)
    ip, (h, w) = L.p.interp_param, b.shape()[2:]
    if ip.pad_beg > 0 or ip.pad_end > 0:
        raise b.fail("Interp supports only non-positive pad_beg/pad_end (cropping)")
    x = b.x()
    h_in, w_in = h + ip.pad_beg + ip.pad_end, w + ip.pad_beg + ip.pad_end
    if (h_in, w_in) != (h, w):  # negative pads crop, counted from each end
        pads = ((0, 0), (0, 0), (ip.pad_beg, ip.pad_end), (ip.pad_beg, ip.pad_end))
        x = b.node(Pad(pads), [x], [b.tmp("crop")]).outputs[0]
    b.node(_interp(b, ip, L), [x] + ([b.x(1)] if len(L.bottoms) == 2 else []))


def _interp(b: Builder, ip: Any, L: Layer) -> Resize:
    """Caffe's Interp sizes: the second bottom's, the factors' (from the actual input), or fixed."""
    zoom, shrink = ip.zoom_factor, ip.shrink_factor
    if len(L.bottoms) == 2:
        return Resize(mode="bilinear")
    if shrink != 1 or zoom != 1:
        if shrink < 1 or zoom < 1:
            raise b.fail("shrink_factor and zoom_factor must be >= 1")
        return Resize(mode="bilinear", shrink=shrink, zoom=zoom)
    if ip.height and ip.width:
        return Resize((ip.height, ip.width), "bilinear")
    raise b.fail("Interp needs height/width, zoom_factor or shrink_factor")


@layer("Softmax")
def softmax(b: Builder, L: Layer) -> None:
    b.node(Softmax(_axis(b, L.p.softmax_param.axis, len(b.shape()))))


@layer("ArgMax")
def argmax(b: Builder, L: Layer) -> None:
    ap = L.p.argmax_param
    axis = _axis(b, ap.axis, len(b.shape())) if ap.has("axis") else -1
    if ap.top_k < 1:
        raise b.fail("top_k must be at least 1")
    b.node(ArgMax(ap.top_k, axis, ap.out_max_val))
