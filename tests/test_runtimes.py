"""convert/runtimes: every registered runtime runs a converted model and matches the float64
reference within the tolerance of its precision; OpenVINO records its own settings; OpenCV's
refusal says which layer and type, whole; the child-process mechanism reports in one line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from convert import artifacts, isolate, reference
from convert.api import convert
from convert.runtimes import RUNTIMES, TOLERANCE, CannotRun
from convert.runtimes import opencv as ocv

NET = """name: "small"
input: "data" input_dim: 1 input_dim: 3 input_dim: 19 input_dim: 17
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 6 kernel_size: 3 group: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "fc" type: "InnerProduct" bottom: "conv2" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""
# torch.compile compiles the eager module for about a minute on 2 busy cores: run when asked
COMPILE = pytest.mark.skipif(not os.environ.get("ZOO_TEST_COMPILE"), reason="set ZOO_TEST_COMPILE=1 to compile")
# zoo's own runtimes only: the suite's fake ones (tests/fake_runtimes.py) register into the same
# registry when another test module imported them first, and one of them crashes on purpose
OWN = sorted(n for n, cls in RUNTIMES.items() if cls.__module__.startswith("convert.runtimes.") and n != "gemm-peak")
TIMED = [pytest.param(n, marks=COMPILE) if n == "torch-compile" else n for n in OWN]


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("net") / "small.prototxt"
    src.write_text(NET)
    res = convert(src, None, src.parent / "out", seed=3)
    assert res.ok, res.report
    return res.dir


def case_for(art: Path, runtime: str, batch: int, **kw: Any) -> dict[str, Any]:
    info = json.loads((art / "convert.json").read_text())
    shapes = {k: [batch, *v[1:]] for k, v in info["inputs"].items()}
    return {"runtime": runtime, "artifact": str(art), "device": "cpu", "precision": "fp32", "layout": "nchw",
            "mode": "inference", "threads": 2, "input_shapes": shapes, "original": ocv.original(art, info), **kw}


@pytest.mark.parametrize("name", TIMED)
def test_every_runtime_matches_the_float64_reference(art: Path, name: str) -> None:
    case = case_for(art, name, 2)
    rt = RUNTIMES[name]()
    if name == "onnxruntime-trt":  # on a CPU case the reason is the result
        assert "GPU" in rt.skip_reason(case)
        return
    assert rt.skip_reason(case) is None
    rt.load(case)
    g = artifacts.load_graph(art)
    x = {k: np.random.default_rng(5).standard_normal(s).astype(np.float32) for k, s in case["input_shapes"].items()}
    ref = reference.run(g, x)
    outs = rt.infer(x)
    assert len(outs) == len(g.outputs)
    for o, out in zip(g.outputs, outs):
        err = np.max(np.abs(out.astype(np.float64) - ref[o])) / np.max(np.abs(ref[o]))
        assert out.shape == ref[o].shape and err <= TOLERANCE["fp32"], (name, o, err)
    # a different input gives a different output: the runtime computed, it did not replay
    other = rt.infer({k: v[::-1].copy() for k, v in x.items()})
    assert not np.allclose(other[0], outs[0])


