"""Torch7's kernel-based local contrast normalization (nn.SpatialSubtractiveNormalization,
nn.SpatialDivisiveNormalization, and nnx's older nn.SpatialNormalization).

All of them estimate local statistics with one weighted sum over every plane and a zero-padded
window, and correct the borders by dividing by the same sum over an image of ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape
from .codegen import fmt, helper


@dataclass(frozen=True, slots=True)
class LocalNorm(Op):
    """With K the (kh, kw) kernel (odd sizes) and z zero outside the image,
    S(z)[n, h, w] = sum_{c, i, j} K[i, j] z[n, c, h + i - kh // 2, w + j - kw // 2],  coef = S(1):

    - "sub" (Subtractive): y = x - S(x) / coef
    - "div" (Divisive): s = sqrt(S(x^2)) / coef  (the root before the division, as nn does);
      y = x / (s if s > threshold else value)
    - "nnx" (SpatialNormalization): d = x - S(x) / coef; s = sqrt(S(d^2)) / coef;
      t = threshold, or max(mean of s over the sample, 1e-3) when ``adaptive``;
      y = d / (s if s > t else t)
    """

    kind = "local_norm"
    stats = ("kernel",)  # a fixed buffer: Torch7 lists no parameters for these modules
    mode: str
    threshold: float = 0.0
    value: float = 0.0
    adaptive: bool = False

    def roles(self) -> tuple[str, ...]:
        return ("kernel",)

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        k = w["kernel"]
        if len(k) != 2 or k[0] % 2 == 0 or k[1] % 2 == 0:
            return f"kernel of shape {list(k)}: needs two odd sizes"
        return None

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4:
            raise ShapeError(f"local normalization needs a 4-D input, got {list(shapes[0])}")
        return [shapes[0]]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, k = xs[0], w["kernel"].astype(np.float64)
        kh, kw = k.shape
        h, wd = x.shape[2:]

        def local(z: np.ndarray) -> np.ndarray:
            zp = np.pad(z.sum(axis=1, keepdims=True), ((0, 0), (0, 0), (kh // 2,) * 2, (kw // 2,) * 2))
            return sum(k[i, j] * zp[:, :, i:i + h, j:j + wd] for i in range(kh) for j in range(kw))

        coef = local(np.ones((1, *x.shape[1:])))
        if self.mode != "div":
            x = x - local(x) / coef
            if self.mode == "sub":
                return [x]
        s = np.sqrt(local(x * x)) / coef
        if self.adaptive:
            t = np.maximum(s.mean(axis=(1, 2, 3), keepdims=True), 1e-3)
            return [x / np.where(s > t, s, t)]
        return [x / np.where(s > self.threshold, s, self.value)]

    def torch_module(self, w: dict[str, Shape]) -> str:
        kh, kw = w["kernel"]
        return (f"LocalNorm(({kh}, {kw}), {self.mode!r}, {fmt(self.threshold)}, {fmt(self.value)}, "
                f"adaptive={self.adaptive})")

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        kh, kw = b.graph.weights[w["kernel"]].shape
        k = b.param(w["kernel"], [1, 1, kh, kw])  # stored as a conv weight: no Reshape node

        def local(z: str) -> str:
            plane = b.op("ReduceSum", [z, b.const([1], "int64")], keepdims=1)
            return b.op("Conv", [plane, k], pads=[kh // 2, kw // 2] * 2)

        x = ins[0]
        coef = local(b.op("Expand", [b.const([1.0]), b.op("Shape", [x])]))
        if self.mode != "div":
            x = b.op("Sub", [x, b.op("Div", [local(x), coef])], outs if self.mode == "sub" else None)
            if self.mode == "sub":
                return
        s = b.op("Div", [b.op("Sqrt", [local(b.op("Mul", [x, x]))]), coef])
        if self.adaptive:
            mean = b.op("ReduceMean", [s], axes=[1, 2, 3], keepdims=1)
            t = b.op("Max", [mean, b.const(1e-3)])
            b.op("Div", [x, b.op("Where", [b.op("Greater", [s, t]), s, t])], outs)
            return
        safe = b.op("Where", [b.op("Greater", [s, b.const(self.threshold)]), s, b.const(self.value)])
        b.op("Div", [x, safe], outs)


helper("LocalNorm", '''
class LocalNorm(nn.Module):
    """Torch7's local contrast normalization (Spatial{Subtractive,Divisive}Normalization, nnx's
    SpatialNormalization): statistics are kernel-weighted sums over all planes in a zero-padded
    window, divided by the same sums over an image of ones (which corrects the borders)."""

    def __init__(self, size, mode, threshold=0.0, value=0.0, adaptive=False):
        super().__init__()
        self.register_buffer("kernel", torch.zeros(size))
        self.mode, self.threshold, self.value, self.adaptive = mode, threshold, value, adaptive

    def local(self, z):
        k = self.kernel.to(z.dtype)[None, None]
        return F.conv2d(z.sum(1, keepdim=True), k, padding=(k.shape[2] // 2, k.shape[3] // 2))

    def forward(self, x):
        coef = self.local(torch.ones_like(x[:1]))
        if self.mode != "div":
            x = x - self.local(x) / coef
            if self.mode == "sub":
                return x
        s = torch.sqrt(self.local(x * x)) / coef
        if self.adaptive:
            t = s.mean((1, 2, 3), keepdim=True).clamp(min=1e-3)
            return x / torch.where(s > t, s, t)
        return x / torch.where(s > self.threshold, s, torch.full_like(s, self.value))
''')
