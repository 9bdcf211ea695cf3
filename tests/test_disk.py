"""Disk use of ``zoo bench``: model by model, what this run wrote is removed after the model's cases unless
--keep; OpenCV's original files are regenerated exactly when missing; --resume converts nothing done;
runtimes that cannot run here are one line, not rows; ``zoo clean``; the disk check's sampler."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import results
from convert import isolate
from zoo import benchmark, checks_disk
from zoo.cli import app

NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 12 input_dim: 12
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param {{ num_output: {n} kernel_size: 3 }} }}
layer {{ name: "relu" type: "ReLU" bottom: "conv" top: "conv" }}
'''
KW = dict(runtimes=["torch", "opencv"], precisions=["fp32"], layouts=["nchw"], batches=[1])


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)  # outputs/ of the run: here
    for name, n in (("first", 4), ("second", 6)):
        (tmp_path / f"{name}.prototxt").write_text(NET.format(n=n))
    return ["first.prototxt", "second.prototxt"]


def _art(name: str) -> Path:
    return Path("outputs/cache") / f"{name}-1x3x12x12"


def test_each_model_is_removed_after_its_cases(models: list[str]) -> None:
    p = benchmark.plan(models, **KW)
    first, second = (next(c for c in p.cases if c.model == m and c.runtime == "opencv") for m in ("first", "second"))
    live = p.live(first)
    art = Path(live.artifact)  # in this run's own folder, never the usual one
    assert live.status == "" and (art / "model.onnx").is_file() and not _art("first").exists()
    assert art.parent.name.startswith(isolate.temp_prefix("tmp")) and art.name == _art("first").name
    assert live.original and Path(live.original["weights"]).is_file()  # the seeded caffemodel OpenCV reads
    second_art = Path(p.live(second).artifact)  # the next model: the first one's folder is gone before
    assert not art.parent.exists() and second_art.is_dir()
    p.release()
    assert not second_art.exists() and not any(Path("outputs/cache").iterdir())


def test_keep_leaves_the_cache_and_the_cache_is_used(models: list[str]) -> None:
    p = benchmark.plan(models[:1], keep=True, **KW)
    p.live(p.cases[0])
    p.release()
    created = json.loads((_art("first") / "convert.json").read_text())["created"]
    p = benchmark.plan(models[:1], **KW)  # without --keep: a folder this run did not write stays
    p.live(p.cases[0])
    p.release()
    assert json.loads((_art("first") / "convert.json").read_text())["created"] == created


def test_a_missing_caffemodel_is_written_again_identically_and_removed_after(models: list[str]) -> None:
    p = benchmark.plan(models[:1], keep=True, **KW)
    weights = Path(p.live(p.cases[1]).original["weights"])
    p.release()
    original = weights.read_bytes()
    weights.unlink()
    p = benchmark.plan(models[:1], **KW)  # torch first: nothing written; opencv: written again
    p.live(p.cases[0])
    assert not weights.exists()
    p.live(p.cases[1])
    assert weights.read_bytes() == original
    p.release()
    assert not weights.exists() and (_art("first") / "model.onnx").is_file()  # the cached model stays


def test_resume_converts_nothing_already_done(models: list[str], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    run = ["bench", models[0], "--runtime", "torch", "--precision", "fp32", "--budget", "2", "--no-isolate",
           "--out", str(out)]
    assert CliRunner().invoke(app, run).exit_code == 0
    assert not Path("outputs/cache").exists() or not any(Path("outputs/cache").iterdir())  # removed after
    r = CliRunner().invoke(app, ["bench", *models, "--runtime", "torch", "--precision", "fp32", "--budget", "2",
                                 "--no-isolate", "--out", str(out), "--resume", "--keep"])
    assert r.exit_code == 0, r.output
    assert not _art("first").exists() and _art("second").is_dir()  # first: done, so never converted again
    assert sorted(row["model"] for row in results.read(out)["rows"]) == ["first", "second"]


@pytest.mark.parametrize("bf16", [False, True])
def test_runtimes_that_cannot_run_here_are_one_line(models: list[str], bf16: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """And on a CPU that computes bf16, its default bf16 cases go to the runtimes with bf16 kernels
    (torch, openvino); the others are one line too."""
    from bench import env

    monkeypatch.setattr(env, "native_bf16", lambda: bf16)
    r = CliRunner().invoke(app, ["bench", *models, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "TensorRT needs CUDA: 2 onnxruntime-trt cases not planned" in r.output
    line = "onnxruntime, opencv: no bf16 kernels on a CPU"
    assert (f"{line} (bf16 is timed where this CPU computes it: --precision bf16 plans them too): 4 cases not "
            "planned" in r.output) is bf16 and ("bf16" in r.output.split(line)[0]) is bf16
    table = r.output.split(line)[0]
    assert not any(f"{rt} " in row and "bf16" in row for row in table.splitlines() for rt in ("onnxruntime", "opencv"))
    assert "onnxruntime-trt" not in r.output.split("TensorRT needs CUDA")[0]  # no row of it
    r = CliRunner().invoke(app, ["bench", *models, "--dry-run", "--runtime", "onnxruntime-trt"])
    assert r.exit_code == 0 and "onnxruntime-trt cases not planned" not in r.output  # asked for: rows, each saying why


def _zoo_dir(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "convert.json").write_text(json.dumps({"zoo_version": "0"}))
    (d / "model.onnx").write_bytes(b"x" * 1000)
    return d


def test_clean_removes_only_what_zoo_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    models, cache = Path("outputs/models"), Path("outputs/cache")
    for d in (models / "resnet50", models / "resnet50-lua", cache / "resnet50-64x3x224x224-Dropout",
              cache / "resnet50-lua-1x3x224x224", models / "vgg16"):
        _zoo_dir(d)
    (models / "mine").mkdir()
    (models / "mine" / "thesis.tex").write_text("years of work")
    r = CliRunner().invoke(app, ["clean", "resnet50", "alexnet"])
    assert r.exit_code == 0, r.output
    assert "alexnet: not converted, nothing to remove" in r.output and "2 converted model folder(s) removed" in r.output
    assert not (models / "resnet50").exists() and not (cache / "resnet50-64x3x224x224-Dropout").exists()
    assert (models / "resnet50-lua").is_dir() and (cache / "resnet50-lua-1x3x224x224").is_dir()
    r = CliRunner().invoke(app, ["clean", "mine", "vgg16"])
    assert r.exit_code == 2 and "not a folder zoo wrote" in r.output and "nothing was removed" in r.output
    assert (models / "vgg16").is_dir()
    r = CliRunner().invoke(app, ["clean", "--all"])
    assert r.exit_code == 0 and "left outputs/models/mine: not a folder zoo wrote" in r.output, r.output
    assert sorted(p.name for p in models.iterdir()) == ["mine"] and not any(cache.iterdir())
    assert (models / "mine" / "thesis.tex").read_text() == "years of work"
    r = CliRunner().invoke(app, ["clean"])
    assert r.exit_code == 2 and "or give --all" in r.output


def test_disk_sampler_sees_the_peak_and_the_end(tmp_path: Path) -> None:
    script = ("import os, time; f = open('big', 'wb'); f.write(os.urandom(3 << 20)); f.close(); "
              "time.sleep(1.2); os.remove('big')")
    r = checks_disk.sample([sys.executable, "-c", script], tmp_path / "work", tmp_path / "log", every_s=0.1)
    assert r["exit_code"] == 0 and r["peak_disk_bytes"] >= 3 << 20 and r["final_disk_bytes"] < 1 << 20
    assert r["peak_tree_rss_bytes"] > 1 << 20 and r["max_process_rss_bytes"] > 1 << 20


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _created(d: Path) -> tuple[str, int]:
    info = json.loads((d / "convert.json").read_text())
    return info["created"], info["seed"]


@pytest.fixture
def default_shape(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The models' own shape counts as the catalogue's: bench's folder is outputs/models/NAME, zoo convert's."""
    monkeypatch.setattr(benchmark, "_is_default", lambda t, shapes: True)
    return Path("outputs/models/first")


