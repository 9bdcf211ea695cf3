"""Sweeps: isolation (a crashing or hanging worker is an error row, the sweep goes on), resume,
results schema, runtime skips, device selection, and a small end-to-end CPU sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import results, sweep
from bench.cases import Case
from bench.results import Recorder, ResultsError, validate
from bench.timing import Policy
from convert.runtimes import RUNTIMES
from zoo.cli import app

TESTS = Path(__file__).parent
POLICY = Policy(warmup_iters=1, warmup_s=0, min_iters=3, min_s=0, max_iters=5, max_s=1).__dict__


def case(runtime: str, mode: str = "inference", **kw) -> Case:  # type: ignore[no-untyped-def]
    c = Case(model="m", source_format="caffe", artifact="", runtime=runtime, device="cpu", precision="fp32",
             layout="nchw", batch=1, mode=mode, protocol="zoo", threads=1, input_shapes={"x": [1, 2]},
             output_shapes=[[1, 2]], policy=POLICY, **kw)
    d = c.to_dict()
    return c if "plugin" in d else Case(**{**{k: v for k, v in d.items()}})


@pytest.fixture
def plugin(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    import fake_runtimes  # noqa: F401  (registers the fakes in this process too)

    orig = Case.to_dict
    monkeypatch.setattr(Case, "to_dict", lambda self: {**orig(self), "plugin": "fake_runtimes"})


def test_crash_and_hang_become_error_rows_and_the_sweep_goes_on(tmp_path: Path, plugin) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder(tmp_path / "r.json", {"threads": 1})
    rows = sweep.run([case("test-crash"), case("test-hang"), case("test-sleep", "training")], rec,
                     isolate=True, timeout_s=15)  # room for a worker's torch import on a loaded CI
    assert [r["status"] for r in rows] == ["error", "error", "unverified"]
    assert "exit code 3" in rows[0]["reason"] and "timed out after 15 s" in rows[1]["reason"]
    assert rows[2]["reason"] == "no reference outputs for this case"  # timed, but not checked
    f, b = (min(rows[2][k]["samples_ms"]) for k in ("forward", "backward"))
    assert 20 <= f < 24 and 30 <= b < 34  # the fastest sample: a loaded machine inflates medians only
    assert rows[2]["forward"]["median_ms"] >= 20 and rows[2]["backward"]["median_ms"] >= 30
    assert validate(json.loads((tmp_path / "r.json").read_text()))["rows"] == rows


def test_fake_async_device_in_a_worker(tmp_path: Path, plugin) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder(tmp_path / "r.json", {})
    (row,) = sweep.run([case("test-async")], rec, isolate=True)
    assert row["forward"]["median_ms"] >= 15.0


def test_resume_continues_where_it_stopped(tmp_path: Path, plugin) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.json"
    first = [case("test-sleep"), case("test-crash")]
    sweep.run(first[:1], Recorder(path, {}), isolate=True)  # "interrupted" after one case
    rows = sweep.run(first, Recorder(path, {}, resume=True), isolate=True)
    assert [r["runtime"] for r in rows] == ["test-crash"]
    assert [r["runtime"] for r in results.read(path)["rows"]] == ["test-sleep", "test-crash"]


@pytest.mark.parametrize("doc,message", [
    ([], "not a zoo results file"),
    ({"schema_version": 99, "env": {}, "rows": []}, "newer than this zoo understands"),
    ({"schema_version": 1, "rows": []}, "env is missing"),
    ({"schema_version": 1, "env": {}, "rows": [{"model": "m"}]}, "row 0: missing runtime"),
    ({"schema_version": 1, "env": {}, "rows": [{**dict.fromkeys(results.KEY, "x"), "batch": 1,
                                                  "status": "weird"}]}, "unknown status"),
    ({"schema_version": 1, "env": {}, "rows": [{**dict.fromkeys(results.KEY, "x"), "batch": 1,
                                                  "mode": "inference", "status": "ok"}]},
     "forward statistics incomplete"),
    ({"schema_version": 1, "env": {}, "rows": [{**dict.fromkeys(results.KEY, "x"), "batch": 0,
                                                  "status": "skipped", "reason": "r"}]}, "batch must be"),
])
def test_schema_validation(doc, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResultsError, match=message):
        validate(doc)


def test_unreadable_results_file(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultsError, match="not readable as JSON"):
        results.read(tmp_path / "bad.json")
    r = CliRunner().invoke(app, ["bench", "alexnet", "--resume", "--out", str(tmp_path / "bad.json")])
    assert r.exit_code == 2 and "not readable as JSON" in r.output


@pytest.mark.parametrize("runtime,device,precision,layout,mode,reason", [
    ("onnxruntime", "cpu", "bf16", "nchw", "inference", "no bf16"),
    ("onnxruntime", "cpu", "fp16", "nchw", "inference", "no fp16"),
    ("onnxruntime", "cpu", "fp32", "nchw", "training", "inference only"),
    ("onnxruntime", "cpu", "fp32", "channels_last", "inference", "chooses its own layout"),
    ("onnxruntime-trt", "cpu", "fp32", "nchw", "inference", "NVIDIA GPUs only"),
    ("onnxruntime-trt", "cuda:0", "fp16", "nchw", "training", "inference only"),
    ("opencv", "cpu", "fp16", "nchw", "inference", "fp32 only"),
    ("opencv", "cuda:0", "fp32", "nchw", "inference", "no CUDA backend"),
    ("torch", "cuda:0", "fp32", "nchw", "inference", "CUDA is not available"),
    ("torch", "cpu", "fp32", "channels_last", "inference", None),
])
def test_combinations_that_cannot_run_say_why(runtime, device, precision, layout, mode, reason) -> None:  # type: ignore[no-untyped-def]
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    c = {"runtime": runtime, "device": device, "precision": precision, "layout": layout, "mode": mode,
         "input_shapes": {"data": [1, 3, 8, 8]}, "original": {"framework": "caffe"}}
    got = RUNTIMES[runtime]().skip_reason(c)
    assert (got is None) if reason is None else (reason in got), got


@pytest.mark.parametrize("args,message", [
    (["--gpu", "0"], "CUDA is not available (torch"),
    (["--runtime", "tensorflow"], "unknown runtime 'tensorflow'"),
    (["--batch", "0"], "--batch must be positive"),
    (["--precision", "fp8"], "unknown precision 'fp8'"),
    (["--mode", "train"], "unknown mode 'train'"),
    (["--protocol", "mlperf"], "unknown protocol 'mlperf'"),
])
def test_bad_bench_requests(args: list[str], message: str) -> None:
    import torch

    if args[0] == "--gpu" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = CliRunner().invoke(app, ["bench", "alexnet", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_unknown_model() -> None:
    r = CliRunner().invoke(app, ["bench", "lenet9000"])
    assert r.exit_code == 2 and "neither a file nor a zoo model" in r.output


TINY = '''name: "tiny"
input: "data" input_dim: 1 input_dim: 3 input_dim: 16 input_dim: 16
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 8 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
'''


def test_end_to_end_cpu_sweep(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.prototxt").write_text(TINY)
    out = tmp_path / "res.json"
    r = CliRunner().invoke(app, ["bench", "tiny.prototxt", "--runtime", "torch", "--runtime", "onnxruntime",
                                 "--runtime", "opencv", "--precision", "fp32", "--precision", "bf16",
                                 "--batch", "2", "--mode", "both", "--budget", "30", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = results.read(out)
    rows = {(x["runtime"], x["precision"], x["mode"]): x for x in doc["rows"]}
    assert len(rows) == 12
    ok = rows[("torch", "fp32", "training")]
    assert ok["status"] == "ok" and ok["backward"]["median_ms"] > 0 and ok["verification"]["ok"]
    assert rows[("onnxruntime", "fp32", "inference")]["status"] == "ok"
    assert rows[("opencv", "fp32", "inference")]["status"] == "ok"
    assert rows[("onnxruntime", "bf16", "inference")]["status"] == "skipped"
    assert rows[("opencv", "fp32", "training")]["reason"] == "opencv runs inference only"
    assert doc["env"]["threads"] >= 1 and doc["env"]["gemm_peak"]["cpu"]["fp32"]["tflops"] > 0
    assert ok["gflops_per_image"] > 0 and ok["achieved_tflops"] > 0 and ok["pct_of_peak"] > 0
    assert ok["one_time"]["load_s"] > 0 and ok["memory"]["host_peak_rss_bytes"] > 0
    assert "results:" in r.output


def test_dry_run_lists_cases_without_converting(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["bench", "--protocol", "convnet-benchmarks", "--dry-run"])
    assert r.exit_code == 0, r.output
    # of 16 cases, the inference-only runtimes' 12 are counted apart (training protocol)
    assert "vgg-a" in r.output and "4 cases to time (12 more to be skipped)" in r.output and "minutes" in r.output
    assert not (tmp_path / "outputs").exists()


def test_layers_keep_their_own_input_at_batch_128() -> None:
    from zoo import benchmark

    cases = benchmark.build([], layers=True, protocol="convnet-benchmarks", runtimes=["torch"],
                            precisions=["fp32"], layouts=["nchw"], batches=[1], threads=1, dry_run=True)
    assert [(c.model, c.batch, c.input_shapes["data"]) for c in cases] == [
        ("L1", 128, [128, 3, 128, 128]), ("L2", 128, [128, 64, 64, 64]), ("L3", 128, [128, 128, 32, 32]),
        ("L4", 128, [128, 128, 16, 16]), ("L5", 128, [128, 384, 13, 13])]


def test_layers_picked_by_name_and_unknown_ones_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["bench", "--layers", "L5", "L4", "--runtime", "torch", "--dry-run"])
    assert r.exit_code == 0 and "2 cases" in r.output and "L1" not in r.output, r.output
    r = CliRunner().invoke(app, ["bench", "--layers", "L9", "--dry-run"])
    assert r.exit_code == 2 and "unknown layer 'L9'" in r.output, r.output


def test_data_gradient_left_out_of_backward_flops(tmp_path: Path) -> None:
    """The first layer with weights after parameter-free ops on the data skips its input gradient."""
    from convert.api import convert
    from zoo.benchmark import data_grad_macs_per_image

    src = tmp_path / "n.prototxt"
    src.write_text('input: "data" input_dim: 2 input_dim: 3 input_dim: 8 input_dim: 8\n'
                   'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
                   'layer { name: "c1" type: "Convolution" bottom: "r" top: "c1" '
                   'convolution_param { num_output: 4 kernel_size: 3 } }\n'
                   'layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2" '
                   'convolution_param { num_output: 5 kernel_size: 3 } }\n')
    art = convert(src, out=tmp_path).dir
    ir = json.loads((art / "ir.json").read_text())
    assert data_grad_macs_per_image(art, ir) == 4 * 6 * 6 * 3 * 9  # c1 only, per image


@pytest.mark.parametrize("args", [["--layers"], ["--protocol", "cnn-benchmarks"], ["--protocol", "convnet-benchmarks"]])
@pytest.mark.parametrize("option", [["--batch", "32"], ["--mode", "inference"]])
def test_what_a_protocol_fixes_is_refused(tmp_path: Path, monkeypatch, args, option) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["bench", *args, *option, "--dry-run"])
    assert r.exit_code == 2 and f"{option[0]} " in r.output and "does not apply" in r.output, r.output
    assert "Traceback" not in r.output


def test_estimate_counts_the_calls_a_fixed_protocol_makes() -> None:
    fixed = Policy(fixed=5, calls=10, dry=10).__dict__
    c = case("torch", mode="training", gflops_per_image=1.0, backward_gflops_per_image=1.0)
    c.policy = fixed
    c.batch = 2
    # a call: (1 + 1) GFLOP x 2 images at half of 0.004 TFLOP/s = 2 s; the first, 10 dry, 5 x 10 timed
    assert sweep.estimate(c, 0.004) == pytest.approx(sweep.STARTUP_S + 61 * 2.0)
    c.backward_gflops_per_image = None  # twice the forward
    assert sweep.estimate(c, 0.004) == pytest.approx(sweep.STARTUP_S + 61 * 3.0)
