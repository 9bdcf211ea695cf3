"""Normalizations: LRN, batch norm, per-channel affine (Caffe Scale/Bias), MVN, Lp normalize."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import fmt, helper


def _channel_window_sum(sq: np.ndarray, size: int, before: int) -> np.ndarray:
    c = sq.shape[1]
    padded = np.pad(sq, [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (sq.ndim - 2))
    return sum(padded[:, i:i + c] for i in range(size))


@dataclass(frozen=True, slots=True)
class LRN(Op):
    """ACROSS: y = x / (k + alpha/size * sum_{c' in window(c)} x[c']^2) ** beta, window
    [c - before, c - before + size - 1].  WITHIN: y = x * (1 + alpha/size^2 * sum over the
    size x size spatial window (zero padded by (size-1)/2) of x^2) ** -beta  (Caffe; k unused).
    """

    kind = "lrn"
    size: int
    alpha: float
    beta: float
    k: float = 1.0
    region: str = "across"
    before: int = -1  # -1: (size - 1) // 2

    def lead(self) -> int:
        return (self.size - 1) // 2 if self.before < 0 else self.before

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4:
            raise ShapeError(f"LRN needs a 4-D input, got {list(shapes[0])}")
        if self.region == "within" and self.size % 2 == 0:
            raise ShapeError(f"WITHIN_CHANNEL LRN needs an odd local_size, got {self.size}")
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        if self.region == "across":
            s = _channel_window_sum(x * x, self.size, self.lead())
            return [x / (self.k + self.alpha / self.size * s) ** self.beta]
        p = (self.size - 1) // 2
        sq = np.pad(x * x, ((0, 0), (0, 0), (p, p), (p, p)))
        h, wd = x.shape[2:]
        s = sum(sq[:, :, i:i + h, j:j + wd] for i in range(self.size) for j in range(self.size))
        return [x * (1 + self.alpha / self.size**2 * s) ** -self.beta]


    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        a = f"{fmt(self.alpha)}, {fmt(self.beta)}"
        if self.region == "across" and self.lead() == self.size // 2:
            return f"F.local_response_norm({args[0]}, {self.size}, {a}, {fmt(self.k)})"
        return f"lrn({args[0]}, {self.region!r}, {self.size}, {a}, {fmt(self.k)}, {self.lead()})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x = ins[0]
        c = b.shape(x)[1]
        # ONNX Runtime's LRN refuses alpha, beta or bias <= 0 (Caffe takes any): then the long form
        native = min(np.float32(self.alpha), np.float32(self.beta), np.float32(self.k)) > 0  # as stored
        if native and self.region == "across" and self.size % 2 and self.lead() == (self.size - 1) // 2:
            b.op("LRN", [x], outs, size=self.size, alpha=float(self.alpha), beta=float(self.beta),
                 bias=float(self.k))
            return
        sq = b.op("Mul", [x, x])
        if self.region == "across":  # mean over a channel window: pool a (N, 1, C, H*W) view
            v = b.op("Reshape", [sq, b.const([0, 1, c, -1], "int64")])  # any N, H, W
            before, after = self.lead(), self.size - 1 - self.lead()
            m = b.op("AveragePool", [v], kernel_shape=[self.size, 1], count_include_pad=1,
                     pads=[before, 0, after, 0])
            m = b.op("Reshape", [m, b.op("Shape", [x])])
            scale = b.op("Add", [b.op("Mul", [m, b.const(self.alpha)]), b.const(self.k)])
        else:
            p = (self.size - 1) // 2
            m = b.op("AveragePool", [sq], kernel_shape=[self.size] * 2, pads=[p] * 4,
                     count_include_pad=1)
            scale = b.op("Add", [b.op("Mul", [m, b.const(self.alpha)]), b.const(1.0)])
        b.op("Mul", [x, b.op("Pow", [scale, b.const(-self.beta)])], outs)


helper("lrn", '''
def lrn(x, region, size, alpha, beta, k, before):
    """Local response normalization; ACROSS uses channels [c - before, c - before + size - 1]."""
    sq = x * x
    if region == "across":
        sq = F.pad(sq.unsqueeze(1), (0, 0, 0, 0, before, size - 1 - before)).squeeze(1)
        mean = F.avg_pool3d(sq.unsqueeze(1), (size, 1, 1), stride=1).squeeze(1)
        return x / (k + alpha * mean) ** beta
    mean = F.avg_pool2d(sq, size, stride=1, padding=(size - 1) // 2, count_include_pad=True)
    return x * (1 + alpha * mean) ** -beta
''')


@dataclass(frozen=True, slots=True)
class BatchNorm(Op):
    """y = (x - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c], channel axis 1 (weight and
    bias only when ``affine``: Caffe BatchNorm + Scale fused by convert/fuse.py, Torch7 BN).
    With ``batch_stats`` the mean and (biased) variance come from the batch itself (Caffe
    use_global_stats: false, Torch7 training): then no statistics are stored.
    ``momentum``: how much of a batch's statistics the running ones take in training (PyTorch's
    and Torch7's convention; Caffe's is 1 - moving_average_fraction); inference does not use it.

    PyTorch: ``nn.BatchNorm1d/2d/3d`` by ``rank`` (the input's), whose state_dict keys are the roles.
    """

    kind = "batchnorm"
    stats = ("running_mean", "running_var")
    eps: float = 1e-5
    batch_stats: bool = False
    rank: int = 4
    affine: bool = False
    momentum: float = 0.1

    def roles(self) -> tuple[str, ...]:
        return (() if self.batch_stats else self.stats) + (("weight", "bias") if self.affine else ())

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        shapes = [list(s) for s in w.values()]
        if any(len(s) != 1 or s != shapes[0] for s in shapes):
            return f"statistics/parameters of shapes {shapes} (one value per channel expected)"
        return None

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        c = next(iter(w.values()))[0] if w else shapes[0][1] if len(shapes[0]) > 1 else 0
        if len(shapes[0]) != self.rank or self.rank < 2 or shapes[0][1] != c:
            raise ShapeError(f"{c} channels of statistics for input {list(shapes[0])} (rank {self.rank} expected)")
        if self.batch_stats and np.prod(shapes[0]) == shapes[0][1]:  # PyTorch refuses it too
            raise ShapeError(f"batch statistics of input {list(shapes[0])} have one value per channel")
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        view = (1, -1) + (1,) * (x.ndim - 2)
        if self.batch_stats:
            axes = (0,) + tuple(range(2, x.ndim))
            mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
        else:
            mean = w["running_mean"].astype(np.float64).reshape(view)
            var = w["running_var"].astype(np.float64).reshape(view)
        y = (x - mean) / np.sqrt(var + self.eps)
        if self.affine:
            y = y * w["weight"].astype(np.float64).reshape(view) + w["bias"].astype(np.float64).reshape(view)
        return [y]

    def torch_module(self, w: dict[str, Shape]) -> str:
        c = next(iter(w.values()))[0]
        dims = {2: 1, 3: 1, 4: 2, 5: 3}.get(self.rank, 3)  # beyond 5-D: its tensors, called functionally
        args = [str(c)] + ([f"eps={fmt(self.eps)}"] if self.eps != 1e-5 else [])
        args += [f"momentum={fmt(self.momentum)}"] if self.momentum != 0.1 and not self.batch_stats else []
        args += [] if self.affine else ["affine=False"]
        args += ["track_running_stats=False"] if self.batch_stats else []
        return f"nn.BatchNorm{dims}d({', '.join(args)})"

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        if not mod:  # batch statistics, no parameters
            return f"F.batch_norm({args[0]}, None, None, training=True, eps={fmt(self.eps)})"
        if self.rank > 5:
            return (f"F.batch_norm({args[0]}, {mod}.running_mean, {mod}.running_var, {mod}.weight, {mod}.bias, "
                    f"{mod}.training or {mod}.running_mean is None, {mod}.momentum, {mod}.eps)")
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x = ins[0]
        if not self.batch_stats:
            c = b.shape(x)[1]
            gamma = w["weight"] if self.affine else b.const(np.ones(c))
            beta = w["bias"] if self.affine else b.const(np.zeros(c))
            b.op("BatchNormalization", [x, gamma, beta, w["running_mean"], w["running_var"]], outs,
                 epsilon=float(self.eps))
            return
        axes = [0] + list(range(2, self.rank))
        mean = b.op("ReduceMean", [x], axes=axes, keepdims=1)
        d = b.op("Sub", [x, mean])
        var = b.op("ReduceMean", [b.op("Mul", [d, d])], axes=axes, keepdims=1)
        std = b.op("Sqrt", [b.op("Add", [var, b.const(self.eps)])])
        if not self.affine:
            b.op("Div", [d, std], outs)
            return
        view = [b.shape(x)[1]] + [1] * (self.rank - 2)
        y = b.op("Mul", [b.op("Div", [d, std]), b.param(w["weight"], view)])
        b.op("Add", [y, b.param(w["bias"], view)], outs)


@dataclass(frozen=True, slots=True)
class Affine(Op):
    """y = x * weight + bias, both of shape x.shape[axis:axis+k] broadcast over the other axes
    (Caffe Scale and Bias layers; a channel affine when axis = 1)."""

    kind = "affine"
    axis: int = 1
    scale: bool = True
    bias: bool = True

    def roles(self) -> tuple[str, ...]:
        return (("weight",) if self.scale else ()) + (("bias",) if self.bias else ())

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        shapes = {tuple(s) for s in w.values()}
        return f"scale and bias of different shapes {[list(s) for s in w.values()]}" if len(shapes) > 1 else None

    def view(self, rank: int, shape: Shape) -> tuple[int, ...]:
        return (1,) * self.axis + tuple(shape) + (1,) * (rank - self.axis - len(shape))

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        s, ws = shapes[0], next(iter(w.values()))
        if tuple(s[self.axis:self.axis + len(ws)]) != tuple(ws):
            raise ShapeError(f"parameters of shape {list(ws)} do not match input {list(s)} "
                             f"from axis {self.axis}")
        return [s]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        for r in self.roles():
            p = w[r].astype(np.float64).reshape(self.view(x.ndim, w[r].shape))
            x = x * p if r == "weight" else x + p
        return [x]


    def torch_module(self, w: dict[str, Shape]) -> str:
        shape = tuple(next(iter(w.values())))
        return f"Affine({shape}, axis={self.axis}, scale={self.scale}, bias={self.bias})"

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x, rank = ins[0], len(b.shape(ins[0]))
        roles = self.roles()
        for i, r in enumerate(roles):
            p = b.param(w[r], self.view(rank, b.param_shape(w[r])))  # stored broadcastable
            x = b.op("Mul" if r == "weight" else "Add", [x, p],
                     outs if i == len(roles) - 1 else None)


helper("Affine", '''
class Affine(nn.Module):
    """x * weight + bias, parameters broadcast over the axes outside [axis, axis + ndim)."""

    def __init__(self, shape, axis=1, scale=True, bias=True):
        super().__init__()
        self.axis = axis
        self.weight = nn.Parameter(torch.ones(shape)) if scale else None
        self.bias = nn.Parameter(torch.zeros(shape)) if bias else None

    def forward(self, x):
        p = self.weight if self.weight is not None else self.bias
        view = (1,) * self.axis + p.shape + (1,) * (x.dim() - self.axis - p.dim())
        if self.weight is not None:
            x = x * self.weight.view(view)
        if self.bias is not None:
            x = x + self.bias.view(view)
        return x
''')


@dataclass(frozen=True, slots=True)
class MVN(Op):
    """y = (x - mean) / (std + eps) (or just x - mean), statistics over H, W (and C when
    ``across_channels``), std from E[x^2] - E[x]^2 (Caffe's MVN layer)."""

    kind = "mvn"
    normalize_variance: bool = True
    across_channels: bool = False
    eps: float = 1e-9

    def axes(self, rank: int) -> tuple[int, ...]:
        return tuple(range(1 if self.across_channels else 2, rank))

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        ax = self.axes(x.ndim)
        d = x - x.mean(axis=ax, keepdims=True)
        if not self.normalize_variance:
            return [d]
        var = (x * x).mean(axis=ax, keepdims=True) - x.mean(axis=ax, keepdims=True) ** 2
        return [d / (np.sqrt(np.maximum(var, 0)) + self.eps)]

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        ax = self.axes(len(shapes[0]))
        d = f"({args[0]} - {args[0]}.mean({ax}, keepdim=True))"
        if not self.normalize_variance:
            return d
        return f"{d} / ({args[0]}.var({ax}, unbiased=False, keepdim=True).sqrt() + {fmt(self.eps)})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        ax = list(self.axes(len(b.shape(ins[0]))))
        d = b.op("Sub", [ins[0], b.op("ReduceMean", [ins[0]], axes=ax, keepdims=1)])
        if not self.normalize_variance:
            b.op("Identity", [d], outs)
            return
        var = b.op("ReduceMean", [b.op("Mul", [d, d])], axes=ax, keepdims=1)
        b.op("Div", [d, b.op("Add", [b.op("Sqrt", [var]), b.const(self.eps)])], outs)


@dataclass(frozen=True, slots=True)
class LpNormalize(Op):
    """y = x / (sum_{axes} |x|^p + eps) ** (1/p), times a per-channel (or shared) ``weight`` when
    ``scaled`` (SSD's Normalize layer; Torch7's nn.Normalize). p = inf: y = x / (max_{axes} |x| + eps)
    (Torch7's Normalize(math.huge) adds eps to the max norm)."""

    kind = "lpnorm"
    axes: tuple[int, ...] = (1,)
    p: float = 2.0
    eps: float = 1e-10
    scaled: bool = False

    def roles(self) -> tuple[str, ...]:
        return ("weight",) if self.scaled else ()

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if self.scaled:
            n = int(np.prod(w["weight"]))
            if n != 1 and shapes[0][1] != n:
                raise ShapeError(f"{n} scales for input {list(shapes[0])}")
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x = xs[0]
        if self.p == math.inf:
            norm = np.abs(x).max(axis=self.axes, keepdims=True) + self.eps
        else:
            norm = ((np.abs(x) ** self.p).sum(axis=self.axes, keepdims=True) + self.eps) ** (1 / self.p)
        y = x / norm
        if self.scaled:
            s = w["weight"].astype(np.float64).reshape(-1)
            y = y * (s.reshape((1, -1) + (1,) * (x.ndim - 2)) if s.size > 1 else s[0])
        return [y]


    def torch_module(self, w: dict[str, Shape]) -> str:
        return f"Scale({int(np.prod(w['weight']))})"

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        x, p = args[0], fmt(self.p)
        powered = f"{x}.pow(2)" if self.p == 2 else f"{x}.abs().pow({p})"
        y = f"{x} / ({powered}.sum({self.axes}, keepdim=True) + {fmt(self.eps)}).pow(1 / {p})"
        if self.p == math.inf:
            y = f"{x} / ({x}.abs().amax({self.axes}, keepdim=True) + {fmt(self.eps)})"
        return f"{mod}({y})" if self.scaled else y

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x = ins[0]
        if self.p == math.inf:
            top = b.op("ReduceMax", [b.op("Abs", [x])], axes=list(self.axes), keepdims=1)
            norm = b.op("Add", [top, b.const(self.eps)])
        else:
            powered = b.op("Pow", [b.op("Abs", [x]), b.const(self.p)])
            s = b.op("ReduceSum", [powered, b.const(list(self.axes), "int64")], keepdims=1)
            norm = b.op("Pow", [b.op("Add", [s, b.const(self.eps)]), b.const(1 / self.p)])
        if not self.scaled:
            b.op("Div", [x, norm], outs)
            return
        rank = len(b.shape(x))
        n = int(np.prod(b.param_shape(w["weight"])))
        scale = b.param(w["weight"], [n] + [1] * (rank - 2) if n > 1 else [1])
        b.op("Mul", [b.op("Div", [x, norm]), scale], outs)


helper("Scale", '''
class Scale(nn.Module):
    """Multiplies channel c (axis 1) by weight[c], or everything by one shared weight."""

    def __init__(self, channels):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        w = self.weight
        return x * (w.view((1, -1) + (1,) * (x.dim() - 2)) if w.numel() > 1 else w)
''')