def test_tensorrt_fp16_case_builds_fp16_engines(art: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An fp16 TensorRT case asks TensorRT for fp16 engines from the fp32 graph (no GPU needed: the
    session is a stand-in that records what it was given) and says so in its settings."""
    import onnxruntime as ort

    seen: dict[str, Any] = {}

    class Session:
        def __init__(self, model: Any, so: Any, providers: list[Any]) -> None:
            seen.update(model=model, providers=providers)

        def get_outputs(self) -> list[Any]:
            return []

        def get_providers(self) -> list[str]:
            return [p[0] for p in seen["providers"]]

        def get_provider_options(self) -> dict[str, dict[str, str]]:
            return {p: {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in o.items()}
                    for p, o in seen["providers"]}

    monkeypatch.setattr(ort, "InferenceSession", Session)
    trt = RUNTIMES["onnxruntime-trt"]
    for precision, fp16 in (("fp16", True), ("fp32", False)):
        case = case_for(art, "onnxruntime-trt", 1, device="cuda:0", precision=precision)
        assert trt().providers(case)[0] == ("TensorrtExecutionProvider", {"device_id": 0, "trt_fp16_enable": fp16})
        rt = trt()
        rt.load(case)
        assert seen["providers"][0][1]["trt_fp16_enable"] is fp16
        assert seen["model"] == str(art / "model.onnx")  # the fp32 graph: TensorRT makes the fp16 engine
        assert rt.settings()["trt_fp16_enable"] is fp16


def test_openvino_records_its_thread_and_stream_settings(art: Path) -> None:
    rt = RUNTIMES["openvino"]()
    rt.load(case_for(art, "openvino", 1))
    s = rt.settings()
    assert s["inference_num_threads"] == "2" and s["num_streams"] == "1"
    assert s["performance_hint"] == "LATENCY" and s["inference_precision_hint"] == "f32" and s["version"]


def test_openvino_bf16_within_its_tolerance_where_the_cpu_has_it(art: Path) -> None:
    case = case_for(art, "openvino", 2, precision="bf16")
    rt = RUNTIMES["openvino"]()
    if reason := rt.skip_reason(case):  # a CPU without AVX512-BF16/AMX: the reason is the result
        assert "no bf16 inference" in reason
        return
    rt.load(case)
    g = artifacts.load_graph(art)
    x = {"data": np.random.default_rng(2).standard_normal((2, 3, 19, 17)).astype(np.float32)}
    (out,) = rt.infer(x)
    ref = reference.run(g, x)[g.outputs[0]]
    assert np.max(np.abs(out - ref)) <= TOLERANCE["bf16"] * np.max(np.abs(ref))
    assert rt.settings()["inference_precision_hint"] == "bf16"


def test_onnxruntime_records_its_session_settings(art: Path) -> None:
    rt = RUNTIMES["onnxruntime"]()
    rt.load(case_for(art, "onnxruntime", 1))
    s = rt.settings()
    assert s["intra_op_threads"] == 2 and s["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert s["execution_mode"] == "ORT_SEQUENTIAL" and s["providers"] == ["CPUExecutionProvider"]


@pytest.mark.parametrize("name", ["openvino", "onnxruntime", "opencv", "torch"])
def test_a_batch_other_than_the_loaded_one(art: Path, name: str) -> None:
    """Timing loads at the case's batch; verification may feed another (OpenVINO recompiles)."""
    rt = RUNTIMES[name]()
    rt.load(case_for(art, name, 1))
    g = artifacts.load_graph(art)
    x = {"data": np.random.default_rng(1).standard_normal((3, 3, 19, 17)).astype(np.float32)}
    (out,) = rt.infer(x)
    ref = reference.run(g, x)[g.outputs[0]]
    assert out.shape == ref.shape and np.max(np.abs(out - ref)) <= TOLERANCE["fp32"] * np.max(np.abs(ref))


REFUSED = """name: "t"
input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "a rather long layer name th" type: "Threshold" bottom: "data" top: "th" }
"""


def test_opencv_refusal_names_the_type_and_layer_whole(tmp_path: Path) -> None:
    (tmp_path / "t.prototxt").write_text(REFUSED)
    rt = RUNTIMES["opencv"]()
    case = {"threads": 1, "original": {"framework": "caffe", "source": str(tmp_path / "t.prototxt"),
                                       "weights": None, "outputs": {}}}
    with pytest.raises(CannotRun) as e:  # OpenCV creates layers at the first forward
        rt.load(case)
        rt.set_inputs([{"data": np.zeros((1, 3, 8, 8), np.float32)}], None)
        rt.forward(0)
    assert str(e.value) == "OpenCV has no Threshold layer ('a rather long layer name th')"


def test_opencv_reason_keeps_the_whole_message() -> None:
    e = RuntimeError("OpenCV(4.14.0) /io/opencv/modules/dnn/src/caffe/caffe_io.cpp:1138: error: (-2:Unspecified "
                     "error) FAILED: fs.is_open(). Can't open \"x.prototxt\" in function 'ReadProtoFromTextFile'\n")
    assert ocv.reason(e) == "OpenCV cannot load this model: FAILED: fs.is_open(). Can't open \"x.prototxt\""


@pytest.mark.parametrize("name,case,reason", [
    ("openvino", {"device": "cuda:0"}, "Intel GPUs only"),
    ("openvino", {"mode": "training"}, "inference only"),
    ("openvino", {"layout": "channels_last"}, "its own layout"),
])
def test_openvino_says_why_it_cannot_run(name: str, case: dict[str, Any], reason: str) -> None:
    base = {"device": "cpu", "precision": "fp32", "layout": "nchw", "mode": "inference"}
    got = RUNTIMES[name]().skip_reason({**base, **case})
    assert got and reason in got, got


def fail(message: str) -> None:
    raise ValueError(f"first line\n{message}")


def snooze(seconds: float) -> dict[str, float]:
    time.sleep(seconds)
    return {"slept": seconds}


def test_child_process_results_and_failures_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    assert isolate.call_json("test_runtimes:snooze", 60, seconds=0.0) == {"slept": 0.0}
    with pytest.raises(isolate.IsolatedError, match=r"^ValueError: the reason$"):
        isolate.call_json("test_runtimes:fail", 60, message="the reason")
    with pytest.raises(isolate.IsolatedError, match=r"^timed out after 1 s"):
        isolate.call_json("test_runtimes:snooze", 1, seconds=30.0)
