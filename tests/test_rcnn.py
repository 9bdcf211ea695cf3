"""Faster R-CNN / R-FCN layers (ROIPooling, PSROIPooling, Proposal) and fork layers (Upsample,
ShuffleChannel, ReLU6, Axpy, Intel*): hand-computed cases through the whole conversion, every
backend (float64 reference, model.py, ONNX Runtime) and OpenCV on the original file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS

from convert import reference
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


def test_roi_pooling_bins(tmp_path: Path) -> None:
    # 5x7 map, roi covers it: bins rows [0,3) [2,5) (2.5 each), cols [0,4) [3,7) (3.5 each)
    assert_all(_roi(tmp_path, [[0, 0, 0, 6, 4]]), np.array([[[[17, 20], [31, 34]]]], np.float64))


def test_roi_pooling_outside_the_map_and_empty_bins(tmp_path: Path) -> None:
    # roi [-10, 1]: size 12, bins [-10,-4) (empty: 0) and [-4, 2) clipped to [0, 2)
    assert_all(_roi(tmp_path, [[0, -10, -10, 1, 1]]), np.array([[[[0, 0], [0, 8]]]], np.float64))


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
