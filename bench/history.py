"""Importer of the original cnn-benchmarks (Torch7) result files into zoo's results schema.

A cnn-benchmarks file is one model on one machine: ``forward_times``, ``backward_times``,
``total_times`` (seconds per pass, the first of 11 passes already dropped), ``gpu_name``,
``cudnn_version`` (an int, or "none") and ``opt`` (model_t7, batch_size, image_height, image_width,
num_passes, gpu (-1: the CPU), use_cudnn). Each becomes a schema-version-1 document with one row,
so reports and comparisons treat the historical numbers like a new run.

The seeds' published tables (the cnn-benchmarks and convnet-benchmarks READMEs) are not shipped
here: the corpus copy holds the raw output files only, not the READMEs, so there is no reliable
source in it for those numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from .results import SCHEMA_VERSION, ResultsError, validate
from .stats import summarize

PROTOCOL = "cnn-benchmarks"
_REQUIRED = ("forward_times", "backward_times", "gpu_name", "opt")
_OPT = ("model_t7", "batch_size", "image_height", "image_width")


def is_cnn_benchmarks(doc: Any) -> bool:
    return isinstance(doc, dict) and "forward_times" in doc and isinstance(doc.get("opt"), dict)


def model_name(model_t7: str) -> str:
    """The zoo's name of the network: 'models/resnets/resnet-50.t7' -> 'resnet50-lua' (the seeds'
    ResNets are fb.resnet.torch's, whose bottleneck strides the 3x3 convolution: zoo's Torch-style
    definition, not KaimingHe's Caffe one), 'vgg16.t7' -> 'vgg16' (converted from the Caffe release),
    'googlenet-v1.t7' -> 'googlenet'; anything else keeps its stem (lower case)."""
    stem = PurePosixPath(str(model_t7).replace("\\", "/")).name.lower()
    stem = stem[:-3] if stem.endswith(".t7") else stem
    if stem.startswith("googlenet") or re.fullmatch(r"inception([-_]?v1)?", stem):
        return "googlenet"  # Inception v1 is GoogLeNet; later Inception versions are other nets
    m = re.fullmatch(r"(resnet|vgg)[-_]?(\d+)", stem)
    return (f"resnet{m[2]}-lua" if m[1] == "resnet" else f"vgg{m[2]}") if m else stem


def _times_ms(raw: dict[str, Any], name: str, where: str) -> list[float]:
    t = raw.get(name)
    if not isinstance(t, list) or not t or not all(isinstance(x, (int, float)) and x > 0 for x in t):
        raise ResultsError(f"{where}: {name} must be a non-empty list of positive seconds")
    return [1000.0 * x for x in t]


def _check(raw: Any, where: str) -> None:
    if not is_cnn_benchmarks(raw):
        raise ResultsError(f"{where}: not a cnn-benchmarks result file")
    missing = [k for k in _REQUIRED if k not in raw] + [f"opt.{k}" for k in _OPT if k not in raw["opt"]]
    if missing:
        raise ResultsError(f"{where}: cnn-benchmarks file lacks {', '.join(missing)}")


def to_row(raw: dict[str, Any], where: str = "cnn-benchmarks") -> dict[str, Any]:
    """One results row (schema version 1) from a cnn-benchmarks file's content."""
    _check(raw, where)
    opt = raw["opt"]
    fwd, bwd = _times_ms(raw, "forward_times", where), _times_ms(raw, "backward_times", where)
    batch = int(opt["batch_size"])
    on_gpu = int(opt.get("gpu", 0)) >= 0 and raw["gpu_name"] != "cpu"
    forward, backward = summarize(fwd), summarize(bwd)
    total_ms = forward["median_ms"] + backward["median_ms"]  # as zoo's worker computes it
    return {
        "model": model_name(opt["model_t7"]), "source_format": "torch7",
        "runtime": "torch7-cudnn" if int(opt.get("use_cudnn", 0)) else "torch7-nn",
        "device": f"cuda:{int(opt.get('gpu', 0))}" if on_gpu else "cpu",
        "precision": "fp32", "layout": "nchw", "batch": batch, "mode": "training", "protocol": PROTOCOL,
        "status": "ok", "input_shapes": {"data": [batch, 3, int(opt["image_height"]), int(opt["image_width"])]},
        "forward": forward, "backward": backward, "images_per_s": batch / total_ms * 1000.0,
        "gflops_per_image": None, "achieved_tflops": None, "pct_of_peak": None,
        "source_file": where,
    }


def to_env(raw: dict[str, Any]) -> dict[str, Any]:
    """What the file tells of its machine: the GPU's name and the cuDNN version (nothing of the CPU)."""
    env: dict[str, Any] = {"origin": PROTOCOL}
    cudnn = raw.get("cudnn_version")
    if raw.get("gpu_name") != "cpu" and int(raw["opt"].get("gpu", 0)) >= 0:
        env["gpu"] = {"name": raw["gpu_name"], "cudnn": cudnn if isinstance(cudnn, int) else None}
    return env


def to_document(raw: Any, where: str = "cnn-benchmarks") -> dict[str, Any]:
    _check(raw, where)
    doc = {"schema_version": SCHEMA_VERSION, "env": to_env(raw), "rows": [to_row(raw, where)]}
    return validate(doc, where)


def read_any(path: Path) -> dict[str, Any]:
    """A zoo results file or a cnn-benchmarks file (auto-detected), as a results document."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultsError(f"{path}: is a directory, not a results file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path}: not readable as JSON ({type(e).__name__})") from None
    if is_cnn_benchmarks(doc):
        return to_document(doc, str(path))
    if isinstance(doc, dict) and ("rows" in doc or "schema_version" in doc):
        return validate(doc, str(path))
    raise ResultsError(f"{path}: neither a zoo results file (schema_version, env, rows) "
                       f"nor a cnn-benchmarks result (forward_times, opt)")
