"""The zoo command: what users see, exit codes, one-line errors, nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoo.cli import app

runner = CliRunner()
NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 12 input_dim: 12
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
'''


def zoo(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def test_convert_writes_the_artifact_contract(tmp_path: Path) -> None:
    src = tmp_path / "tiny.prototxt"
    src.write_text(NET)
    r = zoo("convert", str(src), "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    d = tmp_path / "out" / "tiny"
    assert {p.name for p in d.iterdir()} >= {"model.onnx", "model.py", "model.safetensors", "convert.json"}
    info = json.loads((d / "convert.json").read_text())
    assert info["inputs"] == {"data": [1, 3, 12, 12]} and info["outputs"] == ["prob"]
    assert info["status"] == "verified"
    for backend in ("pytorch", "onnxruntime"):
        m = info["verification"]["backends"][backend]
        assert m["max_rel"] <= 1e-4 and "rel_l2" in m and m["top1"] == 1.0
    # model.py stands alone: a fresh interpreter imports it with only torch and safetensors
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import model; net = model.load(); "
            "print(tuple(net(torch.zeros(1, 3, 12, 12)).shape), net.training)")
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(1, 10) False"
    code = (d / "model.py").read_text()
    assert "import math" not in code or "math." in code.replace("import math", "")  # no unused import
    r = zoo("verify", str(d))
    assert r.exit_code == 0 and "verified" in r.output


def test_input_shape_option(tmp_path: Path) -> None:
    src = tmp_path / "tiny.prototxt"
    src.write_text(NET)
    r = zoo("convert", str(src), "--out", str(tmp_path), "--input-shape", "data=2,3,16,16", "--no-verify")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "tiny" / "convert.json").read_text())["inputs"]["data"] == [2, 3, 16, 16]


@pytest.mark.parametrize("args,message", [
    (["convert", "missing.prototxt"], "missing.prototxt: neither a file nor a zoo model"),
    (["convert", "{src}", "--input-shape", "data=1,3,x"], "expected NAME=N,C,H,W"),
    (["convert", "{src}", "--input-shape", "data=1,3,2,2"], "layer 'conv' (Convolution): kernel [3, 3] does not fit"),
    (["convert", "{src}", "--weights", "{tmp}/none.caffemodel"], "no such weights file"),
    (["convert", "{bad}"], "bad.prototxt:1:"),
    (["convert", "{src}", "--weights", "{junk}"], "truncated or not a caffemodel"),
    (["info", "nonsense"], "neither a file nor a zoo model"),
    (["verify", "{tmp}"], "not a zoo artifact directory"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    src = tmp_path / "tiny.prototxt"
    src.write_text(NET)
    (tmp_path / "bad.prototxt").write_text("layer { name: 'a' type: ")
    (tmp_path / "junk.caffemodel").write_bytes(b"\xff" * 64)
    fill = {"src": str(src), "tmp": str(tmp_path), "bad": str(tmp_path / "bad.prototxt"),
            "junk": str(tmp_path / "junk.caffemodel")}
    out = tmp_path / "out"
    r = zoo(*[a.format(**fill) for a in args], *(["--out", str(out)] if args[0] == "convert" else []))
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_error_is_one_line_on_stderr_from_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "bad.prototxt").write_text("layer {\n name: @ }")
    p = subprocess.run([sys.executable, "-m", "zoo.cli", "convert", str(tmp_path / "bad.prototxt"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'bad.prototxt'}:2:8:")
    assert not (tmp_path / "o").exists()


def test_mismatch_exits_1_and_names_the_layer(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A deliberately wrong PyTorch emission must be caught and located."""
    from convert.ops.act import Simple

    src = tmp_path / "net.prototxt"
    src.write_text(NET.replace('type: "ReLU"', 'type: "Sigmoid"'))
    monkeypatch.setitem(Simple.TORCH, "sigmoid", "torch.tanh")
    r = zoo("convert", str(src), "--out", str(tmp_path / "o"))
    assert r.exit_code == 1
    assert "first divergence: layer 'relu' (pytorch)" in r.output
    info = json.loads((tmp_path / "o" / "net" / "convert.json").read_text())
    assert info["status"] == "mismatch"  # artifacts kept, marked
    assert info["verification"]["first_divergence"]["layer"] == "relu"


def test_list_and_info() -> None:
    r = zoo("list")
    assert r.exit_code == 0 and "resnet50" in r.output and "25.6M" in r.output and "3.86G" in r.output
    r = zoo("info", "alexnet")
    assert r.exit_code == 0 and "60,965,224" in r.output and "724M per image" in r.output
