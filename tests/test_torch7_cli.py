"""The zoo command on Torch7 files: a .t7 converts with --input-shape; a user's mistake (truncated
file, not a .t7, an unknown class, no input shape) is one line, exit code 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from convert.torch7.t7file import TorchObject
from convert.torch7.t7write import dump
from zoo.cli import app

runner = CliRunner()
R = np.random.default_rng(3)


def M(cls: str, **fields: object) -> TorchObject:
    return TorchObject(cls, dict(fields), 1)


def w(*shape: int) -> np.ndarray:
    return (R.standard_normal(shape) * 0.2).astype(np.float32)  # moderate logits


def small_net() -> TorchObject:
    """conv 3->4 (pad 1), ReLU, 2x2 max pool, View(-1) per sample, Linear 64->10, LogSoftMax."""
    mods = [M("nn.SpatialConvolution", nInputPlane=3, nOutputPlane=4, kW=3, kH=3, dW=1, dH=1, padW=1,
              padH=1, weight=w(4, 3, 3, 3), bias=w(4)),
            M("nn.ReLU", threshold=0, val=0),
            M("nn.SpatialMaxPooling", kW=2, kH=2, dW=2, dH=2, padW=0, padH=0, ceil_mode=False),
            M("nn.View", size=np.array([-1]), numInputDims=3),
            M("nn.Linear", weight=w(10, 64), bias=w(10)),
            M("nn.LogSoftMax")]
    return M("nn.Sequential", modules={i + 1: m for i, m in enumerate(mods)})


def zoo(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def test_convert_a_t7(tmp_path: Path) -> None:
    src = tmp_path / "x.t7"
    dump(small_net(), src)
    r = zoo("convert", str(src), "--input-shape", "input=1,3,8,8", "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    d = tmp_path / "out" / "x"
    assert {p.name for p in d.iterdir()} >= {"model.onnx", "model.py", "model.safetensors", "convert.json"}
    info = json.loads((d / "convert.json").read_text())
    assert info["framework"] == "torch7" and info["inputs"] == {"input": [1, 3, 8, 8]}
    assert info["outputs"] == ["output"] and info["status"] == "verified"
    for backend in ("pytorch", "onnxruntime", "opencv"):
        assert info["verification"]["backends"][backend]["max_rel"] <= 1e-4
    r = zoo("verify", str(d))  # re-verification finds the original .t7 again
    assert r.exit_code == 0 and "opencv" in r.output, r.output


@pytest.mark.parametrize("kind,message", [
    ("truncated", "x.t7: unexpected end of file at byte"),
    ("garbage", "x.t7: not a Torch7 file (unknown type tag"),
    ("unknown", "nn.Foo ('2'); nn.Bar ('3.1')"),
    ("no-shape", "x.t7: a Torch7 model does not record its input size; give it with --input-shape"),
    ("bad-shape", "--input-shape names 'data', but a Torch7 model's input is called 'input'"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, kind: str, message: str) -> None:
    src = tmp_path / "x.t7"
    net = small_net()
    if kind == "unknown":
        net.fields["modules"][2] = M("nn.Foo")
        net.fields["modules"][3] = M("nn.Sequential", modules={1: M("nn.Bar")})
    dump(net, src)
    if kind == "truncated":
        src.write_bytes(src.read_bytes()[:600])
    elif kind == "garbage":
        src.write_bytes(b"PK\x03\x04 this is a zip, not a Torch7 file" * 4)
    shape = {"no-shape": [], "bad-shape": ["--input-shape", "data=1,3,8,8"]}.get(
        kind, ["--input-shape", "input=1,3,8,8"])
    out = tmp_path / "out"
    r = zoo("convert", str(src), *shape, "--out", str(out))
    assert r.exit_code == 2, r.output
    assert message in r.output
    if kind == "unknown":
        assert "unsupported torch7 module class" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_one_value_output_twice_in_a_table(tmp_path: Path) -> None:
    """A table output holding the same computed value twice: both outputs, not a KeyError."""
    lua = tmp_path / "twice.lua"
    lua.write_text("local m = nn.Sequential()\nm:add(nn.SpatialConvolution(3, 4, 3, 3))\n"
                   "local t = nn.ConcatTable()\nt:add(nn.Identity())\nt:add(nn.Identity())\n"
                   "m:add(t)\nreturn m\n")
    r = CliRunner().invoke(app, ["convert", str(lua), "--out", str(tmp_path / "o"), "--input-shape", "input=1,3,8,8"])
    assert r.exit_code == 0, r.output
    info = json.loads((tmp_path / "o" / "twice" / "convert.json").read_text())
    assert info["outputs"] == ["output1", "output2"] and info["status"] == "verified"