def test_a_folder_converted_with_other_options_is_never_removed(models: list[str], default_shape: Path) -> None:
    """zoo convert first --seed 1; zoo bench first: the seed-1 folder is not fresh for bench, which converts
    into a folder of its own and leaves the user's as it was."""
    assert CliRunner().invoke(app, ["convert", models[0], "--seed", "1"]).exit_code == 0
    before = _created(default_shape)
    p = benchmark.plan(models[:1], **KW)
    live = p.live(p.cases[1])  # opencv: its original file too
    assert live.status == "" and Path(live.artifact) != default_shape
    p.release()
    assert _created(default_shape) == before and (default_shape / "random.caffemodel").is_file()
    assert not any(Path("outputs/cache").iterdir())


def test_keep_never_replaces_a_folder_it_did_not_write(models: list[str], default_shape: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert CliRunner().invoke(app, ["convert", models[0], "--seed", "1"]).exit_code == 0
    before = _created(default_shape)
    p = benchmark.plan(models[:1], keep=True, **KW)
    assert p.live(p.cases[0]).status == ""
    p.release()
    assert _created(default_shape) == before and not any(Path("outputs/cache").iterdir())
    assert "--keep: outputs/models/first holds another conversion" in capsys.readouterr().err  # zoo's log
    shutil.rmtree(default_shape)  # nothing there: --keep leaves this run's conversion there
    p = benchmark.plan(models[:1], keep=True, **KW)
    p.live(p.cases[0])
    p.release()
    assert _created(default_shape)[1] == 0 and not any(Path("outputs/cache").iterdir())


def test_a_folder_that_appears_during_the_run_is_never_removed(models: list[str], default_shape: Path) -> None:
    """`zoo convert first` (or another zoo bench) while this bench times it: the folder is theirs."""
    p = benchmark.plan(models[:1], **KW)
    p.live(p.cases[0])
    assert CliRunner().invoke(app, ["convert", models[0]]).exit_code == 0
    theirs = _created(default_shape)
    p.release()
    assert _created(default_shape) == theirs and not any(Path("outputs/cache").iterdir())


def test_the_folder_of_a_killed_run_is_removed_by_the_next(models: list[str]) -> None:
    left = Path("outputs/cache") / f"zoo-tmp-{isolate.HOST}-{_dead_pid()}-abc123" / "first-1x3x12x12"
    left.mkdir(parents=True)
    (left / "model.onnx").write_bytes(b"half")
    p = benchmark.plan(models[:1], **KW)
    p.live(p.cases[0])
    assert not left.parent.exists()
    p.release()


def test_an_original_file_is_written_whole_or_not_at_all(models: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    p = benchmark.plan(models[:1], keep=True, **KW)
    weights = Path(p.live(p.cases[1]).original["weights"])
    p.release()
    weights.unlink()
    real = benchmark.load

    def killed_midway(*a: object, **k: object) -> object:
        def half(d: Path) -> None:
            (d / "random.caffemodel").write_bytes(b"half a caffemodel")
            raise KeyboardInterrupt

        return dataclasses.replace(real(*a, **k), extra=half)

    monkeypatch.setattr(benchmark, "load", killed_midway)
    p = benchmark.plan(models[:1], **KW)
    with pytest.raises(KeyboardInterrupt):
        p.live(p.cases[1])
    assert not weights.exists() and sorted(f.name for f in weights.parent.iterdir() if "zoo-tmp" in f.name) == []


def test_build_keeps_every_artifact_its_cases_name(models: list[str], default_shape: Path) -> None:
    """build() makes every case live before any runs (cluster nodes): a model converted into the run's own
    folder, its usual one being another conversion, is still there when the later models are ready."""
    for m in models:
        assert CliRunner().invoke(app, ["convert", m, "--seed", "1"]).exit_code == 0
    before = [_created(Path("outputs/models") / n) for n in ("first", "second")]
    cases = benchmark.build(models, **KW)
    assert {c.model for c in cases} == {"first", "second"}
    assert all(c.status == "" and (Path(c.artifact) / "model.onnx").is_file() for c in cases)
    assert [_created(Path("outputs/models") / n) for n in ("first", "second")] == before
