"""The zoo's own definitions: parameter counts and multiply-adds match the published facts
(DESIGN.md) within 0.5%, and every model converts and verifies (at reduced input sizes here; the
full sizes are ``zoo convert --all``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from convert.api import convert
from zoo.catalogue import CAFFE, CATALOGUE, LUA_ENTRIES
from zoo.pipeline import convert_target, describe, resolve

# name: (GMACs per image at the catalogue's input size, parameters in millions)
FACTS = {"alexnet": (0.724, 60.97), "googlenet": (1.583, 7.00), "vgg16": (15.47, 138.36),
         "vgg19": (19.63, 143.67), "resnet18": (1.814, 11.69), "resnet34": (3.664, 21.80),
         "resnet50": (3.858, 25.56), "resnet101": (7.570, 44.55), "resnet152": (11.282, 60.19)}

# Smaller inputs for the test suite (global pooling / fully connected sizes adapt).
SMALL_INPUT = {"vgg-a": 64, "vgg16": 64, "vgg19": 64, "overfeat-fast": 119, "alexnet-owt": 127,
               "resnet18": 64, "resnet34": 64, "resnet50": 64, "resnet101": 64, "resnet152": 64,
               "resnet200": 64, "alexnet": 227, "googlenet": 224}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_params_and_macs_match_the_facts(name: str) -> None:
    g = describe(resolve(name))
    gmacs, mparams = FACTS[name]
    assert abs(g.macs() / 1e9 - gmacs) / gmacs < 0.005
    assert abs(g.param_count() / 1e6 - mparams) / mparams < 0.005


def test_every_zoo_model_is_tested() -> None:
    assert {e.name for e in CAFFE} <= set(SMALL_INPUT)
    assert all(e.source.is_file() for e in CATALOGUE.values())


@pytest.mark.parametrize("name", [e.name for e in CAFFE])
def test_zoo_model_converts_and_verifies(name: str, tmp_path: Path, disk_heavy: None) -> None:
    e = CATALOGUE[name]
    hw = SMALL_INPUT[name]
    res = convert(e.source, out=tmp_path, shapes={"data": (1, 3, hw, hw)})
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified", v
    assert v["opencv"].get("ok") is True, v["opencv"]  # the zoo uses only layers OpenCV reads
    assert v["pytorch"]["top1"] == 1.0 and v["onnxruntime"]["top1"] == 1.0


# The Lua definitions (Torch7 style) against the Caffe definitions of the same networks. ResNet-50
# to 152 differ in multiply-adds only: fb.resnet.torch strides the 3x3 convolution of a bottleneck,
# KaimingHe's Caffe release the first 1x1 (4.089 vs 3.858 G for ResNet-50).
SAME_AS = {"alexnet-owt-lua": "alexnet-owt", "overfeat-fast-lua": "overfeat-fast", "vgg-a-lua": "vgg-a",
           "googlenet-lua": "googlenet", **{f"resnet{d}-lua": f"resnet{d}" for d in (18, 34, 50, 101, 152, 200)}}
LUA_MACS = {"resnet50-lua": 4.089, "resnet101-lua": 7.801, "resnet152-lua": 11.514}


@pytest.mark.parametrize("name", sorted(SAME_AS))
def test_lua_definitions_match_the_caffe_ones(name: str) -> None:
    lua, caffe = describe(resolve(name)), describe(resolve(SAME_AS[name]))
    assert lua.param_count() == caffe.param_count()
    if name in LUA_MACS:
        assert abs(lua.macs() / 1e9 - LUA_MACS[name]) < 0.001
    else:
        assert lua.macs() == caffe.macs()


def test_every_lua_entry_is_compared() -> None:
    assert {e.name for e in LUA_ENTRIES} == set(SAME_AS)


# Lua definitions fix their fully connected sizes (nn.View(256*6*6)), so they run at full size;
# the heavier ones are left to `zoo convert --all`.
@pytest.mark.parametrize("name", ["alexnet-owt-lua", "googlenet-lua", "resnet18-lua", "resnet50-lua"])
def test_lua_model_converts_and_verifies(name: str, tmp_path: Path, disk_heavy: None) -> None:
    res = convert_target(resolve(name), out=tmp_path)
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified", v
    assert res.report["inputs"] == {"input": [1, 3, 224, 224]} and res.report["outputs"] == ["output"]
    assert v["pytorch"]["top1"] == 1.0
