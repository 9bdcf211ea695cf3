"""Faster R-CNN / R-FCN layers (ROIPooling, PSROIPooling, Proposal) and fork layers (Upsample,
ShuffleChannel, ReLU6, Axpy, Intel*): hand-computed cases through the whole conversion, every
backend (float64 reference, model.py, ONNX Runtime) and OpenCV on the original file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CORPUS

from convert import isolate, reference
from convert.api import convert
from convert.artifacts import load_graph
from convert.caffe import opencv
from convert.errors import BadModel
from convert.verify import run_onnx, run_torch

GOLDEN = CORPUS / "caffe-golden"
REAL = CORPUS / "realworld" / "opencv_extra-dnn"


def _inputs(shapes: dict[str, tuple[int, ...]]) -> str:
    return "".join(f'input: "{k}"\ninput_shape {{ {" ".join(f"dim: {d}" for d in s)} }}\n' for k, s in shapes.items())


def run_all(tmp: Path, text: str, feeds: dict[str, np.ndarray], name: str = "net",
            cv: bool = True) -> dict[str, np.ndarray]:
    """Convert ``text`` (checked: status verified) and run every backend on ``feeds``; returns the
    first output of each backend (OpenCV when it implements the net)."""
    proto = tmp / f"{name}.prototxt"
    proto.write_text(text)
    res = convert(proto, out=tmp / "out", shapes={k: v.shape for k, v in feeds.items()})
    assert res.report["status"] == "verified", res.report["verification"]
    g = load_graph(res.dir)
    out = g.outputs[0]
    got = {"reference": reference.run(g, feeds)[out], "pytorch": run_torch(res.dir / "model.py", feeds)[out],
           "onnxruntime": run_onnx(res.dir / "model.onnx", feeds)[out]}
    if cv:
        got["opencv"] = opencv.runner(g, proto, res.dir / "random.caffemodel")(feeds)[out]
    return got


def assert_all(got: dict[str, np.ndarray], want: np.ndarray, tol: float = 1e-6) -> None:
    for k, y in got.items():
        np.testing.assert_allclose(np.asarray(y).reshape(want.shape), want, atol=tol, err_msg=k)


# --- ROIPooling --------------------------------------------------------------------------------

ROI_NET = """
layer {{ name: "pool" type: "ROIPooling" bottom: "x" bottom: "rois" top: "pool"
  roi_pooling_param {{ pooled_h: {ph} pooled_w: {pw} spatial_scale: {scale} }} }}
