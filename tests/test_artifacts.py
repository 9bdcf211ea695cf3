"""The artifact contract: files, ONNX validity (full checker on the real file), external data for
big models, dynamic batch, atomic replacement."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from convert import artifacts, onnx_emit
from convert.api import convert
from convert.artifacts import read_safetensors, write_safetensors
from convert.errors import ConvertError
from convert.verify import run_onnx, run_torch

NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 16 input_dim: 16
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 8 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
'''


@pytest.fixture
def src(tmp_path: Path) -> Path:
    p = tmp_path / "small.prototxt"
    p.write_text(NET)
    return p


def test_real_file_passes_the_full_onnx_checker(src: Path, tmp_path: Path) -> None:
    res = convert(src, out=tmp_path)
    onnx_emit.check_onnx(res.dir / "model.onnx")
    m = onnx.load(str(res.dir / "model.onnx"))
    assert m.opset_import[0].version >= 17
    assert [i.name for i in m.graph.input] == ["data"] and [o.name for o in m.graph.output] == ["prob"]
    # ONNX's own ceil rounding only where it cannot differ from Caffe's: no padding, stride <= kernel
    for n in m.graph.node:
        at = {a.name: a for a in n.attribute}
        if "ceil_mode" in at and at["ceil_mode"].i:
            assert "pads" not in at or not any(at["pads"].ints), n.name
            assert all(s <= k for s, k in zip(at["strides"].ints, at["kernel_shape"].ints)), n.name


def test_external_data_above_the_limit(src: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(onnx_emit, "EXTERNAL_BYTES", 1000)
    res = convert(src, out=tmp_path)
    assert (res.dir / "model.onnx.data").stat().st_size > 1000
    assert res.report["status"] == "verified"
    onnx_emit.check_onnx(res.dir / "model.onnx")


def test_dynamic_batch(src: Path, tmp_path: Path) -> None:
    res = convert(src, out=tmp_path)
    assert res.report["dynamic_batch"]
    x = {"data": np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)}
    a, b = run_onnx(res.dir / "model.onnx", x)["prob"], run_torch(res.dir / "model.py", x)["prob"]
    assert a.shape == (3, 10) and np.allclose(a, b, atol=1e-5)


def test_safetensors_round_trip(tmp_path: Path) -> None:
    w = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(0, np.float32),
         "c": np.float32(2.5).reshape(())}
    write_safetensors(w, tmp_path / "w.safetensors")
    got = read_safetensors(tmp_path / "w.safetensors")
    assert all(np.array_equal(got[k], v) for k, v in w.items())


def test_replacing_is_atomic(src: Path, tmp_path: Path) -> None:
    first = convert(src, out=tmp_path)
    before = json.loads((first.dir / "convert.json").read_text())["created"]
    src.write_text(NET.replace("num_output: 10", "num_output: 0"))
    with pytest.raises(ConvertError):
        convert(src, out=tmp_path)
    assert json.loads((first.dir / "convert.json").read_text())["created"] == before  # old kept
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_full_disk_is_one_line_and_leaves_nothing(src: Path, tmp_path: Path, monkeypatch, code: int) -> None:  # type: ignore[no-untyped-def]
    def full(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(code, os.strerror(code), str(tmp_path / "x" / "model.onnx"))

    monkeypatch.setattr(artifacts, "write_onnx", full)
    out = tmp_path / "out"
    with pytest.raises(ConvertError, match=f"cannot write the output: {os.strerror(code)}; nothing was written"):
        convert(src, out=out)
    assert not out.exists() or list(out.iterdir()) == []


def test_an_unwritable_output_location_is_one_line(src: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConvertError, match="cannot write the output"):
        convert(src, out=tmp_path / "file" / "sub")
