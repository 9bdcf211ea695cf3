"""Per op: the float64 NumPy kernel vs the generated PyTorch code vs ONNX Runtime.

Every registered op must have examples here (a new op without one fails ``test_every_op_has_examples``).
Shapes use N != C != H != W and odd sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from convert.artifacts import write
from convert.ir import Graph, Op
from convert.ops.act import Clip, Dropout, Elu, Exp, Log, Power, PRelu, Relu, Simple, Step, Threshold
from convert.ops.conv import Conv, Deconv
from convert.ops.detect import DetectionOutput, PriorBox
from convert.ops.eltwise import Broadcast, Eltwise
from convert.ops.fork import Axpy, ShuffleChannel
from convert.ops.lcn import LocalNorm
from convert.ops.linear import Linear
from convert.ops.norm import LRN, MVN, Affine, BatchNorm, LpNormalize
from convert.ops.pool import Pool, pooled_size
from convert.ops.reduce import Reduction, Tile
from convert.ops.roi import Proposal, PSROIPool, ROIPool
from convert.ops.shape import Concat, Crop, Pad, Reshape, Resize, Split, Transpose
from convert.ops.softmax import ArgMax, Reduce, Softmax
from convert.ops.unpool import MaxUnpool

X = (2, 3, 7, 9)  # N, C, H, W all different, odd spatial sizes
R = np.random.default_rng(1)


def w(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def pool(mode: str, k: int, s: int, p: int, ceil: bool, count_pad: bool = True) -> Pool:
    return Pool(mode, (k, k), (s, s), (p, p), ceil, bool(p), count_pad)


# (op, input shapes, weights)
EXAMPLES: list[tuple[Op, list[tuple[int, ...]], dict[str, np.ndarray]]] = [
    (Conv((3, 3), (1, 1), (1, 1)), [X], {"weight": w(5, 3, 3, 3), "bias": w(5)}),
    (Conv((3, 2), (2, 1), (0, 1), (2, 1), group=3, bias=False), [X], {"weight": w(6, 1, 3, 2)}),
    (Deconv((3, 3), (2, 2), (1, 1)), [X], {"weight": w(3, 4, 3, 3), "bias": w(4)}),
    (Deconv((4, 3), (2, 1), (1, 0), (1, 2), group=3, bias=False, output_pad=(1, 0)), [X],
     {"weight": w(3, 2, 4, 3)}),
    (pool("max", 3, 2, 0, True), [X], {}),
    (pool("max", 3, 2, 1, True), [X], {}),
    (pool("max", 2, 2, 0, False), [X], {}),
    (pool("avg", 3, 2, 1, True), [X], {}),
    (pool("avg", 3, 2, 1, True, count_pad=False), [X], {}),
    (pool("avg", 2, 3, 1, True), [X], {}),  # a window overhangs the end padding
    (pool("sum", 3, 2, 1, True), [X], {}),
    (Pool("avg", (7, 9), (1, 1), (0, 0), whole=True), [X], {}),  # global
    (Pool("max", (4, 2), (3, 2), (2, 0), True, True), [X], {}),  # pad > kernel/2 on one axis
    (Pool("max", (4, 2), (3, 2), (2, 0)), [X], {}),  # the same, rounding down
    (Linear(), [(2, 11)], {"weight": w(5, 11), "bias": w(5)}),
    (Linear(bias=False), [(2, 3, 11)], {"weight": w(5, 11)}),
    (Relu(), [X], {}), (Relu(0.1), [X], {}),
    (PRelu(), [X], {"weight": w(3)}), (PRelu(), [X], {"weight": w(1)}),
    (Elu(0.7), [X], {}),
    *[(Simple(n), [X], {}) for n in ("sigmoid", "tanh", "abs", "softplus")],
    (Power(2.0, 0.5, 1.0), [X], {}), (Power(1.0, 3.0, -1.0), [X], {}), (Power(0.5, 1.0, 6.0), [X], {}),
    (Exp(), [X], {}), (Exp(2.0, 0.5, 0.1), [X], {}),
    (Log(-1.0, 1.0, 6.0), [X], {}), (Log(10.0, 2.0, 8.0), [X], {}),
    (Step(0.2), [X], {}), (Threshold(0.1, -2.0), [X], {}), (Clip(-0.5, 0.7), [X], {}),
    (Dropout(0.5), [X], {}), (Dropout(0.3, 0.7), [X], {}),
    (LRN(5, 1e-2, 0.75, 2.0), [X], {}), (LRN(3, 0.1, 0.6, 1.0, "within"), [X], {}),
    (LRN(4, 0.1, 0.75, 1.0, "across", before=2), [X], {}),
    (LRN(4, 0.1, 0.75, 1.0, "across", before=1), [X], {}),
    (BatchNorm(1e-5), [X], {"running_mean": w(3), "running_var": np.abs(w(3)) + 0.5}),
    (BatchNorm(1e-3, affine=True), [X], {"running_mean": w(3), "running_var": np.abs(w(3)) + 0.5,
                                         "weight": w(3), "bias": w(3)}),
    (BatchNorm(1e-5, rank=2, affine=True), [(4, 5)], {"running_mean": w(5), "running_var": np.abs(w(5)) + 0.5,
                                                      "weight": w(5), "bias": w(5)}),
    (BatchNorm(1e-3, batch_stats=True), [X], {}),
    (BatchNorm(1e-3, batch_stats=True, affine=True), [X], {"weight": w(3), "bias": w(3)}),
    (Affine(1), [X], {"weight": w(3), "bias": w(3)}),
    (Affine(1, scale=False), [X], {"bias": w(3, 7)}),
    (Affine(2, bias=False), [X], {"weight": w(7, 9)}),
    (MVN(), [X], {}), (MVN(False, True), [X], {}), (MVN(True, True, 1e-3), [X], {}),
    (LpNormalize((1,), 2.0, 1e-10, True), [X], {"weight": w(3)}),
    (LpNormalize((1, 2, 3), 2.0, 1e-10, True), [X], {"weight": w(1)}),
    (LpNormalize((1,), 3.0, 1e-6), [(2, 11)], {}),
    (LpNormalize((1,), math.inf, 1e-6), [(2, 11)], {}),  # Torch7's Normalize(math.huge)
    (Eltwise("sum"), [X, X], {}), (Eltwise("sum", (0.5, -2.0, 1.0)), [X, X, X], {}),
    (Eltwise("prod"), [X, X, X], {}), (Eltwise("max"), [X, X], {}),
    (Broadcast("mul", 1), [X, (3, 7)], {}), (Broadcast("add", 2), [X, (7,)], {}),
    (Concat(1), [X, (2, 5, 7, 9)], {}), (Concat(3), [X, (2, 3, 7, 2)], {}),
    (Split(1, (1, 2)), [X], {}), (Split(2, (3, 4)), [X], {}),
    (Reshape((2, 189)), [X], {}), (Reshape((2, 3, 63)), [X], {}), (Reshape((6, 63)), [X], {}),
    (Crop((0, 1, 2, 3), (2, 2, 4, 5)), [X], {}),
    (Transpose((0, 2, 3, 1)), [X], {}),
    (Pad(((0, 0), (0, 0), (1, 2), (3, 0)), "constant", 0.5), [X], {}),
    (Pad(((0, 0), (0, 0), (2, 1), (1, 2)), "reflect"), [X], {}),
    (Pad(((0, 0), (0, 0), (1, 1), (2, 2)), "edge"), [X], {}),
    (Pad(((0, 0), (0, 0), (-1, 2), (1, -2)), "constant"), [X], {}),
    (Pad(((0, 0), (1, 2), (0, 0), (0, 0)), "constant"), [X], {}),
    (Resize((14, 27), "nearest"), [X], {}), (Resize((11, 20), "bilinear"), [X], {}),
    (Softmax(1), [X], {}), (Softmax(3, log=True), [X], {}),
    (ArgMax(1, -1), [X], {}), (ArgMax(3, -1, True), [X], {}), (ArgMax(2, 1), [X], {}),
    (ArgMax(1, 1, True), [X], {}),
    (Reduce("sum", (2, 3)), [X], {}), (Reduce("mean", (1,), True), [X], {}),
    (Tile(1, 2), [X], {}), (Tile(3, 3), [X], {}), (Tile(0, 2), [(3, 5)], {}), (Tile(2, 1), [X], {}),
    (Reduction("sum", 0), [X], {}), (Reduction("asum", 1, -0.5), [X], {}),
    (Reduction("sumsq", 3), [X], {}), (Reduction("mean", 2, 3.0), [X], {}), (Reduction("sum", 1, 2.5), [(3, 5)], {}),
    (MaxUnpool((2, 2), (2, 2)), [(2, 3, 3, 4), X], {}),
    (MaxUnpool((3, 2), (3, 2), (1, 1), ceil=True), [(2, 3, 3, 5), X], {}),
    (LocalNorm("sub"), [X], {"kernel": np.abs(w(3, 5))}),
    (LocalNorm("div", 0.5, 0.25), [X], {"kernel": np.abs(w(5, 3))}),
    (LocalNorm("nnx", adaptive=True), [X], {"kernel": np.abs(w(3, 3))}),
    (PriorBox(((4.0, 4.0), (6.0, 3.0)), (0.1, 0.1, 0.2, 0.3), clip=True), [(2, 5, 3, 7), (2, 3, 31, 47)], {}),
    (PriorBox(((5.0, 5.0),), img=(20, 30), step=(3.0, 2.5), offset=0.2), [(2, 5, 3, 7), X], {}),
    (DetectionOutput(3, nms_threshold=0.4, top_k=9, threshold=0.1, keep_top_k=7), [(2, 80), (2, 60), (1, 2, 80)], {}),
    (DetectionOutput(4, False, 1, 0.5, eta=0.8, code="center_size"), [(2, 320), (2, 80), (1, 2, 80)], {}),
    (DetectionOutput(3, code="corner_size", encoded=True, background=-1), [(1, 80), (1, 60), (1, 2, 80)], {}),
    (ROIPool((2, 3), 0.5), [X, (6, 5)], {}), (PSROIPool(2, 2, 0.5), [(2, 8, 7, 9), (6, 5)], {}),
    (Proposal(((-4.0, -4.0, 11.0, 11.0), (-8.0, -2.0, 23.0, 13.0)), 4.0, 16.0, 20, 6, 0.7),
     [(1, 4, 5, 6), (1, 8, 5, 6), (1, 3)], {}),
    (ShuffleChannel(3), [X], {}), (Axpy(), [(2, 3, 1, 1), X, X], {}),
]


def single_op_graph(op: Op, shapes: list[tuple[int, ...]], weights: dict[str, np.ndarray]) -> Graph:
    g = Graph(meta={"name": op.kind, "framework": "test", "source": "tests"})
    ins = [g.add_input(f"in{i}", s) for i, s in enumerate(shapes)]
    n_out = len(op.sizes) if isinstance(op, Split) else 1
    node = g.add(op, ins, [f"out{i}" for i in range(n_out)], f"{op.kind}_layer", weights)
    g.outputs = list(node.outputs)
    return g


def test_every_op_has_examples() -> None:
    assert {type(op).kind for op, _, _ in EXAMPLES} >= set(Op.registry)


@pytest.mark.parametrize("op,shapes,weights", EXAMPLES, ids=[f"{o.kind}-{i}" for i, (o, _, _) in enumerate(EXAMPLES)])
def test_op_backends_agree(op: Op, shapes, weights, tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = single_op_graph(op, shapes, weights)
    res = write(g, tmp_path / "m", title=op.kind)
    backends = res.report["verification"]["backends"]
    for name in ("pytorch", "onnxruntime"):
        assert backends[name]["ok"], (name, backends[name])
        assert backends[name]["max_rel"] <= 1e-5 or name == "onnxruntime", backends[name]


def test_pool_output_size_rules() -> None:
    # Caffe: ceil((7 + 2 - 3) / 2) + 1 = 4 windows; the 4th starts at 6 < 7 + 1, kept.
    assert pooled_size(7, 3, 2, 1, ceil=True, drop=True) == 4
    # ceil((6 + 2 - 2) / 3) + 1 = 3, but the last window starts at 6 >= 6 + 1 - 1 ... dropped
    assert pooled_size(6, 2, 3, 1, ceil=True, drop=True) == 3
    assert pooled_size(5, 2, 3, 1, ceil=True, drop=True) == 2
    assert pooled_size(5, 2, 3, 1, ceil=True, drop=False) == 3
    assert pooled_size(13, 3, 2, 0, ceil=False, drop=False) == 6


def test_caffe_average_pool_divisor() -> None:
    """AVE divides by the window clipped to the padded bounds: padding counts, overhang does not."""
    op = pool("avg", 3, 2, 1, True)  # 4x4 input, windows start at -1, 1, 3
    x = np.ones((1, 1, 4, 4))
    y = op.reference([x], {})[0][0, 0]
    # first window: 3x3 inside padded bounds, 2x2 real ones -> 4/9; last window starts at 3:
    # rows 3..5 clipped to the padded end 5 -> 2 rows, 1 real -> (1*2)/(2*3) along a corner
    assert math.isclose(y[0, 0], 4 / 9)
    assert math.isclose(y[2, 2], 1 / 4)
    assert math.isclose(y[1, 1], 1.0)
