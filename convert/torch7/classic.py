"""The older Torch7 classes: max unpooling (ENet), the 2013 demos' layers (SpatialConvolutionMap,
SpatialSubSampling, the local contrast normalizations, nnx's SpatialClassifier) and dpnn's Inception.

Registered into the same table as modules.py (``builder.MODULES``; the frontend imports both). Sources:
torch/nn (Lua + THNN), clementfarabet/lua---nnx, Element-Research/dpnn.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ops.conv import Conv
from ..ops.lcn import LocalNorm
from ..ops.shape import Reshape, Transpose
from ..ops.unpool import MaxUnpool
from .builder import MODULES, Builder, Mod, Value, module
from .modules import _rank, _window
from .t7file import TorchObject

# --- max unpooling ---------------------------------------------------------------------------

_max_pool = MODULES["nn.SpatialMaxPooling"]


def _pool_inputs(b: Builder) -> dict[int, str]:
    """id(pooling module) -> the input of its latest run: what its indices are the argmax of."""
    return b.__dict__.setdefault("pool_inputs", {})


@module("nn.SpatialMaxPooling")
def max_pool(b: Builder, m: Mod, x: Value) -> Value:
    y = _max_pool(b, m, x)
    _pool_inputs(b)[id(m.obj)] = b.tensor(m, x)
    return y


@module("nn.SpatialMaxUnpooling")
def max_unpool(b: Builder, m: Mod, x: Value) -> Value:
    """Scatters x to the argmax positions of its pooling module's latest forward (zeros
    elsewhere), into a map the size of that pooling's input (oheight x owidth)."""
    x = _rank(b, m, x, (4,))
    pool = m.get("pooling")
    if not isinstance(pool, TorchObject) or pool.cls != "nn.SpatialMaxPooling":
        raise m.fail("its 'pooling' field is not an nn.SpatialMaxPooling module")
    src = _pool_inputs(b).get(id(pool))
    if src is None:
        raise m.fail("its pooling module has not run before it (Torch7 would have no indices)")
    p = Mod(pool, m.path, m.file)
    k, s, pad = _window(p)
    op = MaxUnpool(k, s, pad, bool(p.get("ceil_mode", False)))
    y = b.node(m, op, [x, src])
    # OpenCV sizes the output (n - 1) * stride + kernel - 2 * pad, not the pooling's input size
    if any((n - 1) * ss + kk - 2 * pp != o for n, ss, kk, pp, o in
           zip(b.shape(x)[2:], s, k, pad, b.shape(src)[2:])):
        b.note(m, "OpenCV sizes the unpooled map from the pooled one, not from the pooling's input")
    return y


# --- convolutions with fixed structure -------------------------------------------------------

def _spatial(b: Builder, m: Mod, x: Value, make: Callable[[str], str]) -> str:
    """Torch7's spatial modules take a (C, H, W) input as one sample: run ``make`` on a batch of one."""
    x = _rank(b, m, x, (3, 4))
    s = b.shape(x)
    if len(s) == 4:
        return make(x)
    y = make(b.node(m, Reshape((1, *s)), [x]))
    return b.node(m, Reshape(b.shape(y)[1:]), [y])


@module("nn.SpatialSubSampling")
def subsampling(b: Builder, m: Mod, x: Value) -> Value:
    """y[c] = bias[c] + weight[c] * (sum of x[c] over each kW x kH window): a depthwise conv."""
    kh, kw = m.int("kH"), m.int("kW")
    w, bias = b.weight(m, "weight").reshape(-1), b.weight(m, "bias").reshape(-1)
    c = m.int("nInputPlane", w.size)
    if w.size != c or bias.size != c:
        raise m.fail(f"weight {w.size} and bias {bias.size} values for {c} planes")
    _fits(b, m, x, kh, kw)
    kernel = w[:, None, None, None] * np.ones((1, 1, kh, kw), np.float32)
    op = Conv((kh, kw), (m.int("dH", 1), m.int("dW", 1)), group=c)
    return _spatial(b, m, x, lambda v: b.node(m, op, [v], {"weight": kernel, "bias": bias}))


def _fits(b: Builder, m: Mod, x: Value, kh: int, kw: int) -> None:
    """A kernel that fits the input (checked before any kernel-sized array is made)."""
    shape = b.shape(b.tensor(m, x))
    if kh < 1 or kw < 1 or len(shape) < 3 or kh > shape[-2] or kw > shape[-1]:
        raise m.fail(f"a {kh}x{kw} kernel does not fit the input {list(shape)}")


