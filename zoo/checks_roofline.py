"""The fp32 floor check (issue 10, part 3): how fast can fp32 AlexNet and VGG-16 run on this CPU at
batch 1, and so how far above OpenCV can any fp32 runtime get?

    python -m zoo.checks roofline

At batch 1 a network's fully connected layers read every weight once per image (memory bound)
and its convolutions are compute bound. The floor of an fp32 forward is then

    conv FLOPs / fp32 peak  +  fully connected weight bytes / fp32 GEMV rate

with the peak and the rate measured here, now, with the run's threads: the better of PyTorch's
(square matrix multiplies; a matrix-vector product over a matrix the size of the model's fully
connected weights) and OpenVINO's own per-layer rates on the model (its convolution GFLOP/s, its
fully connected GB/s), so the floor errs low. OpenCV is timed with its Winograd convolution on (its default) and off:
Winograd computes 3x3 convolutions with fewer multiplications, which a direct fp32 convolution at
the peak cannot match. Everything of one model is timed in turns, round by round.

Writes outputs/checks/roofline.json.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .checks_common import ROOT
from .checks_common import save as _save

MODELS = ("alexnet", "vgg16")


def _median_s(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine(threads: int, fc_elements: int) -> dict[str, float]:
    """fp32 GEMM peak (GFLOP/s) and the GEMV rate (GB/s) over ``fc_elements`` weights."""
    import torch

    torch.set_num_threads(threads)
    peak = 0.0
    for n in (2048, 4096):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        peak = max(peak, 2 * n**3 / _median_s(lambda: a @ b, 5) / 1e9)
    w = torch.randn(4096, fc_elements // 4096)
    x = torch.randn(1, w.shape[1])
    torch.nn.functional.linear(x, w)
    gemv = w.numel() * 4 / _median_s(lambda: torch.nn.functional.linear(x, w), 9) / 1e9
    return {"fp32_gemm_gflops": peak, "fp32_gemv_gb_s": gemv}


def _openvino(onnx_path: Path, shape: tuple[int, ...], threads: int) -> Any:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(onnx_path))
    model.reshape({model.inputs[0].get_any_name(): list(shape)})
    cfg = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "ENABLE_CPU_PINNING": False,
           "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True}
    return core.compile_model(model, "CPU", cfg).create_infer_request()


def model_floor(name: str, tmp: Path, threads: int, rounds: int = 8) -> dict[str, Any]:
    import cv2

    from convert.api import convert, load

    g = load(ROOT / "prototxt" / f"{name}.prototxt", seed=None).graph
    conv_flops = 2 * sum(g.node_macs(n) for n in g.nodes if n.op.kind == "conv")
    fc_elements = sum(int(np.prod(g.shapes[n.inputs[0]][1:])) * g.shapes[n.outputs[0]][1]
                      for n in g.nodes if n.op.kind == "linear")
    rates = machine(threads, fc_elements)
    art = convert(ROOT / "prototxt" / f"{name}.prototxt", out=tmp, name=name).dir
    shape = next(iter(g.inputs.values()))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    cv2.setNumThreads(threads)
    nets = {}
    for wino in (True, False):
        net = cv2.dnn.readNetFromCaffe(str(ROOT / "prototxt" / f"{name}.prototxt"), str(art / "random.caffemodel"))
        net.enableWinograd(wino)
        net.setInput(x)
        net.forward()
        nets[wino] = net
    req = _openvino(art / "model.onnx", shape, threads)
    req.infer({0: x})
    fns = {"openvino": lambda: req.infer({0: x}), "opencv": lambda: nets[True].forward(),
           "opencv_no_winograd": lambda: nets[False].forward()}
    per: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            per[k].append(_median_s(fns[k], 5) * 1e3)
    ms = {k: statistics.median(v) for k, v in per.items()}
    prof = {"FullyConnected": 0.0, "Convolution": 0.0}
    for p in req.profiling_info:
        kind = "Convolution" if "Convolution" in p.node_type else p.node_type
        if kind in prof:
            prof[kind] += p.real_time.total_seconds()
    ov_fc = fc_elements * 4 / prof["FullyConnected"] / 1e9 if prof["FullyConnected"] else 0.0
    ov_conv = conv_flops / prof["Convolution"] / 1e9 if prof["Convolution"] else 0.0
    # the best rates seen on this machine (OpenVINO's own kernels may beat PyTorch's GEMM): a lower
    # floor, so the claim "fp32 cannot go faster" errs on the generous side
    peak, bw = max(rates["fp32_gemm_gflops"], ov_conv), max(rates["fp32_gemv_gb_s"], ov_fc)
    floor_ms = 1e3 * (conv_flops / (peak * 1e9) + fc_elements * 4 / (bw * 1e9))
    return {"model": name, "threads": threads, "conv_gflop": conv_flops / 1e9, "fc_mbytes": fc_elements * 4 / 1e6,
            **rates, "floor_gflops": peak, "floor_gb_s": bw, "fp32_floor_ms": floor_ms, "median_ms": ms,
            "openvino_fc_gb_s": ov_fc, "openvino_conv_gflops": ov_conv,
            "max_fp32_speedup_over_opencv": ms["opencv"] / floor_ms,
            "openvino_over_opencv": ms["opencv"] / ms["openvino"],
            "opencv_winograd_gain": ms["opencv_no_winograd"] / ms["opencv"], "rounds": rounds}


def roofline() -> dict[str, Any]:
    import os

    from bench.env import physical_cores

    threads = physical_cores()
    tmp = Path(tempfile.mkdtemp(prefix="zoo-roofline-"))
    try:
        rows = [model_floor(m, tmp, threads) for m in MODELS]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        ms = r["median_ms"]
        print(f"{r['model']}: fp32 floor {r['fp32_floor_ms']:.1f} ms ({r['conv_gflop']:.2f} GFLOP conv at "
              f"{r['floor_gflops']:.0f} GFLOP/s + {r['fc_mbytes']:.0f} MB fc at {r['floor_gb_s']:.1f} GB/s); "
              f"OpenVINO {ms['openvino']:.1f} ms (fc {r['openvino_fc_gb_s']:.1f} GB/s, conv "
              f"{r['openvino_conv_gflops']:.0f} GFLOP/s); OpenCV {ms['opencv']:.1f} ms ({ms['opencv_no_winograd']:.1f} "
              f"without Winograd); at most {r['max_fp32_speedup_over_opencv']:.2f}x OpenCV in fp32, OpenVINO "
              f"{r['openvino_over_opencv']:.2f}x", flush=True)
    result = {"rows": rows, "load_average": os.getloadavg()}
    _save("roofline", result)
    return result
