"""Caffe text format: every format generation and input declaration, phase filtering, in-place and
shared blobs, fork-specific fields, and the error messages users see."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus

from convert.api import convert, load
from convert.caffe import text
from convert.caffe.schema import SCHEMA, message_class
from convert.errors import BadModel, ConvertError, Unsupported

CONV = 'convolution_param { num_output: 4 kernel_size: 3 }'


def write(tmp_path: Path, body: str, name: str = "net.prototxt") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def signature(path: Path) -> tuple:
    g = load(path).graph
    return (tuple(g.inputs.values()), tuple(n.op for n in g.nodes), g.param_count(), g.macs())


@pytest.mark.parametrize("decl", [
    'input: "data" input_dim: 1 input_dim: 3 input_dim: 9 input_dim: 11',
    'input: "data" input_shape { dim: 1 dim: 3 dim: 9 dim: 11 }',
    'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 9 dim: 11 } } }',
])
def test_every_input_declaration(tmp_path: Path, decl: str) -> None:
    p = write(tmp_path, decl + f'\nlayer {{ name: "c" type: "Convolution" bottom: "data" top: "c" {CONV} }}')
    g = load(p).graph
    assert g.inputs == {"data": (1, 3, 9, 11)} and g.shapes["c"] == (1, 4, 7, 9)


def test_one_dummy_data_shape_serves_every_top(tmp_path: Path) -> None:
    p = write(tmp_path, '''layer { name: "d" type: "DummyData" top: "a" top: "b"
  dummy_data_param { shape { dim: 1 dim: 3 dim: 4 dim: 4 } } }
layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" top: "c" }''')
    assert load(p).graph.inputs == {"a": (1, 3, 4, 4), "b": (1, 3, 4, 4)}


def test_v0_v1_v2_give_the_same_network() -> None:
    v0 = corpus("realworld", "BVLC", "caffe@2e330581c", "examples", "imagenet", "imagenet_deploy.prototxt")
    v1 = corpus("realworld", "BVLC", "caffe@1fbb5bb3c", "examples", "imagenet", "imagenet_deploy.prototxt")
    v2 = corpus("realworld", "BVLC", "caffe", "models", "bvlc_reference_caffenet", "deploy.prototxt")
    assert signature(v0) == signature(v1)
    assert signature(v1)[1:] == signature(v2)[1:]  # V2's CaffeNet deploy takes the same ops


def test_test_phase_filtering(tmp_path: Path) -> None:
    p = write(tmp_path, '''input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "train_only" type: "Dropout" bottom: "data" top: "data" include { phase: TRAIN } }
layer { name: "not_test" type: "ReLU" bottom: "data" top: "data" exclude { phase: TEST } }
layer { name: "staged" type: "Sigmoid" bottom: "data" top: "data" include { stage: "deploy" } }
layer { name: "kept" type: "TanH" bottom: "data" top: "out" include { phase: TEST } }''')
    g = load(p).graph
    assert [n.name for n in g.nodes] == ["kept"]


def test_in_place_shared_blobs_and_duplicate_names(tmp_path: Path) -> None:
    p = write(tmp_path, f'''input: "data" input_dim: 2 input_dim: 3 input_dim: 8 input_dim: 8
layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" {CONV} }}
layer {{ name: "relu" type: "ReLU" bottom: "c" top: "c" }}
layer {{ name: "relu" type: "TanH" bottom: "c" top: "c" }}
layer {{ name: "a" type: "Sigmoid" bottom: "c" top: "a" }}
layer {{ name: "b" type: "AbsVal" bottom: "c" top: "b" }}
layer {{ name: "sum" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "sum" }}''')
    res = convert(p, out=tmp_path / "out")
    assert res.report["status"] == "verified"
    g = load(p).graph
    assert g.outputs == ["sum"]
    assert [n.outputs[0] for n in g.nodes[:3]] == ["c@1", "c@2", "c"]  # last write keeps the name


def test_fork_fields_warn_with_line_or_take_their_meaning(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    p = write(tmp_path, '''input: 'data'; input_dim: 1; input_dim: 3; input_dim: 7; input_dim: 7;
layer { name: "p" type: "Pooling" bottom: "data" top: "p"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 ceil_mode: false } }
layer { name: "r" type: "ReLU" bottom: "p" top: "p" engine: CAFFE mystery_field: 3
  relu_param { engine: INTEL } }''')
    with caplog.at_level(logging.INFO):
        g = load(p).graph
    assert g.shapes["p"] == (1, 3, 3, 3)  # ceil_mode: false = FLOOR (ceil would give 4x4)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "net.prototxt:4:" in messages and "mystery_field" in messages
    assert "INTEL" in messages


def test_warnings_wait_for_a_successful_parse(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    relus = "".join(f'layer {{ name: "r{i}" type: "ReLU" bottom: "c" top: "c" }}\n' for i in range(20))
    p = write(tmp_path, f'input: "data"\nlayer {{ name: "c" type: "Convolution" {CONV}\n{relus}')  # '}' deleted
    with caplog.at_level(logging.INFO), pytest.raises(BadModel, match="missing before 'layer' at line 3"):
        load(p)
    assert not caplog.records


def test_weights_inside_the_prototxt_are_named_and_left_out(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    p = write(tmp_path, f'''input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" {CONV} blobs {{ data: 1 }} }}''')
    with caplog.at_level(logging.WARNING):
        assert load(p).graph.shapes["c"] == (1, 4, 6, 6)
    assert "inside the prototxt (layer 'c')" in caplog.text


def test_v2_param_block_inside_a_v1_layer(tmp_path: Path) -> None:
    p = write(tmp_path, f'''input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layers {{ name: "c" type: CONVOLUTION bottom: "data" top: "c" param {{ lr_mult: 0 }} {CONV} }}''')
    assert load(p).graph.shapes["c"] == (1, 4, 6, 6)


@pytest.mark.parametrize("body,where,what", [
    ('name: "x"\nlayer { name: "a" type: "ReLU" bottom: "data" top: "b" ', "2:56",
     "'{' at line 2, column 7 is never closed"),
    ('input: "data"\ninput_dim: 1.5', "2:12", "expected an integer"),
    ('layer {\n  name: "a"\n  type: "Pooling" pooling_param { pool: MEDIAN } }', "3:41", "expected one of MAX"),
    ('layer { name "a" }', "1:14", "expected ':'"),
    ('layer { name: "a" } }', "1:21", "expected a field name"),
    ('layer { name: "a" bottom: { } }', "1:27", "bad value"),
    ('layer { name: "a" @ }', "1:19", "unexpected character"),
])
def test_malformed_prototxt_names_line_and_column(tmp_path: Path, body: str, where: str, what: str) -> None:
    p = write(tmp_path, body)
    with pytest.raises(BadModel) as e:
        load(p)
    assert str(e.value).startswith(f"{p}:{where}: ") and what in str(e.value)


def test_unsupported_layers_are_all_listed(tmp_path: Path) -> None:
    p = write(tmp_path, '''input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "a" type: "Frobnicate" bottom: "data" top: "a" }
layer { name: "b" type: "Frobnicate" bottom: "a" top: "b" }
layer { name: "c" type: "Quux" bottom: "b" top: "c" }''')
    with pytest.raises(Unsupported) as e:
        load(p)
    assert "Frobnicate ('a', 'b'); Quux ('c')" in str(e.value)


def test_invalid_shapes_name_the_layer(tmp_path: Path) -> None:
    p = write(tmp_path, f'''input: "data" input_dim: 1 input_dim: 3 input_dim: 2 input_dim: 2
layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" {CONV} }}''')
    with pytest.raises(BadModel, match=r"layer 'c' \(Convolution\): kernel \[3, 3\] does not fit input 2x2"):
        load(p)
    with pytest.raises(ConvertError, match="--input-shape names 'image'"):
        load(p, shapes={"image": (1, 3, 8, 8)})
    assert load(p, shapes={"data": (1, 3, 8, 8)}).graph.shapes["c"] == (1, 4, 6, 6)


def test_missing_input_shape_is_asked_for(tmp_path: Path) -> None:
    p = write(tmp_path, '''layer { name: "d" type: "Data" top: "data" top: "label" data_param { batch_size: 4 } }
layer { name: "r" type: "ReLU" bottom: "data" top: "r" }''')
    with pytest.raises(BadModel, match="--input-shape data=N,C,H,W"):
        load(p)


def test_our_schema_builds_real_protobuf_classes() -> None:
    """The runtime descriptor parses the same text as our own reader (protobuf's parser as a check)."""
    from google.protobuf import text_format

    src = corpus("realworld", "BVLC", "caffe", "models", "bvlc_googlenet", "deploy.prototxt")
    ours = text.read(src)
    theirs = text_format.Parse(src.read_text(), message_class("NetParameter")())
    assert [L.name for L in ours.layer] == [L.name for L in theirs.layer]
    assert [L.convolution_param.num_output for L in ours.layer] == \
        [L.convolution_param.num_output for L in theirs.layer]
    assert SCHEMA.messages["LayerParameter"].fields["convolution_param"].number == 106


def test_numbers_and_strings_in_every_spelling(tmp_path: Path) -> None:
    msg = text.parse("""name: 'a\\'b' input: "x" input_dim: 1 input_dim: 2
layer { name: "s" type: "Power" power_param { power: 2. scale: .5 shift: -1e-1 } }""", "t")
    assert msg.name == "a'b"
    pp = msg.layer[0].power_param
    assert (pp.power, pp.scale, pp.shift) == (2.0, 0.5, -0.1)
    assert np.isclose(msg.layer[0].power_param.shift, -0.1)
