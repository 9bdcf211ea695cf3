"""`zoo list`'s figures: the built-in zoo's ship with the package (zoo/zoo-list.json) and must equal what
the converter computes; anything else is computed without weights and kept in the user's cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from convert.torch7 import frontend as t7
from zoo import catalogue

pytest.importorskip("lupa")

NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 12 input_dim: 12
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 10 } }
'''
LUA = '''local m = nn.Sequential()
m:add(nn.SpatialConvolution(3, 8, 3, 3, 1, 1, 1, 1))
m:add(nn.SpatialBatchNormalization(8))
m:add(nn.ReLU(true))
m:add(nn.SpatialMaxPooling(2, 2, 2, 2))
m:add(nn.View(8 * 3 * 3))
m:add(nn.Linear(8 * 3 * 3, 10))
return m
'''


def test_the_shipped_figures_are_the_converters() -> None:
    shipped = json.loads(catalogue.STATIC.read_text())["models"]
    assert list(shipped) == list(catalogue.CATALOGUE), f"zoo/zoo-list.json is stale: {catalogue.REGENERATE}"
    for e in catalogue.CATALOGUE.values():
        assert shipped[e.name]["key"] == catalogue._key(e), \
            f"{e.source} or its arguments changed: regenerate zoo/zoo-list.json with {catalogue.REGENERATE}"
        computed = {"key": catalogue._key(e), **catalogue._figures(e)}
        assert shipped[e.name] == computed, \
            f"{e.name}: the converter now computes other figures: regenerate with {catalogue.REGENERATE}"
    figures = {n: (f["params"], f["macs"]) for n, f in shipped.items()}  # DESIGN.md's facts
    assert figures["alexnet"] == (60_965_224, 724_406_816)
    assert figures["vgg16"] == (138_357_544, 15_470_264_320)
    assert figures["resnet50"] == (25_557_032, 3_857_973_248)


def test_zoo_list_on_a_fresh_clone_imports_no_converter(tmp_path: Path) -> None:
    """The built-in zoo's figures come from the shipped file: no converter, torch or ONNX, no cache."""
    code = ("import sys; from pathlib import Path; from zoo.catalogue import list_rows; "
            "rows = list_rows(Path(sys.argv[1]) / 'models', Path(sys.argv[1]) / 'cache.json'); "
            "print(len(rows), sorted({m.split('.')[0] for m in sys.modules} & {'convert', 'torch', 'onnx', 'lupa'}))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(catalogue.CATALOGUE)), "[]"]
    assert not (tmp_path / "cache.json").exists()


def test_a_definition_the_shipped_figures_do_not_cover_is_computed_and_cached(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    edited = tmp_path / "alexnet.prototxt"  # the user edited a built-in definition
    edited.write_text(NET)
    monkeypatch.setattr(catalogue, "CATALOGUE", {"alexnet": catalogue.Entry("alexnet", edited, (3, 12, 12))})
    cache = tmp_path / "cache.json"
    (row,) = catalogue.list_rows(tmp_path / "models", cache)
    assert (row["params"], row["macs"]) == (4 * 27 + 4 + 4 * 100 * 10 + 10, 4 * 27 * 100 + 4000)
    assert json.loads(cache.read_text())["alexnet"]["params"] == row["params"]
    monkeypatch.setattr(catalogue, "_figures", lambda e: pytest.fail("recomputed although cached"))
    assert catalogue.list_rows(tmp_path / "models", cache) == [row]


def test_regenerate_writes_figures_that_list_uses(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "tiny.prototxt"
    source.write_text(NET)
    monkeypatch.setattr(catalogue, "CATALOGUE", {"tiny": catalogue.Entry("tiny", source, (3, 12, 12))})
    static = tmp_path / "zoo-list.json"
    catalogue.regenerate(static)
    monkeypatch.setattr(catalogue, "_figures", lambda e: pytest.fail("computed although shipped"))
    monkeypatch.setattr(catalogue, "_code_key", lambda: pytest.fail("hashed the converter although shipped"))
    (row,) = catalogue.list_rows(tmp_path / "models", tmp_path / "cache.json", static)
    assert row["params"] == 4 * 27 + 4 + 4 * 100 * 10 + 10
    source.write_text(NET.replace("num_output: 10", "num_output: 20"))  # the key no longer matches
    with pytest.raises(pytest.fail.Exception, match="hashed the converter"):
        catalogue.list_rows(tmp_path / "models", tmp_path / "cache.json", static)


def test_a_lua_definition_shapes_only_allocates_no_weights_and_gives_the_same_figures(tmp_path: Path) -> None:
    path = tmp_path / "m.lua"
    path.write_text(LUA)
    shapes = {"input": (1, 3, 6, 6)}
    sized, seeded = t7.load(path, shapes, None, {}).graph, t7.load(path, shapes, 0, {}).graph
    assert sized.shapes == seeded.shapes and list(sized.weights) == list(seeded.weights)
    assert (sized.param_count(), sized.macs()) == (seeded.param_count(), seeded.macs()) == \
        (8 * 27 + 8 + 8 + 8 + 72 * 10 + 10, 8 * 27 * 36 + 720)
    w = sized.weights[next(k for k in sized.weights if k.endswith(".weight"))]
    assert w.shape == (8, 3, 3, 3) and not any(w.strides) and not w.flags.writeable  # one value, no memory
    assert np.std(seeded.weights[next(k for k in seeded.weights if k.endswith(".weight"))]) > 0