"""


def _roi(tmp: Path, rois: list[list[float]], ph: int = 2, pw: int = 2, scale: float = 1.0,
         n: int = 1) -> dict[str, np.ndarray]:
    x = np.stack([np.arange(35, dtype=np.float32).reshape(1, 5, 7) + 100 * i for i in range(n)])
    r = np.array(rois, np.float32)
    text = _inputs({"x": x.shape, "rois": r.shape}) + ROI_NET.format(ph=ph, pw=pw, scale=scale)
    return run_all(tmp, text, {"x": x, "rois": r})


def test_roi_pooling_bins_clipping_and_empty_bins(tmp_path: Path) -> None:
    # 5x7 map, roi 0 covers it: bins rows [0,3) [2,5) (2.5 each), cols [0,4) [3,7) (3.5 each);
    # roi 1 spans [-10, 1]: size 12, bins [-10,-4) (empty: 0) and [-4, 2) clipped to [0, 2)
    got = _roi(tmp_path, [[0, 0, 0, 6, 4], [0, -10, -10, 1, 1]])
    assert_all(got, np.array([[[[17, 20], [31, 34]]], [[[0, 0], [0, 8]]]], np.float64))


def test_roi_pooling_rounds_halves_away_from_zero(tmp_path: Path) -> None:
    # 1 * 0.5 = 0.5 rounds to 1 (C's round; NumPy and torch would give 0), 2.5 -> 3
    got = _roi(tmp_path, [[0, 1, 1, 1, 1], [0, 5, 5, 5, 5]], ph=1, pw=1, scale=0.5)
    assert_all(got, np.array([8, 24], np.float64).reshape(2, 1, 1, 1))


def test_roi_pooling_batch_index(tmp_path: Path) -> None:
    # 1.7 truncates to image 1
    got = _roi(tmp_path, [[1.7, 0, 0, 6, 4], [0, 0, 0, 6, 4]], ph=1, pw=1, n=2)
    assert_all(got, np.array([134, 34], np.float64).reshape(2, 1, 1, 1))


@pytest.mark.skipif(not GOLDEN.exists(), reason="corpus not available")
def test_roi_pooling_golden_against_opencv(tmp_path: Path) -> None:
    x = {"input": np.load(GOLDEN / "net_roi_pooling.input.npy"), "rois": np.load(GOLDEN / "net_roi_pooling.rois.npy")}
    got = run_all(tmp_path, (GOLDEN / "net_roi_pooling.prototxt").read_text(), x)
    assert_all(got, np.load(GOLDEN / "net_roi_pooling.npy").astype(np.float64), tol=0)


# --- fork layers -------------------------------------------------------------------------------

def test_upsample_nearest(tmp_path: Path) -> None:
    x = np.arange(2 * 3 * 3 * 5, dtype=np.float32).reshape(2, 3, 3, 5)
    text = _inputs({"x": x.shape}) + \
        'layer { name: "up" type: "Upsample" bottom: "x" top: "up" upsample_param { scale: 2 } }'
    got = run_all(tmp_path, text, {"x": x}, cv=False)  # OpenCV has no Caffe Upsample
    assert_all(got, x.repeat(2, axis=2).repeat(2, axis=3).astype(np.float64))


def test_upsample_unpooling_form_is_refused(tmp_path: Path) -> None:
    proto = tmp_path / "n.prototxt"
    proto.write_text(_inputs({"x": (1, 2, 3, 3), "i": (1, 2, 3, 3)})
                     + 'layer { name: "up" type: "Upsample" bottom: "x" bottom: "i" top: "up" }')
    with pytest.raises(BadModel, match="max-unpooling"):
        convert(proto, out=tmp_path / "out")


def test_shuffle_channel(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 6, 1, 1) * np.ones((1, 1, 3, 5), np.float32)
    text = _inputs({"x": x.shape}) + \
        'layer { name: "s" type: "ShuffleChannel" bottom: "x" top: "s" shuffle_channel_param { group: 2 } }'
    got = run_all(tmp_path, text, {"x": x})
    assert_all(got, x[:, [0, 3, 1, 4, 2, 5]].astype(np.float64))


def test_relu6(tmp_path: Path) -> None:
    x = np.linspace(-3, 9, 2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    text = _inputs({"x": x.shape}) + 'layer { name: "r" type: "ReLU6" bottom: "x" top: "r" }'
    assert_all(run_all(tmp_path, text, {"x": x}), np.clip(x, 0, 6).astype(np.float64))


def _axpy(tmp: Path) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(1)
    shapes = [(1, 3, 1, 1), (1, 3, 4, 5), (1, 3, 4, 5)]  # OpenCV's Axpy fails at batch 2
    a, x, y = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    text = _inputs({"a": a.shape, "x": x.shape, "y": y.shape}) + \
        'layer { name: "axpy" type: "Axpy" bottom: "a" bottom: "x" bottom: "y" top: "axpy" }'
    return run_all(tmp, text, {"a": a, "x": x, "y": y}), [a, x, y]


def test_axpy(tmp_path: Path) -> None:
    got, (a, x, y) = _axpy(tmp_path)
    cv = got.pop("opencv")
    assert_all(got, (a * x + y).astype(np.float64), tol=1e-5)  # Caffe: bottom[0] * bottom[1] + bottom[2]
    np.testing.assert_allclose(cv, a * y + x, atol=1e-5)  # OpenCV swaps x and y (a known deviation)


@pytest.mark.skipif(not REAL.exists(), reason="corpus not available")
def test_axpy_corpus(tmp_path: Path) -> None:
    res = convert(REAL / "axpy.prototxt", out=tmp_path)
    assert res.report["status"] == "verified"
    assert res.report["verification"]["backends"]["opencv"]["status"] == "deviates (known)"


def test_intel_layers(tmp_path: Path) -> None:
    x = np.random.default_rng(2).standard_normal((1, 5, 4, 3)).astype(np.float32)
    text = _inputs({"x": x.shape}) + """
