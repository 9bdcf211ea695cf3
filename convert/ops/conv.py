"""2-D convolution and transposed convolution."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir import Op, Shape


def _windows(xp: np.ndarray, i: int, j: int, dil: tuple[int, int], stride: tuple[int, int],
             out: tuple[int, int]) -> np.ndarray:
    """The input values kernel tap (i, j) sees at every output position: (N, C, oh, ow)."""
    hi, wj = i * dil[0], j * dil[1]
    return xp[:, :, hi:hi + stride[0] * (out[0] - 1) + 1:stride[0],
              wj:wj + stride[1] * (out[1] - 1) + 1:stride[1]]


def _sq(v: tuple[int, int]) -> int | tuple[int, int]:
    return v[0] if v[0] == v[1] else v


def _args(op: Conv | Deconv, kernel: tuple[int, int]) -> str:
    """Constructor arguments of nn.Conv2d / nn.ConvTranspose2d, defaults left out."""
    args = [str(_sq(kernel))]
    for name, v, default in (("stride", op.stride, (1, 1)), ("padding", op.pad, (0, 0)),
                             ("dilation", op.dilation, (1, 1))):
        if v != default:
            args.append(f"{name}={_sq(v)}")
    if op.group != 1:
        args.append(f"groups={op.group}")
    if not op.bias:
        args.append("bias=False")
    return ", ".join(args)


def _weight_problem(op: Conv | Deconv, w: dict[str, Shape]) -> str | None:
    """Weight shapes a (de)convolution cannot take: rank, kernel, groups, bias length."""
    ws = w["weight"]
    if len(ws) != 4 or tuple(ws[2:]) != tuple(op.kernel):
        return f"weight of shape {list(ws)} for a {op.kernel[0]}x{op.kernel[1]} kernel"
    out = ws[0] if op.kind == "conv" else ws[1] * op.group
    if op.kind == "conv" and ws[0] % op.group:
        return f"{ws[0]} filters do not split into {op.group} groups"
    if "bias" in w and tuple(w["bias"]) != (out,):
        return f"bias of shape {list(w['bias'])} for {out} outputs"
    return None


@dataclass(frozen=True, slots=True)
class Conv(Op):
    """y[n,o] = b[o] + sum_{c in group(o), i, j} w[o,c,i,j] * xpad[n,c, s*y + d*i, s*x + d*j]

    Weight (O, C/group, kh, kw); pad is (top, left) = (bottom, right); zero padding.
    """

    kind = "conv"
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    group: int = 1
    bias: bool = True

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        return _weight_problem(self, w)

    def roles(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    def macs(self, shapes: list[Shape], outs: list[Shape], w: dict[str, Shape]) -> int:
        return int(np.prod(outs[0])) * int(np.prod(w["weight"][1:]))

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        ek = [d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel)]
        return tuple((n + 2 * p - e) // s + 1 for n, p, e, s in zip((h, w), self.pad, ek, self.stride))  # type: ignore[return-value]

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        (n, c, h, wd), ws = shapes[0], w["weight"]
        if len(shapes[0]) != 4:
            raise ShapeError(f"convolution needs a 4-D input, got {list(shapes[0])}")
        if c != ws[1] * self.group:
            raise ShapeError(f"input has {c} channels, weights expect {ws[1] * self.group}")
        oh, ow = self.out_hw(h, wd)
        if oh <= 0 or ow <= 0:
            raise ShapeError(f"kernel {list(self.kernel)} does not fit input {h}x{wd}")
        return [(n, ws[0], oh, ow)]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, wt = xs[0], w["weight"].astype(np.float64)
        n, c, h, wd = x.shape
        o, cg, kh, kw = wt.shape
        g = self.group
        oh, ow = self.out_hw(h, wd)
        ph, pw = self.pad
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        wg = wt.reshape(g, o // g, cg, kh, kw)
        acc = np.zeros((n, g, o // g, oh * ow))
        for i in range(kh):
            for j in range(kw):
                win = _windows(xp, i, j, self.dilation, self.stride, (oh, ow))
                acc += np.matmul(wg[:, :, :, i, j], win.reshape(n, g, cg, oh * ow))
        y = acc.reshape(n, o, oh, ow)
        if self.bias:
            y += w["bias"].astype(np.float64).reshape(1, o, 1, 1)
        return [y]

    def torch_module(self, w: dict[str, Shape]) -> str:
        o, cg, kh, kw = w["weight"]
        return f"nn.Conv2d({cg * self.group}, {o}, {_args(self, (kh, kw))})"

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        ph, pw = self.pad
        b.op("Conv", [ins[0], w["weight"]] + ([w["bias"]] if self.bias else []), outs,
             kernel_shape=list(self.kernel), strides=list(self.stride), pads=[ph, pw, ph, pw],
             dilations=list(self.dilation), group=self.group)


@dataclass(frozen=True, slots=True)
class Deconv(Op):
    """Transposed convolution: each input pixel scatters w[c, o] onto an s-strided output grid.

    Weight (C, O/group, kh, kw). Output size (n-1)*s - 2p + d*(k-1) + 1 + output_pad.
    """

    kind = "deconv"
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    group: int = 1
    bias: bool = True
    output_pad: tuple[int, int] = (0, 0)

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        return _weight_problem(self, w)

    def roles(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    def macs(self, shapes: list[Shape], outs: list[Shape], w: dict[str, Shape]) -> int:
        return int(np.prod(shapes[0])) * int(np.prod(w["weight"][1:]))

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        return tuple((n - 1) * s - 2 * p + d * (k - 1) + 1 + a for n, s, p, d, k, a in zip(  # type: ignore[return-value]
            (h, w), self.stride, self.pad, self.dilation, self.kernel, self.output_pad))

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        if len(shapes[0]) != 4:
            raise ShapeError(f"deconvolution needs a 4-D input, got {list(shapes[0])}")
        (n, c, h, wd), ws = shapes[0], w["weight"]
        if c != ws[0]:
            raise ShapeError(f"input has {c} channels, weights expect {ws[0]}")
        return [(n, ws[1] * self.group, *self.out_hw(h, wd))]

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        x, wt = xs[0], w["weight"].astype(np.float64)
        n, c, h, wd = x.shape
        _, og, kh, kw = wt.shape
        g, (sh, sw), (dh, dw) = self.group, self.stride, self.dilation
        full = ((h - 1) * sh + dh * (kh - 1) + 1 + self.output_pad[0],
                (wd - 1) * sw + dw * (kw - 1) + 1 + self.output_pad[1])
        y = np.zeros((n, g, og, *full))
        xg = x.reshape(n, g, c // g, h * wd)
        wg = wt.reshape(g, c // g, og, kh, kw)
        for i in range(kh):
            for j in range(kw):
                contrib = np.matmul(wg[:, :, :, i, j].transpose(0, 2, 1), xg)  # (n, g, og, h*w)
                y[:, :, :, i * dh:i * dh + sh * (h - 1) + 1:sh,
                  j * dw:j * dw + sw * (wd - 1) + 1:sw] += contrib.reshape(n, g, og, h, wd)
        ph, pw = self.pad
        oh, ow = self.out_hw(h, wd)
        y = y.reshape(n, g * og, *full)[:, :, ph:ph + oh, pw:pw + ow]
        if self.bias:
            y = y + w["bias"].astype(np.float64).reshape(1, -1, 1, 1)
        return [y]

    def torch_module(self, w: dict[str, Shape]) -> str:
        c, og, kh, kw = w["weight"]
        extra = f", output_padding={_sq(self.output_pad)}" if any(self.output_pad) else ""
        return f"nn.ConvTranspose2d({c}, {og * self.group}, {_args(self, (kh, kw))}{extra})"

    def torch(self, args: list[str], mod: str, shapes: list[Shape]) -> str:
        return f"{mod}({args[0]})"

    def onnx(self, b, ins, outs, w) -> None:  # type: ignore[no-untyped-def]
        ph, pw = self.pad
        b.op("ConvTranspose", [ins[0], w["weight"]] + ([w["bias"]] if self.bias else []), outs,
             kernel_shape=list(self.kernel), strides=list(self.stride), pads=[ph, pw, ph, pw],
             dilations=list(self.dilation), group=self.group,
             output_padding=list(self.output_pad) if any(self.output_pad) else None)
