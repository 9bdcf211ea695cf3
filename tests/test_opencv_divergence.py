"""When only OpenCV disagrees, zoo still says at which layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from convert.api import convert

pytest.importorskip("cv2")

# OpenCV ignores k of an ACROSS_CHANNELS LRN (a known deviation, normally reported as such)
NET = """input: "data" input_dim: 1 input_dim: 4 input_dim: 7 input_dim: 7
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 6 kernel_size: 3 } }
layer { name: "norm" type: "LRN" bottom: "conv" top: "norm" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 4 } }
layer { name: "relu" type: "ReLU" bottom: "norm" top: "out" }
"""


def test_first_layer_where_only_opencv_diverges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import convert.caffe.opencv as cv

    monkeypatch.setattr(cv, "known_deviations", lambda layers: [])
    (tmp_path / "lrn.prototxt").write_text(NET)
    res = convert(tmp_path / "lrn.prototxt", out=tmp_path / "out")
    v = res.report["verification"]
    assert res.report["status"] == "mismatch" and v["backends"]["opencv"]["ok"] is False
    assert v["backends"]["pytorch"]["ok"] and v["backends"]["onnxruntime"]["ok"]
    assert v["first_divergence"]["backend"] == "opencv" and v["first_divergence"]["layer"] == "norm"
