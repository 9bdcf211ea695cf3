"""Elementwise activations: each a one-line formula, its NumPy kernel, torch and ONNX spellings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import fmt


class Unary(Op):
    """Shape-preserving elementwise op on one input."""

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        return [shapes[0]]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [self.f(xs[0])]

    def f(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Relu(Unary):
    """y = x if x > 0 else slope * x"""

    kind = "relu"
    slope: float = 0.0

    def f(self, x):  # type: ignore[no-untyped-def]
        return np.where(x > 0, x, x * self.slope)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"F.leaky_relu({args[0]}, {fmt(self.slope)})" if self.slope else f"F.relu({args[0]})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        if self.slope:
            b.op("LeakyRelu", ins, outs, alpha=float(self.slope))
        else:
            b.op("Relu", ins, outs)


@dataclass(frozen=True, slots=True)
class PRelu(Unary):
    """y = x if x > 0 else a[c] * x, channel axis 1 (a single shared a when weight has 1 value)."""

    kind = "prelu"

    def roles(self) -> tuple[str, ...]:
        return ("weight",)

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        n = int(np.prod(w["weight"]))
        if n != 1 and (len(shapes[0]) < 2 or shapes[0][1] != n):
            raise ShapeError(f"{n} slopes for input {list(shapes[0])}")
        return [shapes[0]]

    def reference(self, xs, w):  # type: ignore[no-untyped-def]
        x, a = xs[0], w["weight"].astype(np.float64).reshape(-1)
        a = a.reshape((1, -1) + (1,) * (x.ndim - 2)) if a.size > 1 else a[0]
        return [np.where(x > 0, x, a * x)]

    def torch_module(self, w: dict[str, Shape]) -> str:
        return f"nn.PReLU({int(np.prod(w['weight']))})"

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        rank = len(b.shape(ins[0]))
        n = int(np.prod(b.graph.weights[w["weight"]].shape))
        slope_shape = [n] + [1] * (rank - 2) if n > 1 else [1]
        slope = b.param(w["weight"], slope_shape)  # stored in that shape: no Reshape node
        b.op("PRelu", [ins[0], slope], outs)


@dataclass(frozen=True, slots=True)
class Elu(Unary):
    """y = x if x > 0 else alpha * (exp(x) - 1)"""

    kind = "elu"
    alpha: float = 1.0

    def f(self, x):  # type: ignore[no-untyped-def]
        return np.where(x > 0, x, self.alpha * np.expm1(np.minimum(x, 0)))

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"F.elu({args[0]}, {fmt(self.alpha)})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("Elu", ins, outs, alpha=float(self.alpha))


@dataclass(frozen=True, slots=True)
class Simple(Unary):
    """name in sigmoid (1/(1+exp(-x))), tanh, abs (|x|), softplus (log(1+exp(x)), Caffe's BNLL)."""

    kind = "simple"
    name: str

    NUMPY = {"sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "abs": np.abs,
             "softplus": lambda x: np.logaddexp(0, x)}
    TORCH = {"sigmoid": "torch.sigmoid", "tanh": "torch.tanh", "abs": "torch.abs",
             "softplus": "F.softplus"}
    ONNX = {"sigmoid": "Sigmoid", "tanh": "Tanh", "abs": "Abs", "softplus": "Softplus"}

    def f(self, x):  # type: ignore[no-untyped-def]
        return Simple.NUMPY[self.name](x)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"{Simple.TORCH[self.name]}({args[0]})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op(Simple.ONNX[self.name], ins, outs)


def _affine_torch(x: str, scale: float, shift: float) -> str:
    s = x if scale == 1 else f"{x} * {fmt(scale)}"
    return s if shift == 0 else f"({s} + {fmt(shift)})"


def _affine_onnx(b, x: str, scale: float, shift: float) -> str:  # type: ignore[no-untyped-def]
    if scale != 1:
        x = b.op("Mul", [x, b.const(float(scale))])
    if shift != 0:
        x = b.op("Add", [x, b.const(float(shift))])
    return x


@dataclass(frozen=True, slots=True)
class Power(Unary):
    """y = (shift + scale * x) ** power   (power 1: an affine map, Torch7's Mul/AddConstant)"""

    kind = "power"
    power: float = 1.0
    scale: float = 1.0
    shift: float = 0.0

    def f(self, x):  # type: ignore[no-untyped-def]
        return (self.shift + self.scale * x) ** self.power

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        base = _affine_torch(args[0], self.scale, self.shift)
        return base if self.power == 1 else f"({base}) ** {fmt(self.power)}"  # ** binds before *

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        x = _affine_onnx(b, ins[0], self.scale, self.shift)
        if self.power != 1:
            b.op("Pow", [x, b.const(float(self.power))], outs)
        else:
            b.op("Identity", [x], outs)


@dataclass(frozen=True, slots=True)
class Exp(Unary):
    """y = base ** (shift + scale * x); base -1 means e"""

    kind = "exp"
    base: float = -1.0
    scale: float = 1.0
    shift: float = 0.0

    def k(self) -> float:
        return 1.0 if self.base == -1 else math.log(self.base)

    def f(self, x):  # type: ignore[no-untyped-def]
        return np.exp(self.k() * (self.shift + self.scale * x))

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"torch.exp({_affine_torch(args[0], self.scale * self.k(), self.shift * self.k())})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("Exp", [_affine_onnx(b, ins[0], self.scale * self.k(), self.shift * self.k())], outs)


@dataclass(frozen=True, slots=True)
class Log(Unary):
    """y = log_base(shift + scale * x); base -1 means e"""

    kind = "log"
    base: float = -1.0
    scale: float = 1.0
    shift: float = 0.0

    def k(self) -> float:
        return 1.0 if self.base == -1 else 1.0 / math.log(self.base)

    def f(self, x):  # type: ignore[no-untyped-def]
        return self.k() * np.log(self.shift + self.scale * x)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        y = f"torch.log({_affine_torch(args[0], self.scale, self.shift)})"
        return y if self.k() == 1 else f"{y} * {fmt(self.k())}"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        y = b.op("Log", [_affine_onnx(b, ins[0], self.scale, self.shift)])
        b.op("Mul", [y, b.const(self.k())], outs)


@dataclass(frozen=True, slots=True)
class Step(Unary):
    """y = 1 if x > threshold else 0   (Caffe's Threshold layer)"""

    kind = "step"
    threshold: float = 0.0

    def f(self, x):  # type: ignore[no-untyped-def]
        return (x > self.threshold).astype(np.float64)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"({args[0]} > {fmt(self.threshold)}).to({args[0]}.dtype)"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        gt = b.op("Greater", [ins[0], b.const(self.threshold)])
        b.op("Cast", [gt], outs, to=1)


@dataclass(frozen=True, slots=True)
class Threshold(Unary):
    """y = x if x > threshold else value   (Torch7's nn.Threshold; not a ReLU unless both are 0)"""

    kind = "threshold"
    threshold: float = 0.0
    value: float = 0.0

    def f(self, x):  # type: ignore[no-untyped-def]
        return np.where(x > self.threshold, x, self.value)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"F.threshold({args[0]}, {fmt(self.threshold)}, {fmt(self.value)})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        gt = b.op("Greater", [ins[0], b.const(self.threshold)])
        b.op("Where", [gt, ins[0], b.const(self.value)], outs)


@dataclass(frozen=True, slots=True)
class Clip(Unary):
    """y = min(max(x, low), high)"""

    kind = "clip"
    low: float = -math.inf
    high: float = math.inf

    def f(self, x):  # type: ignore[no-untyped-def]
        return np.clip(x, self.low, self.high)

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        return f"torch.clamp({args[0]}, {fmt(self.low)}, {fmt(self.high)})"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        b.op("Clip", [ins[0], b.const(self.low), b.const(self.high)], outs)


@dataclass(frozen=True, slots=True)
class Dropout(Unary):
    """y = x * scale at inference (1 for inverted dropout; Torch7's old Dropout scales by 1-p).

    Training-mode runs (benchmarks) drop with probability p as the source framework did.
    """

    kind = "dropout"
    p: float = 0.5
    scale: float = 1.0

    def f(self, x):  # type: ignore[no-untyped-def]
        return x * self.scale

    def torch(self, args, mod, shapes):  # type: ignore[no-untyped-def]
        drop = f"F.dropout({args[0]}, {fmt(self.p)}, self.training)"
        return drop if self.scale == 1 else f"{drop} * {fmt(self.scale)}"

    def onnx(self, b, ins, outs, w):  # type: ignore[no-untyped-def]
        if self.scale == 1:
            b.op("Identity", ins, outs)
        else:
            b.op("Mul", [ins[0], b.const(self.scale)], outs)
