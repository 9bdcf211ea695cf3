"""Real Caffe's outputs (corpus caffe-golden, produced by BVLC Caffe's CPU forward) reproduced by
the float64 reference, the generated PyTorch code and ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS

from convert.api import convert
from convert.errors import Unsupported
from convert.verify import run_onnx, run_torch

GOLDEN = CORPUS / "caffe-golden"
CASES = sorted(p.stem for p in GOLDEN.glob("*.prototxt") if (GOLDEN / f"{p.stem}.npy").exists()) \
    if GOLDEN.exists() else []
# Cases with a reference output whose layers zoo does not convert (the note lists them).
UNSUPPORTED: dict[str, str] = {}


def feeds(name: str) -> dict[str, np.ndarray]:
    if (GOLDEN / f"{name}.rois.npy").exists():  # ROIPooling: the feature map and its rois
        return {"input": np.load(GOLDEN / f"{name}.input.npy"), "rois": np.load(GOLDEN / f"{name}.rois.npy")}
    if (GOLDEN / f"{name}.input.npy").exists():
        return {"input": np.load(GOLDEN / f"{name}.input.npy")}
    if (GOLDEN / f"{name}.input_0.npy").exists():
        return {"input": np.load(GOLDEN / f"{name}.input_0.npy"),
                "input_1": np.load(GOLDEN / f"{name}.input_1.npy")}
    return {"input": np.load(GOLDEN / "blob.npy")}


@pytest.mark.skipif(not CASES, reason="corpus not available")
@pytest.mark.parametrize("name", CASES)
def test_reproduces_real_caffe(name: str, tmp_path: Path) -> None:
    x = feeds(name)
    weights = GOLDEN / f"{name}.caffemodel"
    try:
        res = convert(GOLDEN / f"{name}.prototxt", weights if weights.exists() else None,
                      out=tmp_path, shapes={k: v.shape for k, v in x.items()})
    except Unsupported:
        assert name in UNSUPPORTED
        return
    assert name not in UNSUPPORTED
    expected = np.load(GOLDEN / f"{name}.npy").astype(np.float64)
    scale = np.abs(expected).max()
    from convert import reference
    from convert.artifacts import load_graph

    g = load_graph(res.dir)
    got = {"reference": reference.run(g, x)["output"],
           "pytorch": run_torch(res.dir / "model.py", x)["output"],
           "onnxruntime": run_onnx(res.dir / "model.onnx", x)["output"]}
    for backend, y in got.items():
        err = np.abs(y.reshape(expected.shape) - expected).max() / scale
        assert err <= 1e-4, (backend, err)
