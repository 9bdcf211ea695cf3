"""Threads check: how each runtime's threads must be set so that a busy machine slows it in
proportion, not 10-100x.

    python -m zoo.checks threads

LeNet (the corpus's BVLC file) and ResNet-18 at batch 1 with zoo's thread count, each setting in a
fresh process timed for 2 s, on the machine as it is and with one core kept busy by a spinning
process of ours (the condition of a shared machine). Settings compared: PyTorch with OpenMP's
default wait policy (its threads spin about 3 ms before sleeping) and with OMP_WAIT_POLICY=PASSIVE;
ONNX Runtime with its intra-op threads spinning (its default) or not; OpenVINO with its threads
pinned to cores (its default on Linux) or not; OpenCV's own pool. zoo bench uses the second of
each pair. Results in outputs/checks/threads.json (medians and p90 per setting and condition, the
load average before and after).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .checks_common import CORPUS, save

SECONDS = 2.0
SETTINGS = (  # (runtime, label, child environment, option)
    ("torch", "OpenMP default wait (spin)", {}, ""),
    ("torch", "OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}, ""),
    ("onnxruntime", "allow_spinning=1 (default)", {}, "1"),
    ("onnxruntime", "allow_spinning=0", {}, "0"),
    ("openvino", "ENABLE_CPU_PINNING default", {}, ""),
    ("openvino", "ENABLE_CPU_PINNING=False", {}, "False"),
    ("opencv", "setNumThreads(threads)", {}, ""),
)


def _callable(runtime: str, art: str, threads: int, option: str, x: np.ndarray) -> Any:
    """One call of the model in ``runtime`` with the setting under test."""
    if runtime == "torch":
        import torch

        from convert.runtimes.torch_eager import import_model

        torch.set_num_threads(threads)
        run, xt = torch.inference_mode()(import_model(Path(art) / "model.py").load()), torch.from_numpy(x)
        return lambda: run(xt)
    if runtime == "onnxruntime":
        import onnxruntime as ort

        from convert.runtimes.ort import session_options

        sess = ort.InferenceSession(str(Path(art) / "model.onnx"),
                                    session_options(threads, **{"session.intra_op.allow_spinning": option}),
                                    providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x}
        return lambda: sess.run(None, feed)
    if runtime == "openvino":
        import openvino as ov

        core = ov.Core()  # zoo's OpenVINO settings (f32: on AMX CPUs the default would be bf16)
        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "f32"}
        if option:
            config["ENABLE_CPU_PINNING"] = option == "True"
        model = core.read_model(str(Path(art) / "model.onnx"))
        model.reshape({model.inputs[0].get_any_name(): list(x.shape)})
        request = core.compile_model(model, "CPU", config).create_infer_request()
        return lambda: request.infer([x])
    import json

    import cv2

    cv2.setNumThreads(threads)  # the original files, as zoo bench's opencv runtime reads them
    source = json.loads((Path(art) / "convert.json").read_text())["source"]
    net = cv2.dnn.readNetFromCaffe(source, str(Path(art) / "random.caffemodel"))
    return lambda: (net.setInput(x), net.forward())


def time_setting(runtime: str, art: str, shape: list[int], threads: int, option: str) -> dict[str, Any]:
    """In a fresh process (convert.isolate): 3 warm-up calls, then calls for SECONDS (at least 5)."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    call = _callable(runtime, art, threads, option, x)
    for _ in range(3):
        call()
    ms: list[float] = []
    end = time.perf_counter() + SECONDS
    while time.perf_counter() < end or len(ms) < 5:
        t0 = time.perf_counter()
        call()
        ms.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "n": len(ms)}


def _models(tmp: Path) -> dict[str, tuple[str, list[int]]]:
    from convert.api import convert

    from .catalogue import CATALOGUE

    sources = {"resnet18": CATALOGUE["resnet18"].source}
    lenet = CORPUS / "realworld" / "BVLC" / "caffe" / "examples" / "mnist" / "lenet.prototxt"
    if lenet.exists():
        sources = {"lenet": lenet, **sources}
    out = {}
    for name, src in sources.items():
        res = convert(src, out=tmp, name=name)
        dims = next(iter(res.report["inputs"].values()))
        out[name] = (str(tmp / name), [1, *dims[1:]])
    return out


def threads() -> dict[str, Any]:
    from bench.env import physical_cores
    from convert.isolate import IsolatedError, call_json

    os.environ.pop("OMP_WAIT_POLICY", None)  # the default policy means: not set
    n, rows = physical_cores(), []
    with tempfile.TemporaryDirectory(prefix="zoo-threads-") as tmp:
        models = _models(Path(tmp))
        for condition in ("as is", "one core busy"):
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition != "as is" else None
            try:
                for model, (art, shape) in models.items():
                    for runtime, label, env, option in SETTINGS:
                        before = os.getloadavg()[0]
                        try:
                            r = call_json("zoo.checks_threads:time_setting", 120, env, kind="threads",
                                          runtime=runtime, art=art, shape=shape, threads=n, option=option)
                        except IsolatedError as e:
                            r = {"error": str(e)}
                        rows.append({"condition": condition, "model": model, "runtime": runtime, "setting": label,
                                     **r, "loadavg_before": before, "loadavg_after": os.getloadavg()[0]})
                        print(f"{condition:13s} {model:9s} {runtime:11s} {label:28s} "
                              + (f"median {r['median_ms']:9.2f} ms  p90 {r['p90_ms']:9.2f} ms  n {r['n']}"
                                 if "median_ms" in r else r["error"]), flush=True)
            finally:
                if spinner:
                    spinner.kill()
                    spinner.wait()
    result = {"threads": n, "seconds_per_setting": SECONDS, "rows": rows}
    save("threads", result)
    return result
