"""caffemodel binaries: our wire-format reader and writer, V1/V2 files, legacy blob shapes, errors."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus

from convert.api import convert
from convert.caffe import binary
from convert.caffe.schema import message_class
from convert.errors import BadModel

NET = '''input: "data" input_dim: 2 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 5 } }
'''


def blobs(seed: int = 0) -> list[tuple[str, str, list[np.ndarray]]]:
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    return [("conv", "Convolution", [f(4, 3, 3, 3), f(4)]), ("fc", "InnerProduct", [f(5, 144), f(5)])]


def test_round_trip_is_exact_and_zero_copy(tmp_path: Path) -> None:
    path = tmp_path / "w.caffemodel"
    binary.write(path, blobs(), "net")
    w = binary.read(path)
    for name, _, arrays in blobs():
        for a, b in zip(arrays, w.blobs[name]):
            assert a.shape == b.shape and np.array_equal(a, b)
    base = w.blobs["fc"][0]
    while getattr(base, "base", None) is not None:
        base = base.base
    base = base.obj if isinstance(base, memoryview) else base
    assert isinstance(base, mmap.mmap)  # a view of the mapped file, not a copy


def test_protobuf_reads_what_we_write(tmp_path: Path) -> None:
    path = tmp_path / "w.caffemodel"
    binary.write(path, blobs(), "net")
    net = message_class("NetParameter")()
    net.ParseFromString(path.read_bytes())
    assert [L.name for L in net.layer] == ["conv", "fc"]
    assert list(net.layer[1].blobs[0].shape.dim) == [5, 144]
    assert np.allclose(np.array(net.layer[0].blobs[1].data), blobs()[0][2][1])


def test_legacy_v1_blobs_and_old_4d_shapes(tmp_path: Path) -> None:
    """A V1 binary (13 layers, (1,1,N,K) fully-connected blobs) with its V2 deploy prototxt."""
    root = corpus("realworld", "ikkiChung", "Prediction-Example-With-Caffe", "examples")
    weights = root / "cifar10" / "cifar10_quick_iter_5000.caffemodel"
    w = binary.read(weights)
    assert w.blobs["ip1"][0].shape == (1, 1, 64, 1024)
    proto = corpus("realworld", "BVLC", "caffe", "examples", "cifar10", "cifar10_quick.prototxt")
    res = convert(proto, weights, out=tmp_path)
    assert res.report["status"] == "verified"
    assert res.report["verification"]["backends"]["opencv"]["ok"]


def test_v2_binary_lenet(tmp_path: Path) -> None:
    root = corpus("realworld", "ethereon", "caffe-tensorflow", "examples", "mnist")
    res = convert(root / "lenet.prototxt", root / "lenet_iter_10000.caffemodel", out=tmp_path)
    assert res.report["status"] == "verified"
    assert res.report["verification"]["backends"]["opencv"]["ok"]


def test_user_weights_are_used_not_random(tmp_path: Path) -> None:
    proto = tmp_path / "n.prototxt"
    proto.write_text(NET)
    binary.write(tmp_path / "w.caffemodel", blobs(3))
    res = convert(proto, tmp_path / "w.caffemodel", out=tmp_path / "o")
    from safetensors.numpy import load_file

    got = load_file(str(res.dir / "model.safetensors"))
    assert np.array_equal(got["fc.weight"], blobs(3)[1][2][0])
    assert not (res.dir / "random.caffemodel").exists()


@pytest.mark.parametrize("cut", [1, 7, 100, -5])
def test_truncated_caffemodel(tmp_path: Path, cut: int) -> None:
    proto = tmp_path / "n.prototxt"
    proto.write_text(NET)
    full = tmp_path / "full.caffemodel"
    binary.write(full, blobs())
    data = full.read_bytes()
    bad = tmp_path / "bad.caffemodel"
    bad.write_bytes(data[:cut] if cut > 0 else data[:cut])
    with pytest.raises(BadModel, match="truncated or not a caffemodel|no layers found"):
        convert(proto, bad, out=tmp_path / "o")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_blob_mismatches_name_the_layer(tmp_path: Path) -> None:
    proto = tmp_path / "n.prototxt"
    proto.write_text(NET)
    wrong = blobs()
    wrong[1] = ("fc", "InnerProduct", [np.zeros((5, 100), np.float32), np.zeros(5, np.float32)])
    binary.write(tmp_path / "w.caffemodel", wrong)
    with pytest.raises(BadModel, match=r"layer 'fc' \(InnerProduct\): blob 0 has shape \[5, 100\] but "
                                       r"the layer expects \[5, 144\]"):
        convert(proto, tmp_path / "w.caffemodel", out=tmp_path / "o")
    binary.write(tmp_path / "w2.caffemodel", [blobs()[0], ("fc", "InnerProduct", blobs()[1][2][:1])])
    with pytest.raises(BadModel, match=r"layer 'fc' \(InnerProduct\): expects 2 blobs"):
        convert(proto, tmp_path / "w2.caffemodel", out=tmp_path / "o")
    binary.write(tmp_path / "w3.caffemodel", blobs()[:1])
    with pytest.raises(BadModel, match=r"layer 'fc' \(InnerProduct\): no weights for this layer"):
        convert(proto, tmp_path / "w3.caffemodel", out=tmp_path / "o")


def test_missing_weights_file(tmp_path: Path) -> None:
    proto = tmp_path / "n.prototxt"
    proto.write_text(NET)
    from convert.errors import ConvertError

    with pytest.raises(ConvertError, match="no such weights file"):
        convert(proto, tmp_path / "nope.caffemodel", out=tmp_path / "o")