def _table(m: Mod, w: np.ndarray) -> np.ndarray:
    """connTable as 0-based (input, output) pairs, checked."""
    t = m.get("connTable")
    if not isinstance(t, np.ndarray) or t.ndim != 2 or t.shape[1] != 2 or t.shape[0] == 0:
        raise m.fail("its connTable is not an N x 2 tensor")
    if not np.all(np.isfinite(t)) or not np.all(t == np.round(t)) or t.min() < 1:
        raise m.fail("its connTable holds values that are not 1-based plane numbers")
    if w.shape[0] != t.shape[0]:
        raise m.fail(f"{w.shape[0]} kernels for {t.shape[0]} connections")
    return t.astype(np.int64) - 1


def _groups(t: np.ndarray, n_in: int, n_out: int) -> int:
    """The most groups a grouped convolution can split the connections into."""
    for g in sorted((d for d in range(1, math.gcd(n_in, n_out) + 1) if n_in % d == n_out % d == 0),
                    reverse=True):
        if np.all(t[:, 0] // (n_in // g) == t[:, 1] // (n_out // g)):
            return g
    return 1


@module("nn.SpatialConvolutionMap")
def conv_map(b: Builder, m: Mod, x: Value) -> Value:
    """y[o] = bias[o] + sum over connections k = (i, o) of xcorr(x[i], weight[k]) (valid, strided):
    a convolution whose weight is zero where the table has no connection (grouped when it can)."""
    kh, kw = m.int("kH"), m.int("kW")
    w, bias = b.weight(m, "weight"), b.weight(m, "bias").reshape(-1)
    if w.size % (kh * kw):
        raise m.fail(f"weight of shape {list(w.shape)} does not hold {kh}x{kw} kernels")
    _fits(b, m, x, kh, kw)
    w = w.reshape(-1, kh, kw)
    t = _table(m, w)
    n_in, n_out = m.int("nInputPlane", int(t[:, 0].max()) + 1), m.int("nOutputPlane", bias.size)
    if t[:, 0].max() >= n_in or t[:, 1].max() >= n_out or bias.size != n_out:
        raise m.fail(f"connTable or bias does not fit {n_in} input and {n_out} output planes")
    if len(b.shape(x)) >= 3 and n_in != b.shape(x)[-3]:
        raise m.fail(f"nInputPlane {n_in} does not fit an input of {b.shape(x)[-3]} channels")
    dense = np.zeros((n_out, n_in, kh, kw), np.float64)
    np.add.at(dense, (t[:, 1], t[:, 0]), w.astype(np.float64))
    g = _groups(t, n_in, n_out)
    blocks = [dense[o, (o // (n_out // g)) * (n_in // g):][:n_in // g] for o in range(n_out)]
    op = Conv((kh, kw), (m.int("dH", 1), m.int("dW", 1)), group=g)
    weights = {"weight": np.stack(blocks).astype(np.float32), "bias": bias}
    return _spatial(b, m, x, lambda v: b.node(m, op, [v], weights))


# --- local contrast normalization ------------------------------------------------------------

def _kernel(b: Builder, m: Mod, planes: int) -> np.ndarray:
    """The effective 2-D kernel: nn normalizes the kernel to sum 1 over planes x kernel (an
    idempotent step, so a saved, already normalized kernel is unchanged) and applies a 1-D one
    twice, along W then along H."""
    k = b.weight(m, "kernel").astype(np.float64)
    if k.ndim not in (1, 2) or any(n % 2 == 0 for n in k.shape):
        raise m.fail(f"kernel of shape {list(k.shape)}: needs a 1-D or 2-D kernel of odd sizes")
    if k.sum() == 0:
        raise m.fail("kernel sums to zero")
    k = k / (k.sum() * planes)
    return (np.outer(k, k) if k.ndim == 1 else k).astype(np.float32)


def _planes(b: Builder, m: Mod, x: str) -> int:
    n = m.int("nInputPlane", 1)
    s = b.shape(x)
    if s[-3] != n:
        raise m.fail(f"input {list(s)} does not have {n} planes")
    return n


def _local(b: Builder, m: Mod, x: Value, ops: list[LocalNorm]) -> Value:
    x = _rank(b, m, x, (3, 4))
    return _apply(b, m, x, ops, _kernel(b, m, _planes(b, m, x)))


def _apply(b: Builder, m: Mod, x: str, ops: list[LocalNorm], kernel: np.ndarray) -> str:
    """Apply the ops in turn to a (C, H, W) or (N, C, H, W) input."""
    def chain(y: str) -> str:
        for op in ops:
            y = b.node(m, op, [y], {"kernel": kernel})
        return y

    return _spatial(b, m, x, chain)


def _divisive(m: Mod) -> LocalNorm:
    th = m.num("threshold", 1e-4)
    return LocalNorm("div", th, m.num("thresval", th))


@module("nn.SpatialSubtractiveNormalization")
def subtractive(b: Builder, m: Mod, x: Value) -> Value:
    return _local(b, m, x, [LocalNorm("sub")])


@module("nn.SpatialDivisiveNormalization")
def divisive(b: Builder, m: Mod, x: Value) -> Value:
    return _local(b, m, x, [_divisive(m)])


@module("nn.SpatialContrastiveNormalization")
def contrastive(b: Builder, m: Mod, x: Value) -> Value:
    # its normalizer is Sequential(Subtractive(n, kernel), Divisive(n, kernel, threshold, thresval))
    return _local(b, m, x, [LocalNorm("sub"), _divisive(m)])


@module("nn.SpatialNormalization")
def nnx_normalization(b: Builder, m: Mod, x: Value) -> Value:
    """nnx's deprecated SpatialNormalization: the kernel normalized to sum 1 (not per plane), the
    mean removed, then a division by the local std thresholded at ``fixedThres``, or else at the
    sample's mean std (at least 1e-3)."""
    x = _rank(b, m, x, (3, 4))
    k = m.get("kernel")
    if not isinstance(k, np.ndarray):
        raise m.fail("a pair of 1-D kernels is not supported (only one 2-D kernel)")
    k = b.weight(m, "kernel").astype(np.float64)
    if k.ndim != 2 or any(n % 2 == 0 for n in k.shape) or k.sum() == 0:
        raise m.fail(f"kernel of shape {list(k.shape)}: needs a 2-D kernel of odd sizes, summing to non-zero")
    if b.shape(x)[-3] != m.int("nfeatures", b.shape(x)[-3]):
        raise m.fail(f"input {list(b.shape(x))} does not have {m.int('nfeatures')} planes")
    fixed = m.get("fixedThres")
    op = LocalNorm("nnx", adaptive=True) if fixed is None else LocalNorm("nnx", m.num("fixedThres"),
                                                                          m.num("fixedThres"))
    return _apply(b, m, x, [op], (k / k.sum()).astype(np.float32))


# --- wrappers --------------------------------------------------------------------------------

def _inner(m: Mod, key: str) -> Mod:
    """The wrapped module: the ``key`` field, else the only child in ``modules``."""
    inner = m.get(key)
    if isinstance(inner, TorchObject):
        found = Mod(inner, f"{m.path}.1" if m.path else "1", m.file)
    elif len(m.children()) == 1:
        found = m.children()[0]
    else:
        raise m.fail(f"has no {key!r} module")
    if found.cls not in MODULES:  # a field outside `modules` escapes the support check
        raise m.fail(f"wraps a {found.cls}, which is not supported")
    return found


@module("nn.Inception", container=True)
def inception(b: Builder, m: Mod, x: Value) -> Value:
    # dpnn's Inception is a Decorator: forward is its DepthConcat's (field `module`, = modules[1])
    return b.run(_inner(m, "module"), x)


@module("nn.SpatialClassifier", container=True)
def spatial_classifier(b: Builder, m: Mod, x: Value) -> Value:
    """nnx: the classifier runs on every pixel, (K, H, W) -> (H*W, K) -> (H*W, N) -> (N, H, W).
    A 4-D input is taken as a batch of such samples."""
    x = _rank(b, m, x, (3, 4))
    s = b.shape(x)
    batch = (s[0],) if len(s) == 4 else ()
    k, h, w = s[-3:]
    rows = b.node(m, Reshape((math.prod(batch) * h * w, k)),
                  [b.node(m, Transpose((*range(len(batch)), len(s) - 2, len(s) - 1, len(s) - 3)), [x])])
    y = b.tensor(m, b.run(_inner(m, "classifier"), rows))
    if len(b.shape(y)) != 2 or b.shape(y)[0] != math.prod(batch) * h * w:
        raise m.fail(f"its classifier gives {list(b.shape(y))} for {h * w} rows")
    if m.get("spatialOutput") is False:
        return y if not batch else b.node(m, Reshape((*batch, h * w, b.shape(y)[1])), [y])
    maps = b.node(m, Reshape((*batch, h, w, b.shape(y)[1])), [y])
    n = len(b.shape(maps))
    return b.node(m, Transpose((*range(n - 3), n - 1, n - 3, n - 2)), [maps])
