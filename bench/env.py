"""The environment of a run, recorded in every results file."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
from typing import Any

import psutil

ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
            "CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "TORCH_CUDNN_V8_API_ENABLED",
            "ORT_TENSORRT_FP16_ENABLE", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")
LIBRARIES = ("torch", "onnxruntime", "onnxruntime-gpu", "onnx", "numpy", "opencv-python-headless",
             "protobuf", "zoo")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for lib in LIBRARIES:
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def gpu_info(index: int) -> dict[str, Any]:
    """GPU name, CUDA/cuDNN versions, and (through NVML, when installed) driver, clocks, power."""
    import torch

    info: dict[str, Any] = {"index": index, "name": torch.cuda.get_device_name(index),
                            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                            "memory_bytes": torch.cuda.get_device_properties(index).total_memory,
                            "capability": ".".join(map(str, torch.cuda.get_device_capability(index)))}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        info["clocks_mhz"] = {"sm": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                              "mem": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                              "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)}
        info["power_limit_w"] = pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000
        info["temperature_c"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    except Exception as e:  # NVML is optional: say why it is missing
        info["nvml"] = f"unavailable ({type(e).__name__})"
    return info


def capture(threads: int, gpu: int | None = None) -> dict[str, Any]:
    mem = psutil.virtual_memory()
    env: dict[str, Any] = {
        "hostname": socket.gethostname(), "os": platform.platform(), "cpu": cpu_model(),
        "cores_physical": physical_cores(), "cores_logical": psutil.cpu_count(),
        "threads": threads, "memory_bytes": mem.total, "libraries": versions(),
        "env_vars": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "tf32": False,
    }
    try:
        freq = psutil.cpu_freq()
        if freq:
            env["cpu_mhz"] = {"current": freq.current, "max": freq.max}
    except Exception:  # not readable in some containers
        pass
    if gpu is not None:
        env["gpu"] = gpu_info(gpu)
    return env


def machine_name(env: dict[str, Any]) -> str:
    """A directory name for the results of this machine, e.g. 'h200' or 'cpu-xeon-8375c-2c'."""
    if "gpu" in env:
        name = env["gpu"]["name"].lower().replace("nvidia", "")
        return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|@.*|intel|amd|processor", "", env["cpu"].lower())
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu).strip("-")[:40]
    return f"cpu-{cpu}-{env['cores_physical']}c"
