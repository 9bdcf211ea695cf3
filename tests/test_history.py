"""The cnn-benchmarks importer: every historical result file of the corpus loads into the results
schema, with values that match the raw JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS, corpus, corpus_files
from typer.testing import CliRunner

from bench import history, report
from bench.results import ResultsError, validate
from bench.stats import summarize
from zoo.cli import app

OUTPUTS = "seeds/cnn-benchmarks/outputs"
FILES = corpus_files(OUTPUTS, "*.json")
RAW = {"forward_times": [0.0863, 0.0862, 0.0864], "backward_times": [0.1094, 0.1095, 0.1093],
       "total_times": [0.1957, 0.1957, 0.1957], "gpu_name": "GeForce GTX 1080 Ti", "cudnn_version": 5110,
       "opt": {"gpu": 0, "num_passes": 3, "model_t7": "models/resnets/resnet-34.t7", "batch_size": 16,
               "image_height": 224, "image_width": 224, "use_cudnn": 1, "output_json": "outputs/x.json"}}


@pytest.mark.parametrize("name, want", [
    ("models/resnets/resnet-50.t7", "resnet50-lua"), ("models/vgg16/vgg16.t7", "vgg16"), ("vgg-19.t7", "vgg19"),
    ("models/alexnet/alexnet.t7", "alexnet"), ("models/googlenet/googlenet-v1.t7", "googlenet"),
    ("inception.t7", "googlenet"), ("inception-v3.t7", "inception-v3"), ("models/My-Net.t7", "my-net"),
])
def test_model_names(name: str, want: str) -> None:
    assert history.model_name(name) == want


def test_a_gpu_file_becomes_one_row() -> None:
    doc = history.to_document(RAW, "x.json")
    (r,) = doc["rows"]
    assert (r["model"], r["runtime"], r["device"], r["precision"], r["mode"], r["protocol"], r["batch"]) == \
        ("resnet34-lua", "torch7-cudnn", "cuda:0", "fp32", "training", "cnn-benchmarks", 16)
    assert r["forward"]["median_ms"] == pytest.approx(86.3) and r["forward"]["n"] == 3
    assert r["backward"]["samples_ms"] == pytest.approx([109.4, 109.5, 109.3])
    assert r["images_per_s"] == pytest.approx(16 / (0.0863 + 0.1094))
    assert doc["env"]["gpu"] == {"name": "GeForce GTX 1080 Ti", "cudnn": 5110}


def test_a_cpu_file_and_no_cudnn() -> None:
    raw = {**RAW, "gpu_name": "cpu", "cudnn_version": "none", "opt": {**RAW["opt"], "gpu": -1, "use_cudnn": 0}}
    doc = history.to_document(raw)
    assert doc["rows"][0]["device"] == "cpu" and doc["rows"][0]["runtime"] == "torch7-nn"
    assert "gpu" not in doc["env"]


@pytest.mark.parametrize("broken, message", [
    ({"forward_times": []}, "forward_times must be a non-empty list"),
    ({"backward_times": [0.1, -1]}, "backward_times must be"),
    ({"opt": {"gpu": 0}}, "lacks opt.model_t7"),
])
def test_broken_files_raise_one_line(broken: dict, message: str) -> None:
    with pytest.raises(ResultsError, match=message):
        history.to_document({**RAW, **broken}, "x.json")


def test_read_any_detects_both_kinds(tmp_path: Path) -> None:
    p = tmp_path / "h.json"
    p.write_text(json.dumps(RAW))
    assert history.read_any(p)["rows"][0]["protocol"] == "cnn-benchmarks"
    p.write_text(json.dumps(history.to_document(RAW)))
    assert history.read_any(p)["rows"][0]["model"] == "resnet34-lua"
    p.write_text("{}")
    with pytest.raises(ResultsError, match="neither a zoo results file"):
        history.read_any(p)


@pytest.mark.skipif(not FILES, reason=f"corpus not available: {CORPUS / OUTPUTS}")
def test_every_corpus_file_loads() -> None:
    assert len(FILES) == 129
    models, devices = set(), set()
    for f in FILES:
        doc = validate(history.read_any(f), str(f))
        (r,) = doc["rows"]
        models.add(r["model"])
        devices.add(r["device"])
        assert r["forward"]["n"] == 10 and r["backward"]["median_ms"] > 0
    assert models == {"alexnet", "googlenet", "vgg16", "vgg19", "resnet18-lua", "resnet34-lua", "resnet50-lua",
                      "resnet101-lua", "resnet152-lua", "resnet200-lua"}
    assert devices == {"cpu", "cuda:0"}


def test_a_known_value_against_the_raw_json() -> None:
    f = corpus(OUTPUTS, "1080Ti_cudnn51", "311738.json")
    raw = json.loads(f.read_text())
    (r,) = history.read_any(f)["rows"]
    assert r["model"] == "resnet50-lua" and r["runtime"] == "torch7-cudnn"
    assert r["forward"]["median_ms"] == pytest.approx(1000 * np.median(raw["forward_times"]))
    assert r["backward"]["median_ms"] == pytest.approx(1000 * np.median(raw["backward_times"]))
    assert 34.0 < r["forward"]["median_ms"] < 34.3  # the file's ResNet-50 forward on a GTX 1080 Ti


def test_cpu_folder() -> None:
    f = corpus(OUTPUTS, "cpu", "655060.json")
    doc = history.read_any(f)
    assert doc["rows"][0]["device"] == "cpu" and doc["rows"][0]["runtime"] == "torch7-nn"
    assert doc["rows"][0]["model"] == "resnet50-lua" and "gpu" not in doc["env"]


def test_report_groups_a_folder_into_runs_by_environment() -> None:
    folder = corpus(OUTPUTS, "1080_cudnn50")  # cuDNN 5.0 and plain nn files side by side
    runs = report.load_runs([folder])
    assert sorted(r.label for r in runs) == ["1080_cudnn50 cuDNN 5005", "1080_cudnn50 cuDNN none"]
    assert sum(len(r.doc["rows"]) for r in runs) == 29
    text = report.markdown(runs)
    assert "## resnet50-lua" in text and "torch7-cudnn" in text and "GeForce GTX 1080, cuDNN 5005" in text


def test_compare_two_historical_files() -> None:
    d = corpus(OUTPUTS)
    r = CliRunner().invoke(app, ["compare", str(d / "1080Ti_cudnn51" / "311738.json"),
                                 str(d / "titan_xp_cudnn51" / "194600.json")])
    assert r.exit_code == 0, r.output  # Titan Xp about 2-3% slower: under the 5% threshold
    assert "environments differ: GPU: GeForce GTX 1080 Ti vs TITAN X" in r.stderr
    assert "resnet50-lua" in r.stdout and "backward" in r.stdout


def test_a_seed_file_against_a_zoo_run_across_runtimes(tmp_path: Path) -> None:
    """The seeds' CPU ResNet-50 (Torch7 nn) against a zoo row of the same case: matched only with
    --any-runtime, under the zoo's name of the Torch-style network."""
    f = corpus(OUTPUTS, "cpu", "655060.json")
    seed_doc = history.read_any(f)
    seed = seed_doc["rows"][0]
    rng = np.random.default_rng(0)
    ours = {**seed, "runtime": "torch", "source_format": "lua", "protocol": "cnn-benchmarks"}
    for part, scale in (("forward", 0.5), ("backward", 0.6)):
        ours[part] = summarize(list(np.asarray(seed[part]["samples_ms"]) * scale * rng.uniform(0.99, 1.01, 10)))
    run = tmp_path / "run.json"
    run.write_text(json.dumps({**seed_doc, "rows": [ours]}))
    r = CliRunner().invoke(app, ["compare", str(f), str(run)])
    assert r.exit_code == 2 and "no matching rows" in r.output
    r = CliRunner().invoke(app, ["compare", str(f), str(run), "--any-runtime"])
    assert r.exit_code == 0, r.output
    assert "resnet50-lua" in r.stdout and "torch7-nn→torch" in r.stdout and "faster" in r.stdout
