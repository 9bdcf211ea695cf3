"""Bounded in time and memory: the memory budget, the caffemodel wire reader on garbage, cycles and deep
nesting in Torch7 trees, and telling a model's format by its content."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_files

from convert import limits
from convert.api import framework, load, source_kind
from convert.caffe import binary
from convert.caffe.schema import message_class
from convert.errors import BadModel, ConvertError
from convert.torch7 import t7write
from convert.torch7.t7file import TorchObject

INPUT = {"input": (1, 3, 8, 8)}


def one_line(err: pytest.ExceptionInfo, path: Path) -> str:
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


# --- the budget ----------------------------------------------------------------------------------

def test_budget_defaults_to_half_the_memory(monkeypatch):
    monkeypatch.delenv(limits.ENV, raising=False)
    assert 2**26 < limits.memory_budget() < 2**50


@pytest.mark.parametrize("text, value", [("123456789", 123456789), ("8G", 8 * 2**30), ("1.5 MiB", 3 * 2**19)])
def test_budget_from_the_environment(monkeypatch, text, value):
    monkeypatch.setenv(limits.ENV, text)
    assert limits.memory_budget() == value


def test_bad_budget_setting_is_one_line(monkeypatch):
    monkeypatch.setenv(limits.ENV, "lots")
    with pytest.raises(ConvertError, match=limits.ENV):
        limits.memory_budget()


def test_check_bytes_says_what_and_how_to_raise_it(monkeypatch):
    monkeypatch.setenv(limits.ENV, str(2**30))
    limits.check_bytes(2**30, "m.t7", "", "x")
    with pytest.raises(BadModel) as err:
        limits.check_bytes(int(12.6 * 2**30), "m.t7", "layer 'a'", "the weights")
    assert str(err.value) == ("m.t7: layer 'a': the weights needs 12.6 GiB, over the memory budget of 1 GiB "
                              "(set ZOO_MEMORY_BUDGET to raise it)")


def test_huge_input_dim_refused_before_verification(tmp_path):
    proto = tmp_path / "big.prototxt"
    proto.write_text('input: "data"\ninput_dim: 100000\ninput_dim: 3\ninput_dim: 224\ninput_dim: 224\n'
                     'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n')
    with pytest.raises(BadModel, match="over the memory budget") as err:
        load(proto)
    one_line(err, proto)
    # shapes only (zoo info): nothing runs the graph, so nothing to refuse
    assert load(proto, seed=None).graph.shapes["r"] == (100000, 3, 224, 224)


def test_small_graph_within_budget(tmp_path, monkeypatch):
    path = tmp_path / "relu.t7"
    t7write.dump(TorchObject("nn.Sequential", {"modules": {1: TorchObject("nn.ReLU", {})}}, 1), path)
    assert load(path, shapes=INPUT).graph.outputs == ["output"]
    monkeypatch.setenv(limits.ENV, "1000")  # 1000 bytes: even 1x3x8x8 in float64 is over
    with pytest.raises(BadModel, match="over the memory budget"):
        load(path, shapes=INPUT)


# --- the caffemodel wire reader -------------------------------------------------------------------

def refuse_in_time(path: Path, bound: float = 10.0) -> str:
    start = time.monotonic()
    with pytest.raises(BadModel) as err:
        binary.read(path)
    assert time.monotonic() - start < bound  # a hang guard only: the reader takes well under a second
    return one_line(err, path)


@pytest.mark.parametrize("content", [b"\xff", b"\x80", os.urandom(64), b"\xa2\x06\x00"],
                         ids=["0xff", "0x80", "random", "empty-layers"])
def test_garbage_caffemodel_refused_quickly(tmp_path, content):
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(content * (10 * 2**20 // len(content)))  # 10 MB
    refuse_in_time(path)


@pytest.mark.parametrize("tail, what", [(b"\x0a\x7f", "length 127 runs past"), (b"\x0b", "wire type 3"),
                                        (b"\x08" + b"\x80" * 11, "varint longer than 10 bytes"),
                                        (b"\x08\x80", "varint cut off")])
def test_malformed_fields_named(tmp_path, tail, what):
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(tail)
    assert what in refuse_in_time(path)


REAL = [p for p in corpus_files("realworld", "*.caffemodel") if p.stat().st_size < 2**21][:2]


@pytest.mark.parametrize("real", REAL, ids=[p.stem for p in REAL])
@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_real_caffemodel(tmp_path, real, keep):
    data = real.read_bytes()
    path = tmp_path / "cut.caffemodel"
    path.write_bytes(data[:int(len(data) * keep)])
    refuse_in_time(path)


def caffemodel(path: Path, dims: list[int], values: int) -> Path:
    net = message_class("NetParameter")(name="n")
    layer = net.layer.add(name="conv", type="Convolution")
    blob = layer.blobs.add()
    blob.shape.dim.extend(dims)
    blob.data.extend([0.5] * values)
    path.write_bytes(net.SerializeToString())
    return path


@pytest.mark.parametrize("dims", [[-1, 4], [-2, -2], [2**32, 1], [2**32, 0], [2**62, 2**62]])
def test_bad_blob_dims(tmp_path, dims):
    path = caffemodel(tmp_path / "w.caffemodel", dims, 4)
    with pytest.raises(BadModel, match="layer 'conv'") as err:
        binary.read(path)
    one_line(err, path)


def test_good_blob_dims(tmp_path):
    w = binary.read(caffemodel(tmp_path / "w.caffemodel", [2, 2], 4))
    assert w.blobs["conv"][0].shape == (2, 2)


# --- Torch7 trees: cycles and depth ----------------------------------------------------------------

def seq(*children: TorchObject) -> TorchObject:
    return TorchObject("nn.Sequential", {"modules": dict(enumerate(children, 1))}, 1)


def test_sequential_containing_itself(tmp_path):
    root = seq(TorchObject("nn.ReLU", {}, 1))
    root.fields["modules"][2] = seq(root)
    path = tmp_path / "cycle.t7"
    t7write.dump(root, path)
    with pytest.raises(BadModel, match="contains itself") as err:
        load(path, shapes=INPUT)
    assert "module 2.1 (nn.Sequential)" in one_line(err, path)


def test_shared_module_is_not_a_cycle(tmp_path):
    relu = TorchObject("nn.ReLU", {}, 1)
    path = tmp_path / "shared.t7"
    t7write.dump(seq(relu, seq(relu), relu), path)
    assert load(path, shapes=INPUT).graph.outputs == ["output"]


def test_400_nested_containers(tmp_path):
    root = TorchObject("nn.ReLU", {}, 1)
    for _ in range(400):
        root = seq(root)
    path = tmp_path / "deep.t7"
    path.write_bytes(nested_t7(root))
    with pytest.raises(ConvertError, match="nested deeper") as err:
        load(path, shapes=INPUT)
    one_line(err, path)


def nested_t7(root: TorchObject) -> bytes:
    """Binary .t7 of a chain of Sequentials, written without recursion (t7write recurses)."""
    out, index, chain = bytearray(), 0, []
    while root.cls == "nn.Sequential":
        chain.append(root)
        root = root.fields["modules"][1]

    def obj(cls: str, entries: int) -> bytes:
        nonlocal index
        index += 1
        name = cls.encode()
        head = struct.pack("<ii", 4, index) + struct.pack("<i", 3) + b"V 1" + struct.pack("<i", len(name)) + name
        index += 1
        return head + struct.pack("<iii", 3, index, entries)

    for _ in chain:  # {modules = {[1] = <next>}}
        out += obj("nn.Sequential", 1) + struct.pack("<i", 2) + struct.pack("<i", 7) + b"modules"
        index += 1
        out += struct.pack("<iii", 3, index, 1) + struct.pack("<id", 1, 1.0)
    out += obj("nn.ReLU", 0)
    return bytes(out)


# --- the format, by content ------------------------------------------------------------------------

RELU = seq(TorchObject("nn.ReLU", {}, 1))


@pytest.mark.parametrize("name", ["model.net", "model.th", "model.ascii", "model", "model.bin", "model.t7"])
def test_binary_t7_by_content(tmp_path, name):
    path = tmp_path / name
    t7write.dump(RELU, path)
    assert source_kind(path) == "t7" and framework(path) == "torch7"
    assert load(path, shapes=INPUT).graph.outputs == ["output"]


def test_ascii_t7_by_content(tmp_path):
    path = tmp_path / "model.ascii"
    path.write_bytes(b"4\n1\n3\nV 1\n7\nnn.ReLU\n3\n2\n0\n")
    assert source_kind(path) == "t7"
    assert load(path, shapes=INPUT).graph.outputs == ["output"]


@pytest.mark.parametrize("text, kind", [
    ('name: "n"\nlayer { name: "r" type: "ReLU" bottom: "data" top: "r" }', "prototxt"),
    ("# comment\ninput: 'data'", "prototxt"),
    ("require 'nn'\nreturn nn.Sequential()", "lua"),
    ("-- name: x\nlocal m = nn.Sequential()\nreturn m", "lua"),
    ("model = nn.Sequential():add(nn.ReLU())", "lua"),
])
def test_text_formats_by_content(tmp_path, text, kind):
    path = tmp_path / "model.txt"
    path.write_text(text)
    assert source_kind(path) == kind


def test_lua_without_suffix_converts(tmp_path):
    path = tmp_path / "model.def"
    path.write_text("require 'nn'\nreturn nn.Sequential():add(nn.ReLU())\n")
    assert load(path, shapes=INPUT).graph.outputs == ["output"]


@pytest.mark.parametrize("content", [b"", b"hello world\n", b"\x89PNG\r\n\x1a\n" + bytes(64),
                                     np.arange(100, dtype="<f4").tobytes()])
def test_unknown_content_is_one_line(tmp_path, content):
    path = tmp_path / "model.caffemodel"
    path.write_bytes(content)
    with pytest.raises(ConvertError) as err:
        load(path)
    one_line(err, path)