layer { name: "p" type: "IntelPack" bottom: "x" top: "p" }
layer { name: "n" type: "IntelLRN" bottom: "p" top: "n" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 } }
layer { name: "u" type: "IntelUnpack" bottom: "n" top: "u" }
"""
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    want = x / (1 + 0.5 / 3 * (sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:])) ** 0.75
    assert_all(run_all(tmp_path, text, {"x": x}, cv=False), want, tol=1e-5)


# --- Proposal ----------------------------------------------------------------------------------

def test_anchors_are_py_faster_rcnn_s() -> None:
    from convert.ops.roi import generate_anchors

    want = [[-84, -40, 99, 55], [-176, -88, 191, 103], [-360, -184, 375, 199], [-56, -56, 71, 71],
            [-120, -120, 135, 135], [-248, -248, 263, 263], [-36, -80, 51, 95], [-80, -168, 95, 183],
            [-168, -344, 183, 359]]
    np.testing.assert_array_equal(generate_anchors(16, (0.5, 1, 2), (8, 16, 32)), want)


PROPOSAL = """
layer {{ name: "prop" type: "Proposal" bottom: "s" bottom: "d" bottom: "info" top: "rois" top: "scores"
  proposal_param {{ feat_stride: 4 base_size: 16 min_size: 16 ratio: 1 scale: 1 pre_nms_topn: 10
                    post_nms_topn: 3 nms_thresh: {thresh} }} }}
"""
PARAMS = "'feat_stride': 4, 'scales': [1], 'ratios': [1], 'pre_nms_topn': 10, 'post_nms_topn': 3"
PY_PROPOSAL = """
layer {{ name: "prop" type: "Python" bottom: "s" bottom: "d" bottom: "info" top: "rois" top: "scores"
  python_param {{ module: "rpn.proposal_layer" layer: "ProposalLayer"
                  param_str: "PARAMS, 'nms_thresh': {thresh}" }} }}
""".replace("PARAMS", PARAMS)


@pytest.mark.parametrize("form", [PROPOSAL, PY_PROPOSAL], ids=["cpp", "python"])
@pytest.mark.parametrize("fg, want", [
    ([0.9, 0.8, 0.7, 0.6], [0, 2]),  # 1 overlaps 0 by 0.6 > 0.5, 3 overlaps 2 by 0.6
    ([0.6, 0.7, 0.8, 0.9], [3, 1]),
    ([0.5, 0.5, 0.5, 0.5], [0, 2]),  # ties: the first position first
])
def test_proposal_nms(tmp_path: Path, form: str, fg: list[float], want: list[int]) -> None:
    # one 16x16 anchor [4i, 0, 4i + 15, 15] per cell (stride 4); zero deltas decode it to
    # [4i, 0, 4i + 16, 16] (py-faster-rcnn: centre x1 + w/2, corners centre -/+ w/2)
    s = np.array([[[1 - v for v in fg]], [fg]], np.float32).reshape(1, 2, 1, 4)
    feeds = {"s": s, "d": np.zeros((1, 4, 1, 4), np.float32), "info": np.array([[100, 100, 1]], np.float32)}
    text = _inputs({k: v.shape for k, v in feeds.items()}) + form.format(thresh=0.5)
    cv = form is PROPOSAL and len(set(fg)) == len(fg)  # OpenCV's order of tied scores is its own
    got = run_all(tmp_path, text, feeds, cv=cv)
    rois = np.zeros((3, 5))
    rois[:len(want), 1:] = [[4 * i, 0, 4 * i + 16, 16] for i in want]
    assert_all(got, rois)


@pytest.mark.skipif(not GOLDEN.exists(), reason="corpus not available")
@pytest.mark.parametrize("python_form", [False, True], ids=["cpp", "python"])
def test_proposal_golden(tmp_path: Path, python_form: bool) -> None:
    """Real py-faster-rcnn output (126 proposals) from OpenCV's test data (im_info 600, 800, 1.6)."""
    text = (GOLDEN / "net_faster_rcnn_proposal.prototxt").read_text()
    if python_form:
        text = text[:text.index("layer {\n  name: 'output'")] + """
layer { name: 'output' type: 'Python' bottom: 'rpn_cls_prob_reshape' bottom: 'rpn_bbox_pred' bottom: 'im_info'
  top: 'rois' top: 'scores'
  python_param { module: 'rpn.proposal_layer' layer: 'ProposalLayer' param_str: "'feat_stride': 9" } }"""
    feeds = {"rpn_cls_prob_reshape": np.load(GOLDEN / "net_faster_rcnn_proposal.scores.npy"),
             "rpn_bbox_pred": np.load(GOLDEN / "net_faster_rcnn_proposal.deltas.npy"),
             "im_info": np.array([[600, 800, 1.6]], np.float32)}
    got = run_all(tmp_path, text, feeds, cv=not python_form)
    want = np.zeros((300, 5))
    found = np.load(GOLDEN / "net_faster_rcnn_proposal.out_rois.npy")
    want[:len(found)] = found
    assert_all(got, want, tol=1e-4)  # pixel coordinates up to 800, float32


