"""The environment of a run, recorded in every results file."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import time
from pathlib import Path
from typing import Any

import psutil

from convert.isolate import PARENT_ENV

ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
            "KMP_BLOCKTIME", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG",
            "TORCH_CUDNN_V8_API_ENABLED", "ORT_TENSORRT_FP16_ENABLE", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")
LIBRARIES = ("torch", "onnxruntime", "onnxruntime-gpu", "onnx", "numpy", "opencv-python-headless",
             "openvino", "protobuf", "zoo")
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
             "amx_int8", "amx_fp16")
# When a machine counts as not quiet (DESIGN.md, Benchmarking): the load average beyond our own
# threads above this fraction of the cores, the hypervisor stealing more than this share of the
# CPU time, or another process using more than this share of one core.
LOAD_PER_CORE, STEAL_PCT, OTHER_PCT = 0.5, 5.0, 20.0


def _cpuinfo(field: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def native_bf16() -> bool:
    """The CPU computes bf16 in hardware (AMX or AVX512-BF16): a bf16 case is worth timing."""
    return bool({"amx_bf16", "avx512_bf16"} & set((_cpuinfo("flags") or "").split()))


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _guarded(what: str, fn: Any) -> Any:
    """An optional part of the environment: its value, or why it is missing (never an exception)."""
    try:
        return fn()
    except Exception as e:  # an optional library, or a query its build lacks
        return f"unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else what})"


def cpu_details() -> dict[str, Any]:
    """ISA level and the math libraries the runtimes use, as far as each can be asked."""
    import torch

    flags = set((_cpuinfo("flags") or "").split())
    config = torch.__config__.show() + torch.__config__.parallel_info()
    out: dict[str, Any] = {
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
        "torch_cpu_capability": _guarded("capability", torch.backends.cpu.get_cpu_capability),
        "onednn": _match(r"(?:MKL-DNN|oneDNN)[^v]*v([\w.]+)", config),
        "mkl": _match(r"Math Kernel Library Version ([\w.]+)", config),
        "torch_parallel": _match(r"ATen parallel backend: (\w+)", config),
        "numpy_blas": _guarded("numpy config", _numpy_blas),
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "not readable",
        # the workers ask for huge pages (bench/worker.py HUGE_PAGES); "never" here means they got none
        "transparent_hugepage": _match(r"\[(\w+)\]", _read("/sys/kernel/mm/transparent_hugepage/enabled") or "")
        or "not readable",
    }
    return out


def _match(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None


def _numpy_blas() -> str:
    import numpy as np

    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return f"{blas.get('name')} {blas.get('version')}"


def runtime_details() -> dict[str, Any]:
    """Versions and devices of the runtimes zoo can time (each optional)."""
    def ort() -> dict[str, Any]:
        import onnxruntime

        return {"version": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}

    def openvino() -> dict[str, Any]:
        import openvino as ov

        return {"version": ov.get_version(), "devices": ov.Core().available_devices}

    def opencv() -> dict[str, Any]:
        import cv2

        build = cv2.getBuildInformation()
        return {"version": cv2.__version__, "parallel": _match(r"Parallel framework:\s*(.+)", build),
                "threads": cv2.getNumThreads()}

    return {"onnxruntime": _guarded("onnxruntime", ort), "openvino": _guarded("openvino", openvino),
            "opencv": _guarded("opencv", opencv)}


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


def _proc_stat() -> tuple[int, int]:
    """(total, steal) CPU time in clock ticks since boot, summed over CPUs (0, 0 where unreadable)."""
    line = (_read("/proc/stat") or "cpu").splitlines()[0].split()
    ticks = [int(x) for x in line[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks), ticks[7]) if len(ticks) == 8 else (0, 0)


def _ours() -> set[int]:
    """This process and its children; in a worker also the sweep that started it (named by
    convert.isolate's PARENT_ENV) and the sweep's other workers (interleaved runtimes)."""
    pids: set[int] = set()
    sweep = os.environ.get(PARENT_ENV, "")
    for pid in {os.getpid()} | ({int(sweep)} if sweep.isdigit() else set()):
        try:
            pids |= {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    return pids


def busy_processes(window_s: float = 0.25, top: int = 3) -> list[dict[str, Any]]:
    """The ``top`` other processes by CPU% (100 = one core) over ``window_s`` seconds."""
    ours, procs = _ours(), []
    for p in psutil.process_iter(["pid", "name"]):
        if p.pid not in ours:
            try:
                p.cpu_percent(None)  # the first call starts the window
                procs.append(p)
            except psutil.Error:
                pass
    time.sleep(window_s)
    rows = []
    for p in procs:
        try:
            rows.append({"pid": p.pid, "name": p.info["name"], "cpu_pct": round(p.cpu_percent(None), 1)})
        except psutil.Error:
            pass
    return sorted(rows, key=lambda r: -r["cpu_pct"])[:top]


def load_snapshot(window_s: float = 0.25) -> dict[str, Any]:
    """The machine's load now: load averages, the busiest other processes, and the /proc/stat
    counters from which ``load_record`` computes the steal time between two snapshots."""
    total, steal = _proc_stat()
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "busy": busy_processes(window_s),
            "ticks": [total, steal], "time": round(time.time(), 3)}


def load_record(start: dict[str, Any], end: dict[str, Any], own_threads: int) -> dict[str, Any]:
    """The ``load`` of a results row: both snapshots, the steal time between them, and whether the
    machine was quiet (with the reasons when it was not)."""
    dt, ds = end["ticks"][0] - start["ticks"][0], end["ticks"][1] - start["ticks"][1]
    steal = round(100.0 * ds / dt, 2) if dt > 0 else None
    cores = psutil.cpu_count() or 1
    la = max(start["loadavg"][0], end["loadavg"][0])
    reasons = []
    if la - own_threads > LOAD_PER_CORE * cores:
        reasons.append(f"load average {la:g} on {cores} cores (ours: {own_threads} threads)")
    busy = {b["pid"]: b for snap in (end, start) for b in snap["busy"] if b["cpu_pct"] > OTHER_PCT}
    if busy:
        top = max(busy.values(), key=lambda b: b["cpu_pct"])
        more = f" and {len(busy) - 1} more above {OTHER_PCT:g}%" if len(busy) > 1 else ""
        reasons.append(f"{top['name']} (pid {top['pid']}) at {top['cpu_pct']:g}% CPU{more}")
    if steal is not None and steal > STEAL_PCT:
        reasons.append(f"CPU steal {steal:g}%")
    strip = ("ticks",)
    return {"start": {k: v for k, v in start.items() if k not in strip},
            "end": {k: v for k, v in end.items() if k not in strip},
            "steal_pct": steal, "quiet": not reasons, "reasons": reasons}


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
    """The environment of a run: machine, CPU (ISA level, math libraries, governor), runtimes, the
    thread settings, the GPU when one is used, and the load at the start."""
    mem = psutil.virtual_memory()
    env: dict[str, Any] = {
        "hostname": socket.gethostname(), "os": platform.platform(), "cpu": cpu_model(),
        "cores_physical": physical_cores(), "cores_logical": psutil.cpu_count(),
        "threads": threads, "memory_bytes": mem.total, "libraries": versions(),
        "env_vars": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "tf32": False, "cpu_details": cpu_details(), "runtimes": runtime_details(),
        "load_at_start": {k: v for k, v in load_snapshot().items() if k != "ticks"},
    }
    try:
        freq = psutil.cpu_freq()
        if freq:
            env["cpu_mhz"] = {"current": freq.current, "max": freq.max}
    except Exception:  # not readable in some containers
        pass
    if gpu is not None:
        env["gpu"] = gpu_info(gpu)  # asked for: a failure here is a real error
    else:  # a CPU run on a GPU machine still says which GPUs were there (never fails without one)
        present = _guarded("cuda", _gpus_present)
        if present:
            env["gpus_present"] = present
    return env


def _gpus_present() -> list[dict[str, Any]]:
    import torch

    return [gpu_info(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def gpu_folder(name: str) -> str:
    """A directory name for a GPU type: 'NVIDIA H200' -> 'h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "gpu"


def machine_name(env: dict[str, Any]) -> str:
    """A directory name for the results of this machine, e.g. 'h200' or 'cpu-xeon-8375c-2c'."""
    if "gpu" in env:
        return gpu_folder(env["gpu"]["name"])
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|@.*|intel|amd|processor", "", env["cpu"].lower())
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu).strip("-")[:40]
    return f"cpu-{cpu}-{env['cores_physical']}c"
