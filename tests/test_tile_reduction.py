"""Caffe's Tile and Reduction: a small net converted and verified at its declared size and at a
second one (both layers follow the input size), Caffe's formulas by hand, and bad parameters."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from convert.api import convert
from convert.errors import BadModel
from convert.verify import run_onnx, run_torch, seeded_inputs

NET = """name: "tr"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 7 } } }
layer { name: "tile" type: "Tile" bottom: "data" top: "tile" tile_param { axis: -1 tiles: 3 } }
layer { name: "chan" type: "Tile" bottom: "tile" top: "chan" tile_param { tiles: 2 } }
layer { name: "sq" type: "Reduction" bottom: "chan" top: "sq"
        reduction_param { operation: SUMSQ axis: 2 coeff: 0.5 } }
layer { name: "mean" type: "Reduction" bottom: "data" top: "mean" reduction_param { operation: MEAN axis: -2 } }
layer { name: "total" type: "Reduction" bottom: "tile" top: "total" reduction_param { operation: ASUM } }
"""


def caffe(x: np.ndarray) -> dict[str, np.ndarray]:
    """Caffe's Tile (copies one after another) and Reduction (every axis from `axis` on, times coeff)."""
    tile = np.concatenate([x] * 3, axis=3)
    chan = np.concatenate([tile] * 2, axis=1)
    return {"sq": 0.5 * (chan ** 2).reshape(2, 6, -1).sum(-1), "mean": x.reshape(2, 3, -1).mean(-1),
            "total": np.abs(tile).sum()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tr")
    (d / "tr.prototxt").write_text(NET)
    res = convert(d / "tr.prototxt", out=d / "out")
    assert res.report["status"] == "verified", res.report["verification"]
    return res.dir


def test_net_verifies_at_two_sizes(converted: Path) -> None:
    info = json.loads((converted / "convert.json").read_text())
    sizes = info["verification_sizes"]
    assert len(sizes) == 2 and sizes[0]["inputs"]["data"] == [2, 3, 5, 7]
    assert sizes[1]["inputs"]["data"][2:] != [5, 7]  # the second size changes H and W
    for s in sizes:
        assert s["status"] == "verified", s
        for name in ("pytorch", "onnxruntime"):
            assert s["backends"][name]["ok"] and s["backends"][name]["max_rel"] < 1e-5, s["backends"][name]
        assert s["backends"]["opencv"]["status"] == "refused"  # OpenCV 4.x has no Caffe Reduction


def test_matches_caffe_formulas(converted: Path) -> None:
    x = seeded_inputs({"data": (2, 3, 5, 7)}, seed=3)
    want = caffe(x["data"].astype(np.float64))
    for got in (run_torch(converted / "model.py", x), run_onnx(converted / "model.onnx", x)):
        assert got["total"].shape == ()  # axis 0: one value for the whole blob
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer,reason", [
    ('type: "Tile" tile_param { tiles: 0 }', "tiles must be at least 1"),
    ('type: "Tile" tile_param { axis: 4 tiles: 2 }', "axis 4 out of range"),
    ('type: "Reduction" reduction_param { axis: -5 }', "axis -5 out of range"),
    ('type: "Reduction" reduction_param { coeff: inf }', "reduction_param.coeff is inf"),
])
def test_bad_parameters(tmp_path: Path, layer: str, reason: str) -> None:
    text = NET.split("\n")[1] + f'\nlayer {{ name: "bad" {layer} bottom: "data" top: "bad" }}\n'
    (tmp_path / "bad.prototxt").write_text(text)
    with pytest.raises(BadModel, match=reason):
        convert(tmp_path / "bad.prototxt", out=tmp_path / "out")