def test_python_param_str_is_never_evaluated(tmp_path: Path) -> None:
    proto = tmp_path / "n.prototxt"
    proto.write_text(_inputs({"s": (1, 18, 3, 4), "d": (1, 36, 3, 4), "info": (1, 3)}) + """
layer { name: "p" type: "Python" bottom: "s" bottom: "d" bottom: "info" top: "rois"
  python_param { module: "rpn.proposal_layer" layer: "ProposalLayer"
                 param_str: "'feat_stride': __import__('os').getpid()" } }""")
    with pytest.raises(BadModel, match="not a Python dict literal"):
        convert(proto, out=tmp_path / "out")


def test_opencv_proposal_keeps_small_boxes(tmp_path: Path) -> None:
    """The evidence for the known deviation: a 1-pixel-wide box (clipped at the image's right
    edge) that py-faster-rcnn drops (min_size 16) comes out of OpenCV."""
    s = np.array([0.9, 0.1, 0.1, 0.9], np.float32).reshape(1, 2, 1, 2)  # background, objectness
    d = np.zeros((1, 4, 1, 2), np.float32)
    d[0, 0, 0, 1] = 3.0  # the second anchor moves 48 pixels right: clipped to [49, 49]
    feeds = {"s": s, "d": d, "info": np.array([[60, 50, 1]], np.float32)}
    text = _inputs({k: v.shape for k, v in feeds.items()}) + PROPOSAL.format(thresh=0.5)
    got = run_all(tmp_path, text, feeds)
    cv = got.pop("opencv")
    want = np.zeros((3, 5))
    want[0, 1:] = [0, 0, 16, 16]
    assert_all(got, want)
    assert cv[0, 1] == cv[0, 3] == 49  # the 1-pixel box, ranked first (score 0.9)


# --- PSROIPooling ------------------------------------------------------------------------------

PSROI_NET = """
layer { name: "ps" type: "PSROIPooling" bottom: "x" bottom: "rois" top: "ps"
  psroi_pooling_param { spatial_scale: 1 output_dim: 1 group_size: 2 } }
"""


def _psroi(tmp: Path, rois: list[list[float]]) -> dict[str, np.ndarray]:
    x = (np.arange(24, dtype=np.float32).reshape(1, 1, 4, 6) + 100 * np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1))
    r = np.array(rois, np.float32)
    return run_all(tmp, _inputs({"x": x.shape, "rois": r.shape}) + PSROI_NET, {"x": x, "rois": r})


def test_psroi_pooling_position_sensitive_means(tmp_path: Path) -> None:
    # roi x [0, 5 + 1), y [0, 3 + 1): bins 3 wide, 2 high; bin (i, j) averages channel 2i + j
    assert_all(_psroi(tmp_path, [[0, 0, 0, 5, 3]]), np.array([[[[4, 107], [216, 319]]]], np.float64), tol=1e-5)


def test_psroi_pooling_clipped_and_empty_bins(tmp_path: Path) -> None:
    # x [4, 10): bins [4, 7) -> [4, 6) and [7, 10) -> empty; y [2, 6): [2, 4) and [4, 6) -> empty
    got = _psroi(tmp_path, [[0, 4, 2, 9, 5], [0, -20, -20, -10, -10]])
    assert_all(got, np.array([[[[19.5, 0], [0, 0]]], [[[0, 0], [0, 0]]]], np.float64), tol=1e-5)


