"""Any input size, exactly as Caffe computes it: a net converted once runs at other sizes in the
float64 reference, model.py and model.onnx (and OpenCV on the original prototxt), with Caffe's
output-size rules applied to the actual input (pooling rounds up and clips, convolution rounds
down), and the shape layers follow Caffe's rules (Reshape 0/-1/axis/num_axes, Flatten, Slice, Crop)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS

from convert import reference
from convert.api import convert, load
from convert.artifacts import write
from convert.errors import ShapeError
from convert.ir import Graph, Op
from convert.ops.pool import Pool
from convert.ops.shape import Crop, Pad, Reshape, Resize, Split
from convert.verify import TOLERANCE, run_onnx, run_torch, seeded_inputs


def caffe_pool(n: int, k: int, s: int, p: int = 0) -> int:
    """Caffe's pooling_layer.cpp, written out independently: ceil, then clip the last window."""
    out = int(math.ceil((n + 2 * p - k) / s)) + 1
    if p and (out - 1) * s >= n + p:
        out -= 1
    return out


def caffe_conv(n: int, k: int, s: int = 1, p: int = 0) -> int:
    return (n + 2 * p - k) // s + 1


PNET = """name: "pnet_like"
input: "data" input_shape { dim: 1 dim: 3 dim: 12 dim: 12 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "prelu1" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 5 kernel_size: 3 } }
layer { name: "prelu2" type: "PReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "pool3" type: "Pooling" bottom: "pool2" top: "pool3"
  pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "conv3" type: "Convolution" bottom: "pool3" top: "conv3"
  convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "prob" type: "Softmax" bottom: "conv3" top: "prob" }
"""


def pnet_hw(n: int) -> int:
    n = caffe_pool(caffe_conv(n, 3), 2, 2)
    return caffe_pool(caffe_pool(caffe_conv(n, 3), 3, 2), 3, 2, 1)


SRNET = """name: "sr_like"
input: "data" input_shape { dim: 1 dim: 1 dim: 16 dim: 16 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "up" type: "Deconvolution" bottom: "pool1" top: "up"
  convolution_param { num_output: 3 kernel_size: 4 stride: 2 } }
layer { name: "crop" type: "Crop" bottom: "up" bottom: "data" top: "crop"
  crop_param { axis: 2 offset: 1 } }
"""


def run_all(art: Path, g: Graph, source: Path, shape: tuple[int, ...], cv: bool = True
            ) -> dict[str, dict[str, np.ndarray]]:
    """Every backend's outputs at input ``shape``: reference, pytorch, onnxruntime, opencv."""
    feeds = seeded_inputs({next(iter(g.inputs)): shape}, seed=3)
    outs = {"reference": reference.run(g, feeds), "pytorch": run_torch(art / "model.py", feeds),
            "onnxruntime": run_onnx(art / "model.onnx", feeds)}
    if cv:
        import cv2

        net = cv2.dnn.readNetFromCaffe(str(source), str(art / "random.caffemodel"))
        net.setInput(feeds[next(iter(g.inputs))])
        outs["opencv"] = dict(zip(g.outputs, net.forward(list(g.outputs))))
    return outs


def check_backends(outs: dict[str, dict[str, np.ndarray]], shapes: dict[str, tuple[int, ...]]) -> None:
    ref = outs["reference"]
    for name, got in outs.items():
        for k, want in shapes.items():
            assert tuple(got[k].shape) == want, (name, k, got[k].shape, want)
            scale = float(np.abs(ref[k]).max()) or 1.0
            assert float(np.abs(got[k] - ref[k]).max()) / scale <= TOLERANCE["fp32"], (name, k)


def input_dims(art: Path) -> list[str | int]:
    import onnx

    return [d.dim_param or d.dim_value
            for d in onnx.load(str(art / "model.onnx")).graph.input[0].type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def pnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Graph]:
    d = tmp_path_factory.mktemp("pnet")
    (d / "pnet.prototxt").write_text(PNET)
    res = convert(d / "pnet.prototxt", out=d / "out")
    assert res.report["status"] == "verified", res.report["verification"]
    return d / "pnet.prototxt", res.dir, load(d / "pnet.prototxt", d / "out" / "pnet" / "random.caffemodel").graph


