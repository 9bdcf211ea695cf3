"""One small function per Torch7 nn/cudnn class: read the module's fields and tensors, emit IR nodes.

Register with ``@module("nn.Class", "cudnn.Class", ...)``; the function receives the Builder ``b``,
the module ``m`` and its input ``x`` (a value name, or a list for a Lua table) and returns its
output the same way. Torch7 decides batch handling at run time from the input's rank (``nInputDims``
and friends); with static shapes the functions do the same. Dims in fields are 1-based.
Sources quoted: torch/nn (Lua + THNN), soumith/cudnn.torch.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.act import Clip, Dropout, Elu, Exp, Log, Power, PRelu, Relu, Simple, Threshold
from ..ops.conv import Conv, Deconv
from ..ops.eltwise import Eltwise
from ..ops.linear import Linear
from ..ops.norm import LRN, Affine, BatchNorm, LpNormalize
from ..ops.pool import Pool, pooled_size
from ..ops.shape import Concat, Crop, Pad, Reshape, Resize, Split, Transpose
from ..ops.softmax import Reduce, Softmax
from .builder import Builder, Mod, Value, module


def _dim(m: Mod, dim: int, rank: int) -> int:
    """A 1-based Torch dim (negative: from the end) as a 0-based axis."""
    d = dim + rank + 1 if dim < 0 else dim
    if not 1 <= d <= rank:
        raise m.fail(f"dimension {dim} out of range for a {rank}-D input")
    return d - 1


def _rank(b: Builder, m: Mod, x: Value, ranks: tuple[int, ...]) -> str:
    x = b.tensor(m, x)
    if len(b.shape(x)) not in ranks:
        raise m.fail(f"expects a {' or '.join(map(str, ranks))}-D input, got {list(b.shape(x))}")
    return x


def _batch_dim(m: Mod, dim: int, rank: int, key: str) -> int:
    """Torch7's nInputDims rule: a positive dim shifts by one when the input has one more dim
    than ``key`` says (the batch); a negative one counts from the end. Returns the 0-based axis."""
    n = m.get(key)
    if dim > 0 and n is not None and rank == int(n) + 1:
        dim += 1
    return _dim(m, dim, rank)


# --- containers ------------------------------------------------------------------------------

@module("nn.Sequential", "nn.SpatialLPPooling", container=True)
def sequential(b: Builder, m: Mod, x: Value) -> Value:
    # SpatialLPPooling is a Sequential subclass: Power|Square, SpatialAveragePooling, MulConstant,
    # Power|Sqrt are serialized as its children
    children = m.children()
    if not children and m.cls != "nn.Sequential":
        raise m.fail("was saved without its child modules")
    for c in children:
        x = b.run(c, x)
    return x


@module("nn.Concat", "nn.DepthConcat", container=True)
def concat(b: Builder, m: Mod, x: Value) -> Value:
    # dimension is absolute (no batch shift); every child sees the same input
    outs = [b.tensor(c, b.run(c, x)) for c in m.children()]
    if not outs:
        raise m.fail("has no child modules")
    rank = len(b.shape(outs[0]))
    axis = _dim(m, m.int("dimension"), rank)
    if m.cls == "nn.DepthConcat":
        outs = _centre(b, m, outs, axis)
    return b.node(m, Concat(axis), outs)


def _centre(b: Builder, m: Mod, outs: list[str], axis: int) -> list[str]:
    """DepthConcat: zero-pad every map to the largest size, centred (start (max - n) // 2)."""
    shapes = [b.shape(o) for o in outs]
    if len({len(s) for s in shapes}) != 1:
        raise m.fail(f"children output different ranks: {[list(s) for s in shapes]}")
    big = [max(s[i] for s in shapes) for i in range(len(shapes[0]))]
    res = []
    for o, s in zip(outs, shapes):
        pads = tuple((0, 0) if i == axis else ((t - n) // 2, t - n - (t - n) // 2)
                     for i, (n, t) in enumerate(zip(s, big)))
        res.append(o if not any(a or c for a, c in pads) else b.node(m, Pad(pads), [o]))
    return res


@module("nn.ConcatTable", container=True)
def concat_table(b: Builder, m: Mod, x: Value) -> Value:
    return [b.run(c, x) for c in m.children()]


@module("nn.ParallelTable", container=True)
def parallel_table(b: Builder, m: Mod, x: Value) -> Value:
    xs, children = b.table(m, x), m.children()
    if len(xs) < len(children):
        raise m.fail(f"has {len(children)} children but receives a table of {len(xs)}")
    return [b.run(c, xi) for c, xi in zip(children, xs)]


@module("nn.Parallel", container=True)
def parallel(b: Builder, m: Mod, x: Value) -> Value:
    """Child i gets input:select(inputDimension, i); outputs join along outputDimension."""
    x, children = b.tensor(m, x), m.children()
    s = b.shape(x)
    axis = _dim(m, m.int("inputDimension"), len(s))
    if s[axis] > len(children):
        raise m.fail(f"input has {s[axis]} slices along dimension {axis + 1}, but only "
                     f"{len(children)} children")
    parts = b.node(m, Split(axis, (1,) * s[axis]), [x], outputs=s[axis])
    rest = s[:axis] + s[axis + 1:]
    outs = [b.tensor(c, b.run(c, b.node(m, Reshape(rest), [p]))) for c, p in zip(children, parts)]
    return b.node(m, Concat(_dim(m, m.int("outputDimension"), len(b.shape(outs[0])))), outs)


ELTWISE = {"nn.CAddTable": ("sum", ()), "nn.CSubTable": ("sum", (1.0, -1.0)),
           "nn.CMulTable": ("prod", ()), "nn.CMaxTable": ("max", ())}


@module(*ELTWISE)
def eltwise(b: Builder, m: Mod, x: Value) -> Value:
    xs = [b.tensor(m, v) for v in b.table(m, x)]
    mode, coeffs = ELTWISE[m.cls]
    if not xs or (coeffs and len(xs) != 2):
        raise m.fail(f"cannot combine a table of {len(xs)}")
    return b.node(m, Eltwise(mode, coeffs), xs)


@module("nn.JoinTable")
def join_table(b: Builder, m: Mod, x: Value) -> Value:
    xs = [b.tensor(m, v) for v in b.table(m, x)]
    if not xs:
        raise m.fail("receives an empty table")
    rank = len(b.shape(xs[0]))  # JoinTable looks at input[1]:dim()
    axis = _batch_dim(m, m.int("dimension"), rank, "nInputDims")
    if axis != m.int("dimension") - 1:
        b.note(m, "OpenCV joins along dimension - 1, ignoring nInputDims and negative dimensions")
    return b.node(m, Concat(axis), xs)


@module("nn.SelectTable")
def select_table(b: Builder, m: Mod, x: Value) -> Value:
    xs, i = b.table(m, x), m.int("index")
    j = i + len(xs) + 1 if i < 0 else i  # negative: from the end
    if not 1 <= j <= len(xs):
        raise m.fail(f"index {i} out of range for a table of {len(xs)}")
    return xs[j - 1]


@module("nn.Identity", "nn.Copy", "nn.Contiguous")
def identity(b: Builder, m: Mod, x: Value) -> Value:
    return x  # Copy casts types and Contiguous copies memory: both identities here


# --- convolution, linear ---------------------------------------------------------------------

def _pad(m: Mod) -> tuple[int, int]:
    """(padH, padW); old files store one ``padding`` for both (nn.SpatialConvolution's
    backCompatibility)."""
    if m.get("padding") is not None:
        return m.int("padding"), m.int("padding")  # (OpenCV ignores it: noted by conv)
    return m.int("padH", 0), m.int("padW", 0)


@module("nn.SpatialConvolution", "nn.SpatialConvolutionMM", "cudnn.SpatialConvolution",
        "nn.SpatialDilatedConvolution", "cudnn.SpatialDilatedConvolution")
def conv(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (4,))
    kh, kw = m.int("kH"), m.int("kW")  # constructor order is (kW, kH, dW, dH, padW, padH)
    groups = m.int("groups", 1)
    w = b.weight(m, "weight")
    n_out = m.int("nOutputPlane", w.shape[0])
    if w.size % (n_out * kh * kw):
        raise m.fail(f"weight of shape {list(w.shape)} does not hold {n_out}x?x{kh}x{kw}")
    w = w.reshape(n_out, w.size // (n_out * kh * kw), kh, kw)  # MM stores (nOut, nIn*kH*kW)
    bias = b.weight(m, "bias", required=False)
    if m.get("padding") and m.get("padW") is None:
        b.note(m, "OpenCV ignores the legacy padding field (no padW/padH)")
    op = Conv((kh, kw), (m.int("dH", 1), m.int("dW", 1)), _pad(m),
              (m.int("dilationH", 1), m.int("dilationW", 1)), groups, bias is not None)
    return b.node(m, op, [x], {"weight": w} | ({"bias": bias} if bias is not None else {}))


@module("nn.SpatialFullConvolution", "cudnn.SpatialFullConvolution")
def full_conv(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (4,))
    kh, kw = m.int("kH"), m.int("kW")
    w = b.weight(m, "weight")  # (nIn, nOut/groups, kH, kW)
    if w.ndim != 4:
        w = w.reshape(m.int("nInputPlane"), -1, kh, kw)
    bias = b.weight(m, "bias", required=False)
    op = Deconv((kh, kw), (m.int("dH", 1), m.int("dW", 1)), _pad(m), (1, 1), m.int("groups", 1),
                bias is not None, (m.int("adjH", 0), m.int("adjW", 0)))  # adj = output padding
    return b.node(m, op, [x], {"weight": w} | ({"bias": bias} if bias is not None else {}))


@module("nn.Linear")
def linear(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (1, 2))  # Torch7's Linear takes a vector or a matrix only
    w, bias = b.weight(m, "weight"), b.weight(m, "bias", required=False)
    weights = {"weight": w.reshape(w.shape[0], -1)} | ({"bias": bias} if bias is not None else {})
    if len(b.shape(x)) == 2:
        return b.node(m, Linear(bias is not None), [x], weights)
    row = b.node(m, Reshape((1, b.shape(x)[0])), [x])
    y = b.node(m, Linear(bias is not None), [row], weights)
    return b.node(m, Reshape((w.shape[0],)), [y])


# --- pooling ---------------------------------------------------------------------------------

def _window(m: Mod, legacy: bool = False) -> tuple[tuple[int, int], ...]:
    kh, kw = m.int("kH"), m.int("kW")
    pad = (0, 0) if legacy else (m.int("padH", 0), m.int("padW", 0))
    return (kh, kw), (m.int("dH", kh), m.int("dW", kw)), pad


def _pooled(b: Builder, m: Mod, x: str, k: tuple, s: tuple, p: tuple, ceil: bool) -> bool:
    """Whether the pooling drops a last window starting in the padding (the output size rule)."""
    # THNN: ceil or floor, then "ensure that the last pooling starts inside the image" when padded
    # (padW || padH). cudnn.torch computes ceil/floor((n + 2p - k) / s) + 1 and never drops.
    drop = m.cls.startswith("nn.") and any(p)
    out = tuple(pooled_size(n, kk, ss, pp, ceil, drop) for n, kk, ss, pp in zip(b.shape(x)[2:], k, s, p))
    if any(pp == 0 and o != pooled_size(n, kk, ss, pp, ceil, False)
           for o, n, kk, ss, pp in zip(out, b.shape(x)[2:], k, s, p)):
        b.note(m, "OpenCV keeps an extra last window on the unpadded axis")
    return drop


@module("nn.SpatialMaxPooling", "cudnn.SpatialMaxPooling")
def max_pool(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (4,))
    k, s, p = _window(m)
    ceil = bool(m.get("ceil_mode", False))
    return b.node(m, Pool("max", k, s, p, ceil, _pooled(b, m, x, k, s, p, ceil)), [x])


@module("nn.SpatialAveragePooling", "cudnn.SpatialAveragePooling")
def avg_pool(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (4,))
    legacy = m.get("ceil_mode") is None  # backwardCompatible(): no padding, padding counted
    k, s, p = _window(m, legacy)
    ceil = bool(m.get("ceil_mode", False))
    drop = _pooled(b, m, x, k, s, p, ceil)
    if m.cls.startswith("cudnn."):
        return _cudnn_avg(b, m, x, k, s, p, ceil)
    count = bool(m.get("count_include_pad", True))
    if m.get("count_include_pad") is None and any(p) and not legacy:
        b.note(m, "OpenCV reads a missing count_include_pad as false (Torch7: true)")
    # `if not self.divide then output:mul(kW*kH)`: false, and files older than the field, sum
    mode = "avg" if m.get("divide") else "sum"
    if mode == "sum" and not legacy:
        b.note(m, "OpenCV ignores divide = false (it averages where Torch7 sums)")
    return b.node(m, Pool(mode, k, s, p, ceil, drop, count), [x])


def _cudnn_avg(b: Builder, m: Mod, x: str, k: tuple, s: tuple, p: tuple, ceil: bool) -> str:
    # cudnn.torch: `count_include_pad ~= nil and count_include_pad or true` is always true, and
    # divide == false asserts. A round-up window's divisor is cuDNN's own: not reproduced.
    if m.get("divide") is False:
        raise m.fail("divide = false is not supported by cudnn (it asserts)")
    sizes = [[pooled_size(n, kk, ss, pp, c, False) for n, kk, ss, pp in zip(b.shape(x)[2:], k, s, p)]
             for c in (ceil, False)]
    if sizes[0] != sizes[1]:
        raise m.fail("ceil mode with a partial last window: cuDNN's divisor for it is unknown")
    return b.node(m, Pool("avg", k, s, p, ceil, False, True), [x])


# --- activations -----------------------------------------------------------------------------

SIMPLE = {"nn.Sigmoid": Simple("sigmoid"), "cudnn.Sigmoid": Simple("sigmoid"),
          "nn.Tanh": Simple("tanh"), "cudnn.Tanh": Simple("tanh"), "nn.Abs": Simple("abs"),
          "nn.Exp": Exp(), "nn.Log": Log(), "nn.Square": Power(2.0),
          "nn.Sqrt": Power(0.5)}  # THNN's CPU Sqrt ignores its eps (the CUDA one adds it)


@module(*SIMPLE)
def simple(b: Builder, m: Mod, x: Value) -> Value:
    return b.node(m, SIMPLE[m.cls], [b.tensor(m, x)])


@module("nn.ReLU", "cudnn.ReLU", "nn.Threshold")
def threshold(b: Builder, m: Mod, x: Value) -> Value:
    # nn.ReLU is Threshold(0, 0); Threshold(th, v) is y = x > th ? x : v, not a ReLU
    th, val = m.num("threshold", 0.0), m.num("val", 0.0)
    op = Relu() if th == 0 and val == 0 and m.cls != "nn.Threshold" else Threshold(th, val)
    return b.node(m, op, [b.tensor(m, x)])


@module("nn.ReLU6", "nn.HardTanh", "nn.Clamp")
def clip(b: Builder, m: Mod, x: Value) -> Value:
    if m.cls == "nn.ReLU6":
        low, high = 0.0, 6.0
    else:  # Clamp is a HardTanh subclass: both keep min_val/max_val
        low, high = m.num("min_val", m.num("min_value", -1.0)), m.num("max_val", m.num("max_value", 1.0))
    return b.node(m, Clip(low, high), [b.tensor(m, x)])


@module("nn.LeakyReLU")
def leaky_relu(b: Builder, m: Mod, x: Value) -> Value:
    return b.node(m, Relu(m.num("negval", 0.01)), [b.tensor(m, x)])


@module("nn.ELU")
def elu(b: Builder, m: Mod, x: Value) -> Value:
    return b.node(m, Elu(m.num("alpha", 1.0)), [b.tensor(m, x)])


@module("nn.PReLU")
def prelu(b: Builder, m: Mod, x: Value) -> Value:
    # nOutputPlane 0: one shared slope; else one per channel (dim 2 of a batch)
    w = b.weight(m, "weight").reshape(-1)
    if m.int("nOutputPlane", 0) == 0:
        w = w[:1]
    return b.node(m, PRelu(), [b.tensor(m, x)], {"weight": w})


@module("nn.SoftPlus")
def softplus(b: Builder, m: Mod, x: Value) -> Value:
    # y = log(1 + exp(beta x)) / beta; Torch7 returns x where beta x > threshold (20): the two
    # differ by less than exp(-20)
    x, beta = b.tensor(m, x), m.num("beta", 1.0)
    if beta != 1:
        x = b.node(m, Power(1.0, beta), [x])
    y = b.node(m, Simple("softplus"), [x])
    return y if beta == 1 else b.node(m, Power(1.0, 1 / beta), [y])


@module("nn.Power", "nn.MulConstant", "nn.AddConstant")
def power(b: Builder, m: Mod, x: Value) -> Value:
    if m.cls == "nn.Power":
        op = Power(m.num("pow"))
    elif m.cls == "nn.MulConstant":
        op = Power(1.0, m.num("constant_scalar"))
    else:
        op = Power(1.0, 1.0, m.num("constant_scalar"))
    return b.node(m, op, [b.tensor(m, x)])


@module("nn.Dropout", "nn.SpatialDropout")
def dropout(b: Builder, m: Mod, x: Value) -> Value:
    # Dropout v2 (the default since 2014) scales while training; v1 files (no v2 field) and
    # SpatialDropout multiply by (1 - p) at inference
    p = m.num("p", 0.5)
    v2 = m.cls == "nn.Dropout" and bool(m.get("v2", False))
    return b.node(m, Dropout(p, 1.0 if v2 else 1.0 - p), [b.tensor(m, x)])


# --- normalization ---------------------------------------------------------------------------

def _truthy(v: object) -> bool:
    """A Lua flag passed to THNN through the FFI: false, nil and the number 0 are false."""
    return bool(v) and v is not None


@module("nn.BatchNormalization", "nn.SpatialBatchNormalization", "cudnn.BatchNormalization",
        "cudnn.SpatialBatchNormalization")
def batch_norm(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (4,) if "Spatial" in m.cls else (2,))
    eps = m.num("eps", 1e-5)
    mean = b.weight(m, "running_mean")
    var = b.weight(m, "running_var", required=False)
    if var is None:  # BN version 1 stored running_std = 1/sqrt(var + eps) (BN:read converts)
        var = (b.weight(m, "running_std").astype(np.float64) ** -2 - eps).astype(np.float32)
    # a .t7 saved in training mode normalizes with the batch's own statistics; a Lua definition
    # is freshly built (train = true by default) and converted as deployed, i.e. :evaluate()d
    batch = b.from_file and _truthy(m.get("train"))
    if batch:
        b.note(m, "OpenCV uses the running statistics of a batch norm saved in training mode")
    bn = BatchNorm(eps, batch, rank=4 if "Spatial" in m.cls else 2, momentum=float(m.num("momentum", 0.1)))
    y = b.node(m, bn, [x],
               {"running_mean": mean, "running_var": var})
    b.bn_trees[b.g.nodes[-1].attr] = m.obj
    w, bias = b.weight(m, "weight", required=False), b.weight(m, "bias", required=False)
    if w is None and bias is None:
        return y
    aff = {"weight": w} if w is not None else {}
    aff |= {"bias": bias} if bias is not None else {}
    return b.node(m, Affine(1, w is not None, bias is not None), [y], aff)


@module("nn.SpatialCrossMapLRN", "cudnn.SpatialCrossMapLRN")
def lrn(b: Builder, m: Mod, x: Value) -> Value:
    # x / (k + alpha/size * sum of x^2 over size channels)^beta, like Caffe's ACROSS_CHANNELS
    size = m.int("size", 5)
    if size % 2 == 0:
        raise m.fail(f"even size {size}: Torch7's CPU and CUDA kernels place that window differently")
    op = LRN(size, m.num("alpha", 1e-4), m.num("beta", 0.75), m.num("k", 1.0))
    return b.node(m, op, [_rank(b, m, x, (4,))])


@module("nn.Normalize")
def normalize(b: Builder, m: Mod, x: Value) -> Value:
    # y = x / (sum |x|^p + eps)^(1/p) over dim 2 (eps inside the root); p = inf: x / (max|x| + eps)
    x = _rank(b, m, x, (2,))  # Torch7 asserts input:dim() <= 2
    p = m.num("p")
    if not p > 0:
        raise m.fail(f"p = {p} must be positive")
    if p == math.inf:
        b.note(m, "OpenCV's Normalize does not compute the infinity norm")
    return b.node(m, LpNormalize((1,), p, m.num("eps", 1e-10)), [x])


# --- softmax ---------------------------------------------------------------------------------

# THNN SoftMax/LogSoftMax and cudnn's CHANNEL mode: 1-D and 3-D are one sample (dim 1), 2-D and
# 4-D a batch (dim 2): 4-D normalizes over channels at every pixel
SOFTMAX_AXIS = {1: 0, 2: 1, 3: 0, 4: 1}
# THNN's LogSoftMax is x - (max + log sum exp(x - max)): finite however spread the logits are
LOG_UNDERFLOW = "OpenCV's LogSoftMax takes log(softmax), -inf where a probability underflows float32"


@module("nn.SoftMax", "nn.LogSoftMax", "nn.SpatialSoftMax", "cudnn.SpatialSoftMax",
        "cudnn.SpatialLogSoftMax")
def softmax(b: Builder, m: Mod, x: Value) -> Value:
    instance, log = _cudnn_mode(m) if m.cls.startswith("cudnn.") else (False, "Log" in m.cls)
    if instance:
        return instance_softmax(b, m, x)
    x = _rank(b, m, x, tuple(SOFTMAX_AXIS))
    _log_notes(b, m, log)
    return b.node(m, Softmax(SOFTMAX_AXIS[len(b.shape(x))], log), [x])


CUDNN_MODES = {"CUDNN_SOFTMAX_MODE_INSTANCE": True, "CUDNN_SOFTMAX_MODE_CHANNEL": False}
CUDNN_ALGORITHMS = {"CUDNN_SOFTMAX_LOG": True, "CUDNN_SOFTMAX_ACCURATE": False, "CUDNN_SOFTMAX_FAST": False}


def _cudnn_mode(m: Mod) -> tuple[bool, bool]:
    """(over the whole sample, log) of a cudnn softmax. cudnn.torch hands its stored ``mode`` and
    ``algorithm`` to cuDNN, so they win over the class's defaults (INSTANCE for SoftMax and
    LogSoftMax, CHANNEL for the Spatial ones, LOG for the Log ones); cudnn.torch R5+ resets
    SoftMax's and LogSoftMax's at every forward, so a file it saved holds those defaults."""
    mode, algorithm = m.get("mode"), m.get("algorithm")
    instance = m.cls in ("cudnn.SoftMax", "cudnn.LogSoftMax") if mode is None else CUDNN_MODES.get(mode)
    log = "Log" in m.cls if algorithm is None else CUDNN_ALGORITHMS.get(algorithm)
    if instance is None or log is None:
        raise m.fail(f"unknown softmax mode {mode!r} or algorithm {algorithm!r}")
    return instance, log


def _log_notes(b: Builder, m: Mod, log: bool) -> None:
    if log != ("Log" in m.cls):
        b.note(m, "OpenCV follows the class name, not the stored algorithm")
    if log:
        b.note(m, LOG_UNDERFLOW)


@module("cudnn.SoftMax", "cudnn.LogSoftMax")
def instance_softmax(b: Builder, m: Mod, x: Value) -> Value:
    # cudnn.SoftMax uses CUDNN_SOFTMAX_MODE_INSTANCE: one distribution over all C*H*W values of a
    # sample (3-D: the whole tensor is one sample), not per pixel like nn.SoftMax
    instance, log = _cudnn_mode(m)
    if not instance:
        return softmax(b, m, x)
    x = _rank(b, m, x, (1, 2, 3, 4))
    s = b.shape(x)
    _log_notes(b, m, log)
    if len(s) <= 2:
        return b.node(m, Softmax(len(s) - 1, log), [x])
    if math.prod(s[2:]) > 1:
        b.note(m, "OpenCV normalizes per pixel; cuDNN's INSTANCE mode over the whole sample")
    flat = b.node(m, Reshape((0, -1) if len(s) == 4 else (1, math.prod(s))), [x])
    return b.node(m, Reshape((0, *s[1:]) if len(s) == 4 else s), [b.node(m, Softmax(1, log), [flat])])


# --- shape -----------------------------------------------------------------------------------

def _sizes(m: Mod, key: str) -> list[int]:
    v = m.get(key)
    if isinstance(v, dict):
        v = [v[k] for k in sorted(v)]
    if v is None:
        raise m.fail(f"has no {key!r}")
    try:
        sizes = np.asarray(v, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise m.fail(f"field {key!r} is not a list of sizes") from None
    if not all(np.isfinite(sizes)) or any(d != int(d) for d in sizes):
        raise m.fail(f"field {key!r} = {sizes.tolist()} is not a list of whole sizes")
    return [int(d) for d in sizes]


def torch_view(s: tuple, size: list[int], n_dims: int | None) -> tuple[int, ...]:
    """nn.View's result shape for input shape ``s`` (View.lua's batchsize())."""
    ind = len(s)
    maxdim = ind if n_dims is None else n_dims
    if maxdim > ind:
        raise ValueError(f"numInputDims {n_dims} exceeds the input's {ind} dims")
    known = math.prod(d for d in size if d >= 0)
    ine = math.prod(s[ind - maxdim:])
    if known == 0 or ine % known:
        raise ValueError(f"input {list(s)} does not view as {size}")
    bsz = 1 if -1 in size else ine // known  # the remainder is the batch, or the -1 dim
    bsz *= math.prod(s[:ind - maxdim])  # dims beyond numInputDims are the batch
    dims = list(size) if bsz == 1 and (n_dims is None or ind <= n_dims) else [bsz, *size]
    if -1 in dims:
        rest = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(s) // rest
    if math.prod(dims) != math.prod(s):
        raise ValueError(f"input {list(s)} does not view as {size}")
    return tuple(dims)


@module("nn.View")
def view(b: Builder, m: Mod, x: Value) -> Value:
    x, size = b.tensor(m, x), _sizes(m, "size")
    s, n = b.shape(x), m.get("numInputDims")
    try:
        out = torch_view(s, size, None if n is None else int(n))
        if s[0] == 1 and len(s) > 1:
            # Torch7 drops the batch of a single sample ("special case"); keep N = 1 as the same
            # module keeps N = 2, so the graph stays a batch graph (same values, leading 1)
            two = torch_view((2, *s[1:]), size, None if n is None else int(n))
            out = (1, *out) if two[0] == 2 and two[1:] == out else out
    except ValueError as e:
        raise m.fail(str(e)) from None
    return b.node(m, Reshape(_batch_kept(s, out)), [x])


def _batch_kept(s: tuple, out: tuple) -> tuple[int, ...]:
    """A reshape's target with its first dim copied (0) when it is the input's batch dim."""
    return (0, *out[1:]) if len(s) > 1 and len(out) > 1 and out[0] == s[0] else out


@module("nn.Reshape")
def reshape(b: Builder, m: Mod, x: Value) -> Value:
    # Reshape.lua: batch unless batchMode == false, or (batchMode nil and the input has exactly
    # nelement values and a first dim other than 1)
    x, size = b.tensor(m, x), tuple(_sizes(m, "size"))
    s, mode = b.shape(x), m.get("batchMode")
    single = mode is False or (mode is None and math.prod(s) == math.prod(size) and s[0] != 1)
    out = size if single else (s[0], *size)
    if math.prod(out) != math.prod(s):
        raise m.fail(f"cannot reshape {list(s)} to {list(out)}")
    return b.node(m, Reshape(_batch_kept(s, out) if not single else out), [x])


@module("nn.Mean", "nn.Sum")
def reduce(b: Builder, m: Mod, x: Value) -> Value:
    x = b.tensor(m, x)
    rank = len(b.shape(x))
    axis = _batch_dim(m, m.int("dimension", 1), rank, "nInputDims")
    mean = m.cls == "nn.Mean" or bool(m.get("sizeAverage", False))
    keep = m.get("squeeze") is False or rank == 1  # the reduced dim is selected away unless so
    return b.node(m, Reduce("mean" if mean else "sum", (axis,), keep), [x])


@module("nn.Narrow")
def narrow(b: Builder, m: Mod, x: Value) -> Value:
    x = b.tensor(m, x)
    s = b.shape(x)
    axis, start = _dim(m, m.int("dimension"), len(s)), m.int("index")
    if start < 1:  # nn versions disagree on a negative offset: refuse rather than guess
        raise m.fail(f"offset {start} is not supported (1-based offsets only)")
    length = m.int("length", 1)
    if length < 0:  # counts from the end: -1 reaches the last element
        length = s[axis] - start + length + 2
    if length < 1 or start - 1 + length > s[axis]:
        raise m.fail(f"cannot take {length} from offset {start} of a dim of {s[axis]}")
    if m.int("length", 1) < 0:  # counted from the end at any size: crop both ends
        around = tuple((1 - start, m.int("length", 1) + 1) if i == axis else (0, 0) for i in range(len(s)))
        return b.node(m, Pad(around), [x])
    starts = tuple(start - 1 if i == axis else 0 for i in range(len(s)))
    sizes = tuple(length if i == axis else 0 for i in range(len(s)))  # 0: the whole dim
    return b.node(m, Crop(starts, sizes), [x])


@module("nn.Transpose")
def transpose(b: Builder, m: Mod, x: Value) -> Value:
    x = b.tensor(m, x)
    rank = len(b.shape(x))
    n = m.get("numInputDims")
    offset = rank - int(n) if n is not None else 0
    order = list(range(rank))
    for pair in (m.get("permutations") or {}).values():  # a sequence of swaps, in order
        i, j = (_dim(m, int(pair[k]) + offset, rank) for k in (1, 2))
        order[i], order[j] = order[j], order[i]
    return b.node(m, Transpose(tuple(order)), [x])


@module("nn.Padding")
def padding(b: Builder, m: Mod, x: Value) -> Value:
    """Padding(dim, pad, nInputDim, value, index): |pad| values inserted before input index
    ``index`` (pad < 0) or before index (n - index + 2) counted from the start (pad > 0)."""
    x = b.tensor(m, x)
    s = b.shape(x)
    dim, pad, n_in = m.int("dim"), m.int("pad"), m.get("nInputDim")
    if n_in is not None and len(s) != int(n_in):
        dim += 1  # Padding shifts whenever the rank differs from nInputDim
    axis, value = _dim(m, dim, len(s)), m.num("value", 0.0)
    n, index = s[axis], m.int("index", 1)
    at = n - index + 2 if pad > 0 else index
    if pad == 0:
        return x
    if not 1 <= at <= n + 1:
        raise m.fail(f"index {index} out of range for a dim of {n}")
    around = [(0, 0)] * len(s)
    if at in (1, n + 1):
        around[axis] = (abs(pad), 0) if at == 1 else (0, abs(pad))
        return b.node(m, Pad(tuple(around), "constant", value), [x])
    head, tail = b.node(m, Split(axis, (at - 1, n - at + 1)), [x], outputs=2)
    around[axis] = (0, abs(pad))
    return b.node(m, Concat(axis), [b.node(m, Pad(tuple(around), "constant", value), [head]), tail])


PAD_MODES = {"nn.SpatialZeroPadding": "constant", "nn.SpatialReflectionPadding": "reflect",
             "nn.SpatialReplicationPadding": "edge"}


@module(*PAD_MODES)
def spatial_pad(b: Builder, m: Mod, x: Value) -> Value:
    # the last two dims of a 3-D (C, H, W) or 4-D input; zero padding crops where negative
    x = _rank(b, m, x, (3, 4))
    t, bo, le, r = (m.int(k, 0) for k in ("pad_t", "pad_b", "pad_l", "pad_r"))
    mode = PAD_MODES[m.cls]
    if mode != "constant" and min(t, bo, le, r) < 0:
        raise m.fail("negative padding (cropping) exists only in SpatialZeroPadding")
    pads = ((0, 0),) * (len(b.shape(x)) - 2) + ((t, bo), (le, r))
    return b.node(m, Pad(pads, mode), [x])


@module("nn.SpatialUpSamplingNearest")
def upsample_nearest(b: Builder, m: Mod, x: Value) -> Value:
    x = _rank(b, m, x, (4,))
    f = m.int("scale_factor", m.int("scale", 0) or None)  # older versions call it scale
    if f is None or f < 1:
        raise m.fail(f"scale factor {f} must be a positive integer")
    return b.node(m, Resize(mode="nearest", scale=f), [x])