@pytest.mark.parametrize("layer", ["roi", "psroi"])
def test_random_rois_against_opencv(tmp_path: Path, layer: str) -> None:
    """Many rois (inside, across and outside the map, degenerate, halves to round) on odd sizes."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 18, 13, 11)).astype(np.float32)
    r = np.concatenate([rng.integers(0, 2, (60, 1)), rng.integers(-8, 30, (60, 4))], 1).astype(np.float32)
    r[:10, 1:] += 0.5  # exact halves: C's round goes away from zero
    param = ('roi_pooling_param { pooled_h: 3 pooled_w: 4 spatial_scale: 0.5 }' if layer == "roi" else
             'psroi_pooling_param { spatial_scale: 0.5 output_dim: 2 group_size: 3 }')
    kind = "ROIPooling" if layer == "roi" else "PSROIPooling"
    text = _inputs({"x": x.shape, "rois": r.shape}) + \
        f'layer {{ name: "p" type: "{kind}" bottom: "x" bottom: "rois" top: "p" {param} }}'
    got = run_all(tmp_path, text, {"x": x, "rois": r})
    assert_all(got, got["reference"], tol=1e-5)


def test_fast_rcnn_dropout_scale_train(tmp_path: Path) -> None:
    """caffe-fast-rcnn's scale_train: false (py-faster-rcnn's ZF and VGG16 test nets) multiplies by
    1 - ratio at test time."""
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 5)).astype(np.float32)
    text = _inputs({"x": x.shape}) + 'layer { name: "d" type: "Dropout" bottom: "x" top: "d" ' \
        'dropout_param { dropout_ratio: 0.3 scale_train: false } }'
    assert_all(run_all(tmp_path, text, {"x": x}), x * 0.7, tol=1e-6)


# --- Faster R-CNN nets from the corpus ---------------------------------------------------------

def _faster_rcnn(tmp: Path, name: str, size: int) -> None:
    """py-faster-rcnn's test net (OpenCV's copy, without its DetectionOutput post-processing) with
    seeded weights, at ``size`` x ``size``: every backend and OpenCV give the same proposals and the
    same class scores and box deltas. The image is N(0, 1) (objectness well separated, no near-ties
    for NMS to break differently in float32) and im_info's scale is tiny (min_size filters nothing:
    OpenCV does not apply it)."""
    text = (REAL / f"{name}.prototxt").read_text()
    proto = tmp / f"{name}.prototxt"
    proto.write_text(text[:text.index("# ======== Postprocessing")])
    res = convert(proto, out=tmp / "out", shapes={"data": (1, 3, size, size), "im_info": (1, 3)}, check=False)
    g = load_graph(res.dir)
    x = {"data": np.random.default_rng(5).standard_normal((1, 3, size, size)).astype(np.float32),
         "im_info": np.array([[size, size, 0.01]], np.float32)}
    ref = reference.run(g, x, keep=True)
    got = {"pytorch": run_torch(res.dir / "model.py", x, g, capture=True),
           "onnxruntime": run_onnx(res.dir / "model.onnx", x, ["rois"]),
           "opencv": _opencv(g, proto, res.dir / "random.caffemodel", x, ["rois", *g.outputs])}
    found = int((np.abs(ref["rois"]).sum(1) > 0).sum())
    assert found > 50
    for backend, out in got.items():
        np.testing.assert_allclose(out["rois"], ref["rois"], atol=0.02, err_msg=backend)  # pixels, float32
        for o in g.outputs:
            err = np.abs(out[o] - ref[o]).max() / np.abs(ref[o]).max()
            assert err < 1e-4, (backend, o, err)


def _opencv(g: Any, proto: Path, weights: Path, x: dict[str, np.ndarray], values: list[str]) -> dict[str, np.ndarray]:
    layer_of = opencv.layer_values(g)
    outs, _ = isolate.call("convert.caffe.opencv:forward", x, prototxt=str(proto), caffemodel=str(weights),
                           outputs={v: layer_of[v] for v in values})
    return outs


@pytest.mark.skipif(not REAL.exists(), reason="corpus not available")
def test_faster_rcnn_zf(tmp_path: Path) -> None:
    _faster_rcnn(tmp_path, "faster_rcnn_zf", 128)


@pytest.mark.slow
@pytest.mark.skipif(not REAL.exists(), reason="corpus not available")
def test_faster_rcnn_vgg16(tmp_path: Path) -> None:
    _faster_rcnn(tmp_path, "faster_rcnn_vgg16", 160)
