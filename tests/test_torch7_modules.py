"""Per Torch7 class: a small module tree built by hand (seeded weights), written as a binary .t7,
converted and verified (float64 reference, PyTorch, ONNX Runtime, and OpenCV's readNetFromTorch
where it loads the module). Parametrized over the class registry: a class without a case here
fails ``test_every_class_has_a_case``. Legacy layouts and Torch7's batch rules have cases too."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from convert import isolate, reference, verify
from convert.artifacts import write
from convert.errors import BadModel, Unsupported
from convert.torch7.builder import MODULES
from convert.torch7.frontend import build, load
from convert.torch7.modules import torch_view
from convert.torch7.t7file import TorchObject
from convert.torch7.t7file import load as load_t7
from convert.torch7.t7write import Strided, dump
from convert.verify import compare, seeded_inputs

R = np.random.default_rng(7)
X = (2, 3, 7, 9)  # N, C, H, W all different, odd spatial sizes


def w(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def M(cls: str, version: int = 1, **fields: object) -> TorchObject:
    return TorchObject(cls, dict(fields), version)


def box(cls: str, *children: TorchObject, **fields: object) -> TorchObject:
    """A container with its children in a 1-based Lua array."""
    return M(cls, modules={i + 1: c for i, c in enumerate(children)}, **fields)


def seq(*children: TorchObject) -> TorchObject:
    return box("nn.Sequential", *children)


def two(cls: str, **fields: object) -> TorchObject:
    """A table op fed by a ConcatTable of ReLU and Tanh."""
    return seq(box("nn.ConcatTable", M("nn.ReLU"), M("nn.Tanh")), M(cls, **fields))


def conv(cls: str = "nn.SpatialConvolution", n_in: int = 3, n_out: int = 4, kw: int = 3, kh: int = 3,
         bias: bool = True, **f: object) -> TorchObject:
    fields = dict(nInputPlane=n_in, nOutputPlane=n_out, kW=kw, kH=kh, dW=1, dH=1, padW=0, padH=0)
    fields |= f
    fields["weight"] = fields.get("weight", w(n_out, n_in // int(fields.get("groups", 1)), kh, kw))
    if bias:
        fields["bias"] = w(n_out)
    return M(cls, **fields)


def pool(cls: str, kw: int, kh: int, dw: int, dh: int, pw: int = 0, ph: int = 0, ceil: bool = False,
         **f: object) -> TorchObject:
    return M(cls, kW=kw, kH=kh, dW=dw, dH=dh, padW=pw, padH=ph, ceil_mode=ceil, **f)


def avg(*a: int, ceil: bool = False, **f: object) -> TorchObject:
    return pool("nn.SpatialAveragePooling", *a, ceil=ceil, **({"count_include_pad": True,
                                                                 "divide": True} | f))


def bn(cls: str, c: int, affine: bool = True, version: int = 2, **f: object) -> TorchObject:
    fields: dict = dict(eps=1e-3, momentum=0.1, train=False, running_mean=w(c),
                        running_var=np.abs(w(c)) + 0.5) | f
    if affine:
        fields |= dict(weight=w(c), bias=w(c))
    return M(cls, version, **{k: v for k, v in fields.items() if v is not None})


def lp_pool(p: float) -> TorchObject:
    """nn.SpatialLPPooling(3, p, 2, 2, 2, 2) as Torch7 serializes it: a Sequential subclass."""
    first = M("nn.Square") if p == 2 else M("nn.Power", pow=p)
    last = M("nn.Sqrt", eps=0) if p == 2 else M("nn.Power", pow=1 / p)
    return box("nn.SpatialLPPooling", first, avg(2, 2, 2, 2), M("nn.MulConstant", constant_scalar=4),
               last, kW=2, kH=2, dW=2, dH=2)


def long(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


WT = w(11, 5)
TRANSPOSED = Strided(WT.reshape(-1), (5, 11), (1, 5))  # a (5, 11) weight laid out column-major

# (tree, input shape); a class may have several cases
CASES: dict[str, list[tuple[TorchObject, tuple[int, ...]]]] = {
    "nn.Sequential": [(seq(M("nn.ReLU"), M("nn.Tanh")), X), (seq(), X)],  # empty: identity
    "nn.SpatialLPPooling": [(lp_pool(2), (2, 3, 8, 10)), (seq(M("nn.Abs"), lp_pool(3)), (2, 3, 8, 10))],
    "nn.Concat": [(box("nn.Concat", M("nn.ReLU"), M("nn.Tanh"), M("nn.Sigmoid"), dimension=2), X),
                  (box("nn.Concat", M("nn.ReLU"), conv(kw=1, kh=1), dimension=2), X)],
    "nn.DepthConcat": [(box("nn.DepthConcat", conv(kh=4, kw=2), conv(kh=1, kw=1), conv(),
                            dimension=2), X)],
    "nn.ConcatTable": [(box("nn.ConcatTable", M("nn.ReLU"), M("nn.Identity")), X)],
    "nn.ParallelTable": [(seq(box("nn.ConcatTable", M("nn.Identity"), M("nn.Identity")),
                              box("nn.ParallelTable", M("nn.ReLU"), M("nn.Sigmoid")),
                              M("nn.CAddTable")), X)],
    "nn.Parallel": [(box("nn.Parallel", M("nn.Tanh"), M("nn.Sigmoid"), M("nn.ReLU"),
                         inputDimension=2, outputDimension=2), X)],
    "nn.CAddTable": [(two("nn.CAddTable"), X)],
    "nn.CSubTable": [(two("nn.CSubTable"), X)],
    "nn.CMulTable": [(two("nn.CMulTable"), X)],
    "nn.CMaxTable": [(two("nn.CMaxTable"), X)],
    "nn.JoinTable": [(two("nn.JoinTable", dimension=2), X),
                     (two("nn.JoinTable", dimension=1, nInputDims=3), X),  # batch shift
                     (two("nn.JoinTable", dimension=-1), X)],
    "nn.SelectTable": [(two("nn.SelectTable", index=-1), X), (two("nn.SelectTable", index=1), X)],
    "nn.Identity": [(M("nn.Identity"), X)],
    "nn.Copy": [(seq(M("nn.Copy"), M("nn.ReLU")), X)],
    "nn.Contiguous": [(seq(M("nn.Contiguous"), M("nn.ReLU")), X)],
    "nn.SpatialConvolution": [
        (conv(kw=3, kh=2, dW=2, dH=1, padW=1, padH=0), X),  # width first: kW != kH
        (conv(bias=False, padW=1, padH=1), X),
        (M("nn.SpatialConvolution", nInputPlane=3, nOutputPlane=4, kW=3, kH=3, dW=1, dH=1,
           padding=1, weight=w(4, 3, 3, 3), bias=w(4)), X),  # old files: one `padding` field
    ],
    "nn.SpatialConvolutionMM": [(conv("nn.SpatialConvolutionMM", kw=3, kh=2, padW=1,
                                      weight=w(4, 3 * 2 * 3)), X)],  # 2-D (nOut, nIn*kH*kW)
    "cudnn.SpatialConvolution": [(conv("cudnn.SpatialConvolution", n_out=6, groups=3, padW=1,
                                       padH=1), X)],
    "nn.SpatialDilatedConvolution": [(conv("nn.SpatialDilatedConvolution", dilationW=2,
                                           dilationH=1, padW=2), X)],
    "cudnn.SpatialDilatedConvolution": [(conv("cudnn.SpatialDilatedConvolution", dilationW=1,
                                              dilationH=2, padH=1), X)],
    "nn.SpatialFullConvolution": [(conv("nn.SpatialFullConvolution", kw=3, kh=4, dW=2, dH=1, padW=1,
                                        adjW=1, adjH=0, weight=w(3, 5, 4, 3), n_out=5), X)],
    "cudnn.SpatialFullConvolution": [(conv("cudnn.SpatialFullConvolution", dW=2, dH=2, padW=1, padH=1,
                                           adjW=0, adjH=1, weight=w(3, 4, 3, 3), bias=False), X)],
    "nn.Linear": [(M("nn.Linear", weight=w(5, 11), bias=w(5)), (2, 11)),
                  (M("nn.Linear", weight=w(5, 11)), (3, 11)),
                  (seq(M("nn.View", size=long(-1)), M("nn.Linear", weight=w(5, 11), bias=w(5))),
                   (1, 11)),  # View(-1) makes a vector: Linear's 1-D form
                  (M("nn.Linear", weight=TRANSPOSED, bias=w(5)), (2, 11))],  # saved as w:t():t()
    "nn.SpatialMaxPooling": [
        (pool("nn.SpatialMaxPooling", 2, 3, 2, 2, 0, 1, ceil=True), X),
        (pool("nn.SpatialMaxPooling", 3, 3, 2, 2), X),
        (pool("nn.SpatialMaxPooling", 2, 2, 3, 3, 1, 1, ceil=True), X),  # last window dropped
        (pool("nn.SpatialMaxPooling", 3, 1, 2, 3, 1, 0, ceil=True), (2, 3, 5, 9)),  # padW || padH
        (M("nn.SpatialMaxPooling", kW=2, kH=2, dW=2, dH=2), X),  # before ceil_mode and padding
    ],
    "cudnn.SpatialMaxPooling": [(pool("cudnn.SpatialMaxPooling", 3, 3, 2, 2, 1, 1, ceil=True), X),
                                (pool("cudnn.SpatialMaxPooling", 2, 3, 2, 2), X)],
    "nn.SpatialAveragePooling": [
        (avg(3, 3, 2, 2, 1, 1, ceil=True), X),
        (avg(3, 2, 2, 2, 1, 0, count_include_pad=False), X),
        (avg(3, 3, 2, 2, 1, 1, divide=False), X),  # legacy sum pooling
        (M("nn.SpatialAveragePooling", kW=2, kH=3, dW=2, dH=2, padW=1, padH=1, divide=True), X),
        (pool("nn.SpatialAveragePooling", 3, 3, 2, 2, 1, 1, divide=True), X),  # no count_include_pad
    ],
    "cudnn.SpatialAveragePooling": [(pool("cudnn.SpatialAveragePooling", 3, 3, 2, 2, 1, 1,
                                          count_include_pad=True), X)],
    "nn.Sigmoid": [(M("nn.Sigmoid"), X)], "cudnn.Sigmoid": [(M("cudnn.Sigmoid"), X)],
    "nn.Tanh": [(M("nn.Tanh"), X)], "cudnn.Tanh": [(M("cudnn.Tanh"), X)],
    "nn.Abs": [(M("nn.Abs"), X)], "nn.Exp": [(M("nn.Exp"), X)],
    "nn.Log": [(seq(M("nn.Abs"), M("nn.Log")), X)], "nn.Square": [(M("nn.Square"), X)],
    "nn.Sqrt": [(seq(M("nn.Abs"), M("nn.Sqrt", eps=0)), X)],
    "nn.ReLU": [(M("nn.ReLU", threshold=0, val=0, inplace=False), X)],
    "cudnn.ReLU": [(M("cudnn.ReLU", inplace=False), X)],
    "nn.Threshold": [(M("nn.Threshold", threshold=0.1, val=-2.0), X)],  # y = x > 0.1 ? x : -2
    "nn.ReLU6": [(M("nn.ReLU6"), (2, 3, 5, 5))],
    "nn.HardTanh": [(M("nn.HardTanh", min_val=-0.5, max_val=0.7), X)],
    "nn.Clamp": [(M("nn.Clamp", min_val=-0.2, max_val=1.5), X)],
    "nn.LeakyReLU": [(M("nn.LeakyReLU", negval=0.1), X)],
    "nn.ELU": [(M("nn.ELU", alpha=0.5), X)],
    "nn.PReLU": [(M("nn.PReLU", nOutputPlane=3, weight=w(3)), X),
                 (M("nn.PReLU", nOutputPlane=0, weight=w(1)), X)],  # 0: one shared slope
    "nn.SoftPlus": [(M("nn.SoftPlus", beta=1, threshold=20), X), (M("nn.SoftPlus", beta=2), X)],
    "nn.Power": [(M("nn.Power", pow=3), X)],
    "nn.MulConstant": [(M("nn.MulConstant", constant_scalar=-2.5), X)],
    "nn.AddConstant": [(M("nn.AddConstant", constant_scalar=0.75), X)],
    "nn.Dropout": [(M("nn.Dropout", p=0.3, v2=True), X),
                   (M("nn.Dropout", p=0.3), X),  # old Dropout: no v2, scales by 0.7
                   (M("nn.Dropout", p=0.4, v2=False), X)],
    "nn.SpatialDropout": [(M("nn.SpatialDropout", p=0.2), X)],
    "nn.BatchNormalization": [
        (bn("nn.BatchNormalization", 11), (4, 11)),
        (bn("nn.BatchNormalization", 11, version=1, running_var=None,  # old files: running_std
            running_std=np.abs(w(11)) + 0.5), (4, 11)),
        (bn("nn.BatchNormalization", 11, train=True), (4, 11)),  # saved training: batch stats
    ],
    "nn.SpatialBatchNormalization": [(bn("nn.SpatialBatchNormalization", 3, affine=False), X),
                                     (bn("nn.SpatialBatchNormalization", 3, train=0), X)],
    "cudnn.BatchNormalization": [(bn("cudnn.BatchNormalization", 11), (4, 11))],
    "cudnn.SpatialBatchNormalization": [(bn("cudnn.SpatialBatchNormalization", 3), X)],
    "nn.SpatialCrossMapLRN": [(M("nn.SpatialCrossMapLRN", size=5, alpha=1e-2, beta=0.75, k=2), X)],
    "cudnn.SpatialCrossMapLRN": [(M("cudnn.SpatialCrossMapLRN", size=3, alpha=0.1, beta=0.6, k=1),
                                  X)],
    "nn.Normalize": [(M("nn.Normalize", p=2, eps=1e-10), (2, 11)),
                     (M("nn.Normalize", p=1.5, eps=1e-6), (2, 11)),
                     (M("nn.Normalize", p=math.inf, eps=1e-10), (2, 11))],
    "nn.SoftMax": [(M("nn.SoftMax"), (2, 11)), (M("nn.SoftMax"), X)],  # 4-D: channels per pixel
    "nn.LogSoftMax": [(M("nn.LogSoftMax"), (2, 11)), (M("nn.LogSoftMax"), X),
                      (seq(M("nn.MulConstant", constant_scalar=100), M("nn.LogSoftMax")), (2, 11))],
    "nn.SpatialSoftMax": [(M("nn.SpatialSoftMax"), X)],
    "cudnn.SpatialSoftMax": [(M("cudnn.SpatialSoftMax"), X)],
    "cudnn.SpatialLogSoftMax": [(M("cudnn.SpatialLogSoftMax"), X)],
    "cudnn.SoftMax": [(M("cudnn.SoftMax"), X), (M("cudnn.SoftMax"), (2, 11))],  # 4-D: per sample
    "cudnn.LogSoftMax": [(M("cudnn.LogSoftMax"), X)],
    "nn.View": [(M("nn.View", size=long(-1), numInputDims=3), X),
                (M("nn.View", size=long(63)), X),  # 378 values, no numInputDims: a batch of 6
                (M("nn.View", size=long(3, -1), numInputDims=3), X),
                (M("nn.View", size=long(189)), (1, 3, 7, 9))],  # one sample keeps N = 1
    "nn.Reshape": [(M("nn.Reshape", size=long(189), nelement=189), X),
                   (M("nn.Reshape", size=long(6, 63), nelement=378), X),  # all values: no batch
                   (M("nn.Reshape", size=long(3, 63), nelement=189, batchMode=True), X)],
    "nn.Mean": [(M("nn.Mean", dimension=2), X), (M("nn.Mean", dimension=1, nInputDims=3), X)],
    "nn.Sum": [(M("nn.Sum", dimension=4, sizeAverage=True, squeeze=False), X),
               (M("nn.Sum", dimension=-1), X), (M("nn.Sum", dimension=2, nInputDims=3), X)],
    "nn.Narrow": [(M("nn.Narrow", dimension=2, index=2, length=2), X),
                  (M("nn.Narrow", dimension=4, index=3, length=-2), X),  # to one before the end
                  (M("nn.Narrow", dimension=-1, index=1, length=3), X)],
    "nn.Transpose": [(M("nn.Transpose", permutations={1: {1: 2, 2: 3}, 2: {1: 3, 2: 4}}), X),
                     (M("nn.Transpose", permutations={1: {1: 1, 2: 2}}, numInputDims=3), X)],
    "nn.Padding": [(M("nn.Padding", dim=2, pad=2, nInputDim=3, value=0.5, index=1), X),
                   (M("nn.Padding", dim=2, pad=-1, nInputDim=4, value=0, index=1), X),
                   (M("nn.Padding", dim=3, pad=2, nInputDim=3, value=-1, index=3), X),  # inside
                   (M("nn.Padding", dim=2, pad=-3, value=2, index=2), X)],
    "nn.SpatialZeroPadding": [(M("nn.SpatialZeroPadding", pad_l=1, pad_r=2, pad_t=0, pad_b=3), X),
                              (M("nn.SpatialZeroPadding", pad_l=-1, pad_r=2, pad_t=1, pad_b=-2), X)],
    "nn.SpatialReflectionPadding": [(M("nn.SpatialReflectionPadding", pad_l=2, pad_r=1, pad_t=1,
                                       pad_b=2), X)],
    "nn.SpatialReplicationPadding": [(M("nn.SpatialReplicationPadding", pad_l=1, pad_r=1, pad_t=2,
                                        pad_b=2), X)],
    "nn.SpatialUpSamplingNearest": [(M("nn.SpatialUpSamplingNearest", scale_factor=2), X)],
}

CASE_LIST = [(c, i, tree, shape) for c, cases in CASES.items() for i, (tree, shape) in enumerate(cases)]
IDS = [f"{c}-{i}" for c, i, _, _ in CASE_LIST]


@pytest.fixture(autouse=True)
def _no_full_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    # verify() collects garbage after each backend, for big models; with torch loaded that costs
    # 0.1 s a call, most of a tiny case's time
    monkeypatch.setattr(verify.gc, "collect", lambda *a: 0)


def convert_tree(tree: TorchObject, shape: tuple[int, ...], tmp: Path) -> dict:
    """Write the tree as a .t7, convert it and verify (float64 reference, PyTorch, ONNX Runtime);
    OpenCV is checked for all cases at once in test_opencv_on_every_case."""
    src = tmp / "m.t7"
    dump(tree, src)
    loaded = load(src, {"input": shape}, 0, {})
    return write(loaded.graph, tmp / "out", loaded.extra, None, loaded.known_opencv).report


def test_every_class_has_a_case() -> None:
    from test_torch7_classic import CLASSIC  # the older classes have their cases there

    assert set(MODULES) <= set(CASES) | set(CLASSIC), sorted(set(MODULES) - set(CASES) - set(CLASSIC))


@pytest.mark.parametrize("cls,i,tree,shape", CASE_LIST, ids=IDS)
def test_module_converts_and_verifies(cls: str, i: int, tree: TorchObject, shape: tuple[int, ...],
                                      tmp_path: Path) -> None:
    report = convert_tree(tree, shape, tmp_path)
    v = report["verification"]["backends"]
    assert report["status"] == "verified", v
    assert v["pytorch"]["ok"] and v["onnxruntime"]["ok"]


def opencv_results(cases: list[tuple[str, TorchObject, tuple[int, ...]]], tmp: Path) -> dict[str, dict]:
    """OpenCV's readNetFromTorch on every case's .t7 in one child process, compared with the
    float64 reference: {case: {"status": agrees | refused | deviates (known) | MISMATCH, ...}}."""
    feeds, refs, jobs, known = {}, {}, [], {}
    for key, tree, shape in cases:
        src = tmp / f"{len(jobs)}.t7"
        dump(tree, src)
        b = build(load_t7(src), shape, str(src))  # from the file, as a user's .t7
        feeds[key] = seeded_inputs(b.g.inputs)["input"]
        refs[key] = reference.run(b.g, {"input": feeds[key]})
        known[key] = b.notes
        jobs.append([key, str(src), True])
    outs, _ = isolate.call("convert.torch7.opencv:forward_many", feeds, jobs=jobs)
    res = {}
    for key, _, _ in cases:
        if key + "!error" in outs or len(refs[key]) != 1:
            res[key] = {"status": "refused", "reason": str(outs.get(key + "!error", "several outputs"))}
            continue
        m = compare({"output": refs[key]["output"]}, {"output": outs[key]}, 1e-4)
        status = "agrees" if m["ok"] else "deviates (known)" if known[key] else "MISMATCH"
        res[key] = {"status": status, "max_rel": m["max_rel"], "known": known[key]}
    return res


@pytest.mark.filterwarnings("ignore:overflow")  # OpenCV's -inf LogSoftMax in the metrics
def test_opencv_on_every_case(tmp_path: Path) -> None:
    """OpenCV agrees, refuses the module, or deviates where a known deviation is recorded."""
    res = opencv_results([(k, tree, shape) for k, (_, _, tree, shape) in zip(IDS, CASE_LIST)], tmp_path)
    bad = {k: r for k, r in res.items() if r["status"] == "MISMATCH"}
    assert not bad, bad
    assert sum(r["status"] == "agrees" for r in res.values()) > len(res) // 2


def test_noncontiguous_weight_is_read_right_and_opencv_misreads_it(tmp_path: Path) -> None:
    tree = M("nn.Linear", weight=TRANSPOSED, bias=w(5))
    dump(tree, tmp_path / "m.t7")
    b = build(load_t7(tmp_path / "m.t7"), (2, 11), "m.t7")
    x = R.standard_normal((2, 11))
    y = reference.run(b.g, {"input": x})["output"]
    np.testing.assert_allclose(y, x @ WT + tree.fields["bias"], rtol=1e-6)  # the logical weight
    assert any("non-contiguously" in n for n in b.notes)
    res = opencv_results([("t", tree, (2, 11))], tmp_path)
    assert res["t"]["status"] == "deviates (known)", res


def graph_of(tree: TorchObject, shape: tuple[int, ...] = X):  # type: ignore[no-untyped-def]
    return build(tree, shape, "test.t7").g


def only_op(tree: TorchObject, shape: tuple[int, ...] = X):  # type: ignore[no-untyped-def]
    (node,) = graph_of(tree, shape).nodes
    return node.op


def pooled(tree: TorchObject, shape: tuple[int, ...] = X) -> tuple[int, ...]:
    """The spatial output size of a one-module tree."""
    g = graph_of(tree, shape)
    return g.shapes[g.nodes[-1].outputs[0]][2:]


def test_legacy_layouts() -> None:
    assert only_op(M("nn.Dropout", p=0.3)).scale == pytest.approx(0.7)  # v1: scales at inference
    assert only_op(M("nn.Dropout", p=0.3, v2=True)).scale == 1.0
    assert only_op(M("nn.SpatialDropout", p=0.2)).scale == pytest.approx(0.8)
    std = np.array([0.5, 2.0, 4.0], np.float32)
    g = graph_of(bn("nn.SpatialBatchNormalization", 3, affine=False, version=1, running_var=None,
                    running_std=std, eps=1e-3))
    np.testing.assert_allclose(g.weights[f"{g.nodes[0].attr}.running_var"], std.astype(float) ** -2 - 1e-3,
                               rtol=1e-6)
    legacy = M("nn.SpatialConvolution", nInputPlane=3, nOutputPlane=4, kW=3, kH=3, dW=1, dH=1,
               padding=1, weight=w(4, 3, 3, 3), bias=w(4))
    assert only_op(legacy).pad == (1, 1)
    mm = graph_of(conv("nn.SpatialConvolutionMM", kw=3, kh=2, weight=w(4, 18)))
    assert next(iter(mm.weights.values())).shape == (4, 3, 2, 3)  # (nOut, nIn, kH, kW)
    old_avg = M("nn.SpatialAveragePooling", kW=2, kH=2, dW=2, dH=2, padW=1, padH=1)
    op = only_op(old_avg)  # no ceil_mode: padding ignored; no divide: sums
    assert (op.pad, op.mode) == ((0, 0), "sum")


def test_batch_norm_training_flag() -> None:
    assert only_op(bn("nn.SpatialBatchNormalization", 3, affine=False, train=True)).batch_stats
    assert not only_op(bn("nn.SpatialBatchNormalization", 3, affine=False, train=0)).batch_stats
    assert not only_op(bn("nn.SpatialBatchNormalization", 3, affine=False, train=False)).batch_stats


def test_threshold_is_not_relu() -> None:
    op = only_op(M("nn.Threshold", threshold=0.1, val=-2.0))
    assert (op.kind, op.threshold, op.value) == ("threshold", 0.1, -2.0)
    assert only_op(M("nn.ReLU", threshold=0, val=0)).kind == "relu"


def test_pooling_rounding() -> None:
    # k 2, s 3, pad 1, ceil: H 7: ceil(7/3) + 1 = 4 windows, the 4th starts at 9 >= 7 + 1: dropped;
    # W 9: ceil(9/3) + 1 = 4, the 4th starts at 9 < 9 + 1: kept
    assert pooled(pool("nn.SpatialMaxPooling", 2, 2, 3, 3, 1, 1, ceil=True)) == (3, 4)
    # padW || padH: the unpadded H axis drops its last window too (THNN)
    assert pooled(pool("nn.SpatialMaxPooling", 3, 1, 2, 3, 1, 0, ceil=True), (2, 3, 5, 9)) == (2, 5)
    assert pooled(pool("nn.SpatialMaxPooling", 3, 3, 2, 2, 1, 1), X) == (4, 5)  # floor
    # cudnn.torch: ceil((n + 2p - k) / s) + 1 without the drop; here that is the same size
    assert pooled(pool("cudnn.SpatialMaxPooling", 3, 3, 2, 2, 1, 1, ceil=True)) == (4, 5)
    with pytest.raises(BadModel, match="past the input"):  # cudnn keeps a window in the padding
        graph_of(pool("cudnn.SpatialMaxPooling", 2, 2, 3, 3, 1, 1, ceil=True))
    with pytest.raises(BadModel, match="divisor"):
        graph_of(pool("cudnn.SpatialAveragePooling", 2, 2, 3, 3, 0, 0, ceil=True, count_include_pad=True))


def test_view_follows_torch7() -> None:
    assert torch_view((2, 3, 7, 9), [-1], 3) == (2, 189)
    assert torch_view((2, 3, 7, 9), [-1], None) == (378,)  # no numInputDims: one flat vector
    assert torch_view((2, 3, 7, 9), [63], None) == (6, 63)  # the remainder is the batch
    assert torch_view((1, 3, 7, 9), [189], None) == (189,)  # Torch7 drops a batch of one
    assert graph_of(M("nn.View", size=long(189)), (1, 3, 7, 9)).shapes["output"] == (1, 189)
    with pytest.raises(ValueError):
        torch_view((2, 3, 7, 9), [10], None)


def test_reshape_batch_heuristic() -> None:
    def out(size: tuple[int, ...], shape: tuple[int, ...], **f: object) -> tuple[int, ...]:
        tree = M("nn.Reshape", size=long(*size), nelement=math.prod(size), **f)
        return graph_of(tree, shape).shapes["output"]

    assert out((6, 63), X) == (6, 63)  # all the values and N != 1: not a batch
    assert out((189,), (1, 3, 7, 9)) == (1, 189)  # N == 1: a batch
    assert out((189,), X) == (2, 189)
    assert out((6, 63), X, batchMode=False) == (6, 63)


def test_tables_give_numbered_outputs() -> None:
    g = graph_of(box("nn.ConcatTable", M("nn.ReLU"), M("nn.Identity"), M("nn.Identity")))
    assert g.outputs == ["output1", "output2", "output3"]
    assert g.shapes["output2"] == X


@pytest.mark.parametrize("tree,shape,message", [
    (M("nn.SpatialCrossMapLRN", size=4), X, "even size 4"),
    (M("nn.Linear", weight=w(5, 11)), X, "expects a 1 or 2-D input"),
    (M("nn.Narrow", dimension=2, index=-1, length=1), X, "offset -1"),
    (M("nn.Narrow", dimension=2, index=3, length=2), X, "cannot take 2 from offset 3"),
    (M("nn.CAddTable"), X, "expects a table"),
    (two("nn.SpatialConvolution"), X, "expects a tensor but receives a table of 2"),
    (M("nn.View", size=long(10)), X, "does not view as"),
    (conv(n_in=4), X, "input has 3 channels"),
])
def test_bad_models_name_the_module(tree: TorchObject, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(BadModel, match=message) as e:
        graph_of(tree, shape)
    assert "module " in str(e.value) and "test.t7" in str(e.value)


def test_unsupported_classes_all_listed() -> None:
    tree = seq(conv(), M("nn.SpatialFancyNorm"), box("nn.ConcatTable", M("nn.Foo"), M("nn.ReLU")),
               M("nn.SpatialFancyNorm"), box("nn.gModule"))
    with pytest.raises(Unsupported) as e:
        graph_of(tree)
    assert e.value.items == [("nn.SpatialFancyNorm", "2"), ("nn.Foo", "3.1"),
                             ("nn.SpatialFancyNorm", "4"), ("nn.gModule", "5")]
    msg = str(e.value)
    assert "nn.SpatialFancyNorm ('2', '4')" in msg and "nn.Foo ('3.1')" in msg
    assert "nngraph" in msg and "\n" not in msg


def test_lua_definition_gets_random_t7_with_calibrated_stats(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A Lua definition's tree (from the Lua runner, stood in for here) converts with its random
    weights; batch-norm statistics are calibrated and written back, so OpenCV reading random.t7
    sees the same network."""
    # a definition is built in training mode (train = true); it is converted as deployed
    tree = seq(conv(padW=1, padH=1), bn("nn.SpatialBatchNormalization", 4, train=True), M("nn.ReLU"))
    monkeypatch.setattr("convert.torch7.frontend.run_definition", lambda path, args, seed: tree)
    src = tmp_path / "net.lua"
    src.write_text("-- stands in for a definition")
    loaded = load(src, {"input": X}, 3, {})
    res = write(loaded.graph, tmp_path / "out", loaded.extra, loaded.opencv, loaded.known_opencv)
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified" and v["opencv"]["ok"], v
    saved = load_t7(tmp_path / "out" / "random.t7").fields["modules"][2].fields
    attr = loaded.graph.nodes[1].attr
    np.testing.assert_allclose(saved["running_var"], loaded.graph.weights[f"{attr}.running_var"])
    assert saved["train"] is False and not loaded.graph.nodes[1].op.batch_stats
    assert loaded.graph.meta["weights"] is None and loaded.graph.meta["framework"] == "torch7"


def test_a_module_used_twice_shares_its_weights(tmp_path: Path) -> None:
    c = conv(n_in=3, n_out=3, padW=1, padH=1)
    tree = seq(c, M("nn.ReLU"), c)  # one Lua object added twice: one set of weights in the .t7 too
    report = convert_tree(tree, X, tmp_path)
    assert report["status"] == "verified" and report["params"] == 3 * 3 * 9 + 3
    g = graph_of(load_t7(tmp_path / "m.t7"))
    assert g.nodes[0].attr == g.nodes[2].attr