@pytest.mark.parametrize("hw", [(12, 12), (37, 29), (61, 44)])
def test_pnet_like_runs_at_any_size(pnet, hw: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("cv2")
    source, art, g = pnet
    outs = run_all(art, g, source, (2, 3, *hw))
    check_backends(outs, {"prob": (2, 2, pnet_hw(hw[0]), pnet_hw(hw[1]))})


def test_pnet_like_records_both_sizes(pnet) -> None:  # type: ignore[no-untyped-def]
    _, art, _ = pnet
    info = json.loads((art / "convert.json").read_text())
    assert info["dynamic"] == {"batch": True, "spatial": True, "fixed_by": None}
    sizes = info["verification_sizes"]
    assert [s["inputs"]["data"] for s in sizes] == [[1, 3, 12, 12], [2, 3, 25, 19]]
    assert all(s["status"] == "verified" for s in sizes)
    assert set(sizes[1]["backends"]) >= {"pytorch", "onnxruntime", "opencv"}
    assert input_dims(art) == ["N", 3, "H", "W"]


@pytest.mark.parametrize("hw", [(16, 16), (29, 23), (40, 51)])
def test_sr_like_deconv_crop_at_any_size(tmp_path: Path, hw: tuple[int, int]) -> None:
    pytest.importorskip("cv2")
    (tmp_path / "sr.prototxt").write_text(SRNET)
    res = convert(tmp_path / "sr.prototxt", out=tmp_path / "out")
    assert res.report["status"] == "verified", res.report["verification"]
    g = load(tmp_path / "sr.prototxt", res.dir / "random.caffemodel").graph
    outs = run_all(res.dir, g, tmp_path / "sr.prototxt", (1, 1, *hw))
    check_backends(outs, {"crop": (1, 3, *hw)})  # cropped to the data blob, whatever its size


MTCNN = CORPUS / "trained" / "mtcnn"


@pytest.mark.skipif(not (MTCNN / "det1.caffemodel").exists(), reason="corpus not available")
def test_real_pnet_at_pyramid_scales(tmp_path: Path) -> None:
    """MTCNN's PNet declared at 12x12 and run on pyramid levels: Caffe gives 56x44 at 121x97."""
    pytest.importorskip("cv2")
    import cv2

    res = convert(MTCNN / "det1.prototxt", MTCNN / "det1.caffemodel", out=tmp_path)
    assert res.report["status"] == "verified"
    g = load(MTCNN / "det1.prototxt", MTCNN / "det1.caffemodel").graph
    net = cv2.dnn.readNetFromCaffe(str(MTCNN / "det1.prototxt"), str(MTCNN / "det1.caffemodel"))
    for hw, want in (((121, 97), (56, 44)), ((60, 45), (25, 18))):
        feeds = seeded_inputs({"data": (1, 3, *hw)}, seed=5)
        net.setInput(feeds["data"])
        cv = dict(zip(g.outputs, net.forward(list(g.outputs))))
        outs = {"reference": reference.run(g, feeds), "pytorch": run_torch(res.dir / "model.py", feeds),
                "onnxruntime": run_onnx(res.dir / "model.onnx", feeds), "opencv": cv}
        check_backends(outs, {"prob1": (1, 2, *want), "conv4-2": (1, 4, *want)})


def test_fixed_size_net_says_which_layer(tmp_path: Path) -> None:
    text = PNET.replace('layer { name: "prob"', 'layer { name: "fc" type: "InnerProduct" bottom: "conv3" '
                        'top: "fc" inner_product_param { num_output: 3 } }\nlayer { name: "prob"').replace(
        'bottom: "conv3" top: "prob"', 'bottom: "fc" top: "prob"')
    (tmp_path / "fc.prototxt").write_text(text)
    res = convert(tmp_path / "fc.prototxt", out=tmp_path / "out")
    info = json.loads((res.dir / "convert.json").read_text())
    assert info["dynamic"]["batch"] and not info["dynamic"]["spatial"]
    assert "'fc'" in info["dynamic"]["fixed_by"]
    assert [s["inputs"]["data"] for s in info["verification_sizes"]] == [[1, 3, 12, 12], [2, 3, 12, 12]]
    assert input_dims(res.dir) == ["N", 3, 12, 12]


# --- per op: converted at one size, run at another -------------------------------------------

X = (2, 3, 7, 9)
ODD = (3, 3, 12, 16)  # (H, W) + (5, 7), batch 3

DYNAMIC_OPS: list[tuple[Op, list[tuple[int, ...]], list[tuple[int, ...]]]] = [
    (Pool("max", (2, 2), (2, 2), (0, 0), True, False), [X], [ODD]),
    (Pool("max", (3, 3), (2, 2), (1, 1), True, True), [X], [ODD]),
    (Pool("max", (2, 2), (3, 3), (1, 1), True, True), [X], [ODD]),  # a dropped last window at 7
    (Pool("avg", (3, 3), (2, 2), (1, 1), True, True), [X], [ODD]),
    (Pool("avg", (3, 3), (2, 2), (1, 1), True, True, count_pad=False), [X], [ODD]),
    (Pool("avg", (2, 2), (3, 3), (1, 1), True, True), [X], [ODD]),  # overhang past the padding
    (Pool("sum", (3, 3), (2, 2), (1, 1), True, True), [X], [ODD]),
    (Pool("max", (4, 2), (3, 2), (2, 0), True, True), [X], [ODD]),  # pad > kernel / 2
    (Pool("max", (3, 3), (2, 2), (1, 1), True, False), [X], [ODD]),  # cudnn: never drops
    (Pool("max", (3, 3), (2, 2), (0, 0), True, True), [X], [ODD]),  # no padding: ONNX's ceil_mode
    (Pool("avg", (3, 3), (2, 2), (0, 0), True, False), [X], [ODD]),  # ... and its exclude-pad divisor
    (Pool("avg", (2, 3), (2, 3), (0, 0), True, True), [X], [ODD]),  # stride == kernel, overhang
    (Pool("avg", (7, 9), (1, 1), (0, 0), whole=True), [X], [ODD]),
    (Pool("max", (7, 9), (1, 1), (0, 0), whole=True), [X], [ODD]),
    (Reshape((0, -1)), [X], [ODD]),
    (Reshape((-1,), 1, 2), [X], [ODD]),  # Flatten axis 1 end_axis 2
    (Reshape((0, 1, -1), 2, 2), [X], [ODD]),  # rank grows
    (Reshape((0, 0, -1)), [X], [ODD]),
    (Crop((0, 0, 1, 2), (0, 0, 0, 0), 2), [X, (2, 3, 5, 6)], [ODD, (3, 3, 9, 11)]),
    (Crop((0, 0, 2, 0), (0, 0, 3, 0)), [X], [ODD]),
    (Split(2, (2, -1)), [X], [ODD]),
    (Split(1, (-1, -1, -1)), [X], [ODD]),
    (Pad(((0, 0), (0, 0), (-1, -2), (1, -2)), "constant"), [X], [ODD]),
    (Resize(mode="bilinear", zoom=2), [X], [ODD]),
    (Resize(mode="bilinear", shrink=2, zoom=3), [X], [ODD]),
    (Resize(mode="nearest", scale=2), [X], [ODD]),
    (Resize(mode="bilinear"), [X, (2, 1, 10, 13)], [ODD, (3, 1, 17, 5)]),
]


@pytest.mark.parametrize("op,declared,other", DYNAMIC_OPS,
                         ids=[f"{o.kind}-{i}" for i, (o, _, _) in enumerate(DYNAMIC_OPS)])
def test_op_at_another_size(op: Op, declared, other, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = Graph(meta={"name": op.kind, "framework": "test", "source": "tests"})
    ins = [g.add_input(f"in{i}", s) for i, s in enumerate(declared)]
    n_out = len(op.sizes) if isinstance(op, Split) else 1
    g.outputs = list(g.add(op, ins, [f"out{i}" for i in range(n_out)], "layer").outputs)
    res = write(g, tmp_path / "m")
    assert res.report["status"] == "verified", res.report
    feeds = seeded_inputs(dict(zip(ins, other)), seed=2)
    want = g.infer_shapes(dict(zip(ins, other)))
    ref = reference.run(g, feeds)
    for name, got in (("pytorch", run_torch(res.dir / "model.py", feeds)),
                      ("onnxruntime", run_onnx(res.dir / "model.onnx", feeds))):
        for o in g.outputs:
            assert got[o].shape == ref[o].shape == want[o], (name, got[o].shape, want[o])
            np.testing.assert_allclose(got[o], ref[o], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("n,k,s,p", [(7, 3, 2, 1), (8, 3, 2, 1), (6, 2, 3, 1), (121, 2, 2, 0), (9, 3, 3, 2)])
def test_pool_size_is_caffes(n: int, k: int, s: int, p: int) -> None:
    op = Pool("max", (k, k), (s, s), (p, p), True, bool(p))
    assert op.infer([(1, 1, n, n + 1)], {})[0][2:] == (caffe_pool(n, k, s, p), caffe_pool(n + 1, k, s, p))


# --- Caffe's Reshape rule (reshape_layer.cpp) --------------------------------------------------

@pytest.mark.parametrize("spec,axis,num_axes,shape,want", [
    ((0, -1), 0, -1, (2, 3, 4, 5), (2, 60)),
    ((-1,), 1, 2, (2, 3, 4, 5), (2, 12, 5)),  # Flatten axis 1 end_axis 2
    ((1,), 2, 0, (2, 8), (2, 8, 1)),  # axis -1, num_axes 0: a trailing singleton (Caffe's example)
    ((2, 4), 1, -1, (2, 8), (2, 2, 4)),
    ((3, -1), 1, 1, (2, 12, 5), (2, 3, 4, 5)),  # the output's rank grows
    ((0, 0, -1), 0, -1, (2, 3, 4, 5), (2, 3, 20)),
    ((3, 0, -1), 1, -1, (2, 6, 4, 5), (2, 3, 4, 10)),  # a 0 copies the input dim at its position
    ((-1, 6), 0, -1, (2, 3, 4), (4, 6)),
    ((6,), 0, 2, (2, 3, 4), (6, 4)),
])
def test_reshape_follows_caffe(spec: tuple[int, ...], axis: int, num_axes: int, shape: tuple[int, ...],
                               want: tuple[int, ...]) -> None:
    assert Reshape(spec, axis, num_axes).target(shape) == want


@pytest.mark.parametrize("spec,axis,num_axes,shape", [
    ((-1, -1), 0, -1, (2, 3)), ((5, -1), 0, -1, (2, 3)), ((0, 0, 0), 0, -1, (2, 3)), ((4,), 3, 0, (2, 3)),
    ((7,), 0, -1, (2, 3)),
])
def test_reshape_refuses_what_caffe_refuses(spec: tuple[int, ...], axis: int, num_axes: int,
                                            shape: tuple[int, ...]) -> None:
    with pytest.raises(ShapeError):
        Reshape(spec, axis, num_axes).target(shape)


SHAPE_NET = """name: "shapes"
input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 10 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "slice" type: "Slice" bottom: "conv" top: "a" top: "b"
  slice_param { axis: 2 slice_point: 3 } }
layer { name: "split" type: "Slice" bottom: "conv" top: "c" top: "d" slice_param { axis: 1 } }
layer { name: "flat" type: "Flatten" bottom: "b" top: "flat" flatten_param { axis: 1 end_axis: -2 } }
layer { name: "rs" type: "Reshape" bottom: "c" top: "rs"
  reshape_param { shape { dim: 0 dim: 1 dim: -1 } axis: 2 num_axes: 2 } }
layer { name: "crop" type: "Crop" bottom: "d" bottom: "a" top: "crop" crop_param { axis: 2 offset: 2 offset: 0 } }
"""


def test_caffe_shape_layers_at_two_sizes(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    (tmp_path / "s.prototxt").write_text(SHAPE_NET)
    res = convert(tmp_path / "s.prototxt", out=tmp_path / "out")
    assert res.report["status"] == "verified", res.report["verification"]
    g = load(tmp_path / "s.prototxt", res.dir / "random.caffemodel").graph
    # Flatten axis 1 to -2 of b (2, 6, h - 3, w): (2, 6 (h - 3), w); Reshape axis 2
    # num_axes 2 of c (2, 3, h, w): (0, 1, -1) -> (2, 3, h, 1, w); Crop of d to a's (3, w) at (2, 0)
    for h, w in ((8, 10), (13, 17)):
        outs = run_all(res.dir, g, tmp_path / "s.prototxt", (2, 3, h, w))
        check_backends(outs, {"flat": (2, 6 * (h - 3), w), "rs": (2, 3, h, 1, w),
                              "crop": (2, 3, 3, w)})
