"""Broken and hostile Caffe files: every one is a single line on stderr naming the file (and the
layer, where there is one), exit code 2, and nothing left in the output folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from convert.caffe import binary
from zoo.cli import app

IN = 'input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8\n'
VEC = 'input: "data" input_shape { dim: 4 }\n'


def one(typ: str, params: str = "", bottoms: str = "data", tops: str = "out", name: str = "bad") -> str:
    wires = "".join(f' bottom: "{b}"' for b in bottoms.split()) + "".join(f' top: "{t}"' for t in tops.split())
    return f'layer {{ name: "{name}" type: "{typ}"{wires} {params} }}\n'


POOL = one("Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 2 }", tops="p", name="p")


def conv(params: str, typ: str = "Convolution") -> str:
    return IN + one(typ, f"convolution_param {{ {params} }}")


# name -> (prototxt, text the error line must contain besides the path)
CASES: dict[str, tuple[str | bytes, str]] = {
    "group 0": (conv("num_output: 4 kernel_size: 3 group: 0"), "'bad'"),
    "group not dividing": (conv("num_output: 4 kernel_size: 3 group: 2"), "'bad'"),
    "deconv group 0": (conv("num_output: 4 kernel_size: 3 group: 0", "Deconvolution"), "'bad'"),
    "num_output 0": (conv("num_output: 0 kernel_size: 3"), "'bad'"),
    "kernel 0": (conv("num_output: 4 kernel_size: 0"), "'bad'"),
    "stride 0": (conv("num_output: 4 kernel_size: 3 stride: 0"), "'bad'"),
    "dilation 0": (conv("num_output: 4 kernel_size: 3 dilation: 0"), "'bad'"),
    "negative pad": (conv("num_output: 4 kernel_size: 3 pad: -1"), ":2:"),
    "kernel 2^40": (conv("num_output: 4 kernel_size: 1099511627776"), ":2:"),
    "pad 4e9": (conv("num_output: 4 kernel_size: 3 pad: 4000000000"), "'bad'"),
    "pool stride 0": (IN + one("Pooling", "pooling_param { kernel_size: 2 stride: 0 }"), "'bad'"),
    "pool kernel 10^5": (IN + one("Pooling", "pooling_param { kernel_size: 100000 pad: 99999 }"), "'bad'"),
    "LRN local_size 4e9+1": (IN + one("LRN", "lrn_param { local_size: 4000000001 }"), "'bad'"),
    "Log base 1": (IN + one("Log", "log_param { base: 1 }"), "'bad'"),
    "dropout_ratio 2": (IN + one("Dropout", "dropout_param { dropout_ratio: 2 }"), "'bad'"),
    "crop one bottom": (IN + one("Crop"), "'bad'"),
    "crop missing bottom": (IN + one("Crop", bottoms="data nope"), "'bad'"),
    "prelu no bottom": (IN + one("PReLU", bottoms=""), "'bad'"),
    "prelu two bottoms": (IN + one("PReLU", bottoms="data data"), "'bad'"),
    "eltwise one bottom": (IN + one("Eltwise"), "'bad'"),
    "eltwise unknown bottom": (IN + one("Eltwise", bottoms="data nope"), "'bad'"),
    "concat no bottom": (IN + one("Concat", bottoms=""), "'bad'"),
    "scale three bottoms": (IN + one("Scale", bottoms="data data data"), "'bad'"),
    "relu two tops": (IN + one("ReLU", tops="a b"), "'bad'"),
    "slice no top": (IN + one("Slice", tops=""), "'bad'"),
    "duplicate tops": (IN + one("Split", tops="a a"), "'bad'"),
    "reads its own output": (IN + one("ReLU", bottoms="out"), "'bad'"),
    "top of another layer": (IN + POOL + one("ReLU", tops="p"), "'bad'"),
    "BatchNorm on 1-D": (VEC + one("BatchNorm"), "'bad'"),
    "MVN on 1-D": (VEC + one("MVN"), "'bad'"),
    "reshape copies a missing axis": (IN + one("Reshape", "reshape_param { shape { " + "dim: 0 " * 5 + "} }"), "'bad'"),
    "BatchNorm eps -1": (IN + one("BatchNorm", "batch_norm_param { eps: -1 }"), "'bad'"),
    "batch statistics, eps 0": (IN + one("BatchNorm", "batch_norm_param { use_global_stats: false eps: 0 }"), "'bad'"),
    "negative_slope nan": (IN + one("ReLU", "relu_param { negative_slope: nan }"), "'bad'"),
    "negative_slope inf": (IN + one("ReLU", "relu_param { negative_slope: inf }"), "'bad'"),
    "power -inf": (IN + one("Power", "power_param { shift: -inf }"), "'bad'"),
    "eps 1e400": (IN + one("BatchNorm", "batch_norm_param { eps: 1e400 }"), "'bad'"),
    "filler nan": (IN + one("Scale", "scale_param { filler { value: nan } }"), "'bad'"),
    "coeff nan": (IN + one("Eltwise", "eltwise_param { coeff: nan coeff: 1 }", bottoms="data data"), "'bad'"),
    "threshold nan": (IN + one("Threshold", "threshold_param { threshold: nan }"), "'bad'"),
    "pool enum 7": (IN + one("Pooling", "pooling_param { pool: 7 kernel_size: 2 }"), ":2:"),
    "eltwise enum 9": (IN + one("Eltwise", "eltwise_param { operation: 9 }", bottoms="data data"), ":2:"),
    "V1 type 99": (IN + 'layers { name: "bad" type: 99 bottom: "data" top: "out" }\n', ":2:"),
    "phase 5": (IN + one("ReLU", "include { phase: 5 }"), ":2:"),
    "dim 2^63": ('input: "data" input_shape { dim: 9223372036854775808 }\n' + one("ReLU"), ":1:"),
    "input_dim 2^32": ('input: "data" input_dim: 4294967296\n' + one("ReLU"), ":1:"),
    "num_output 2^32": (conv("num_output: 4294967296 kernel_size: 3"), ":2:"),
    "100000-digit number": (conv("num_output: " + "9" * 100_000 + " kernel_size: 3"), ":2:"),
    "num_output 2^32-1": (conv("num_output: 4294967295 kernel_size: 3"), "'bad'"),
    "3 input_dims": ('input: "data" input_dim: 1 input_dim: 3 input_dim: 8\n' + one("ReLU"), "input_dim"),
    "negative input dim": (IN.replace("dim: 3", "dim: -3") + one("ReLU"), "'data'"),
    "zero input dim": (IN.replace("dim: 1", "dim: 0") + one("ReLU"), "'data'"),
    "2000 input axes": ('input: "data" input_shape { ' + "dim: 1 " * 2000 + "}\n" + one("ReLU"), "'data'"),
    "input declared twice": ('input: "data" input: "data"\n' + one("ReLU"), "'data'"),
    "Input: 3 shapes, 2 tops": ('layer { name: "bad" type: "Input" top: "data" top: "d2" input_param { '
                                "shape { dim: 1 } shape { dim: 2 } shape { dim: 3 } } }\n" + one("ReLU", name="r"),
                                "'bad'"),
    "layer without type": (IN + 'layer { name: "bad" bottom: "data" top: "out" }\n', "'bad': no type given"),
    "V0 padding without top": (IN + 'layers { layer { name: "bad" type: "padding" pad: 1 } bottom: "data" }\n',
                               "'bad'"),
    "V0 group 0": (IN + 'layers { layer { name: "bad" type: "conv" num_output: 4 kernelsize: 3 group: 0 } '
                   'bottom: "data" top: "c" }\n', "'bad'"),
    "deleted brace": (IN + one("Convolution", "convolution_param { num_output: 4 kernel_size: 3 ")
                      + "".join(one("ReLU", bottoms="out", name=f"r{i}") for i in range(60)),
                      "missing before 'layer' at line 3"),
    "empty file": ("", "no layers"),
    "binary garbage": (bytes(range(256)) * 40, ":1:"),
    "no layers": (IN, "no layers"),
    "no inputs": (one("ReLU", bottoms="x"), "'bad'"),
    "10^5 open braces": ("layer " + "{ " * 100_000, ":1:"),
    "10^5 balanced unknown braces": (IN + "foo " + "{ " * 100_000 + "}" * 99_999, ":2:"),
    "markup in names": (IN + one("ReLU", name="[red]x[/x]", bottoms="[/x]"), "'[red]x[/x]'"),
    "markup in a value": (IN + one("ReLU", "relu_param { negative_slope: [/x] }"), ":2:"),
}


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


def _check(runner: CliRunner, tmp_path: Path, args: list[str], path: Path, must: str) -> None:
    out = tmp_path / "out"
    r = runner.invoke(app, [*args, "--out", str(out), "--no-verify"])
    assert not r.exception or isinstance(r.exception, SystemExit), r.exception
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.stderr
    assert str(path) in lines[0] and must in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("case", CASES)
def test_bad_prototxt_is_one_line_exit_2(case: str, tmp_path: Path, runner: CliRunner) -> None:
    body, must = CASES[case]
    path = tmp_path / "net.prototxt"
    path.write_bytes(body.encode() if isinstance(body, str) else body)
    _check(runner, tmp_path, ["convert", str(path)], path, must)


def _conv_blobs(bad: float) -> list[np.ndarray]:
    w = np.ones((4, 3, 3, 3), np.float32)
    w[1, 2, 0, 1] = bad
    return [w, np.zeros(4, np.float32)]


def _bn_blobs(var: float, factor: float) -> list[np.ndarray]:
    return [np.zeros(3, np.float32), np.full(3, var, np.float32), np.array([factor], np.float32)]


# name -> (the layer, its blobs in the caffemodel, text the error line must contain)
WEIGHTS: dict[str, tuple[str, list[np.ndarray], str]] = {
    "NaN weight": (one("Convolution", "convolution_param { num_output: 4 kernel_size: 3 }"), _conv_blobs(np.nan),
                   "'bad' (Convolution): weights contain NaN or Inf"),
    "Inf weight": (one("Convolution", "convolution_param { num_output: 4 kernel_size: 3 }"), _conv_blobs(np.inf),
                   "'bad' (Convolution): weights contain NaN or Inf"),
    "-Inf bias": (one("Convolution", "convolution_param { num_output: 4 kernel_size: 3 }"),
                  [np.ones((4, 3, 3, 3), np.float32), np.full(4, -np.inf, np.float32)], "NaN or Inf"),
    "NaN scale factor": (one("BatchNorm"), _bn_blobs(1, np.nan), "'bad' (BatchNorm): weights contain NaN or Inf"),
    "negative variance": (one("BatchNorm"), _bn_blobs(-1, 1), "'bad' (BatchNorm)"),
    "tiny scale factor": (one("BatchNorm"), _bn_blobs(1, 1e-45), "'bad' (BatchNorm)"),
    "missing blob": (one("PReLU"), [], "'bad' (PReLU): expects 1 blob, 'net.caffemodel' has 0"),
}


@pytest.mark.parametrize("case", WEIGHTS)
def test_bad_weights_name_the_layer(case: str, tmp_path: Path, runner: CliRunner) -> None:
    layer, blobs, must = WEIGHTS[case]
    path = tmp_path / "net.prototxt"
    path.write_text(IN + layer)
    weights = tmp_path / "net.caffemodel"
    binary.write(weights, [("bad", "Layer", blobs)])
    _check(runner, tmp_path, ["convert", str(path), "--weights", str(weights)], path, must)


def test_deleted_brace_gives_no_warnings_first(tmp_path: Path, runner: CliRunner) -> None:
    body, _ = CASES["deleted brace"]
    path = tmp_path / "net.prototxt"
    path.write_text(str(body))
    r = runner.invoke(app, ["info", str(path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "never closed" in r.stderr, r.stderr
